package multijob

import (
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
)

// Job is one line of a workload: a job arriving at Arrival, of an
// application, with the GPU count and global batch its user asked for
// (what a non-adaptive policy uses).
type Job struct {
	Name     string
	Arrival  time.Duration
	App      string
	Replicas int
	Batch    float64
}

// LoadWorkload reads a workload in Pollux's CSV format:
// name,time,application,num_replicas,batch_size (time in seconds from
// the start).
func LoadWorkload(path string) ([]Job, error) {
	var jobs []Job
	seen := map[string]bool{}
	err := readCSV(path, []string{"name", "time", "application", "num_replicas", "batch_size"}, func(f []string, v []float64) error {
		switch {
		case f[0] == "" || seen[f[0]]:
			return fmt.Errorf("name %q: want a unique name", f[0])
		case !(v[1] >= 0):
			return fmt.Errorf("time %s: want seconds >= 0", f[1])
		case v[3] < 1 || v[3] != math.Trunc(v[3]):
			return fmt.Errorf("num_replicas %s: want a whole number >= 1", f[3])
		case !(v[4] > 0):
			return fmt.Errorf("batch_size %s: want > 0", f[4])
		}
		seen[f[0]] = true
		jobs = append(jobs, Job{Name: f[0], Arrival: time.Duration(v[1] * float64(time.Second)), App: f[2], Replicas: int(v[3]), Batch: v[4]})
		return nil
	}, 2)
	if err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	if len(jobs) == 0 {
		return nil, fmt.Errorf("workload %s: no jobs", path)
	}
	return jobs, nil
}

// Published are Pollux's published average JCTs (seconds; 64 GPUs, job
// load 1.0) for workloads 1-4, from configs/pollux/README.md.
var Published = map[int]PublishedJCT{
	1: {2089, 2474, 4087},
	2: {3323, 5145, 6914},
	3: {2188, 3876, 3944},
	4: {2721, 3280, 5968},
}

// PublishedJCT is one workload's published average JCTs in seconds.
type PublishedJCT struct {
	Pollux   float64 `json:"pollux"`
	Tiresias float64 `json:"tiresias"`
	Optimus  float64 `json:"optimus_oracle"`
}

var workloadN = regexp.MustCompile(`^workload-(\d+)\.csv$`)

// WorkloadNumber is N of a file named workload-N.csv (0 otherwise).
func WorkloadNumber(path string) int {
	m := workloadN.FindStringSubmatch(filepath.Base(path))
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
