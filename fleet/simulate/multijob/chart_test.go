package multijob

import (
	"bytes"
	"encoding/csv"
	"encoding/xml"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestChart: the per-job GPU timeline agrees with the run (never more
// than the pool at once, its GPU-time within the GPU-hours held, which
// count the last interval whole) and the SVG is well-formed with a band
// per job.
func TestChart(t *testing.T) {
	cfg := smallConfig(t)
	res, err := Run(cfg, "fleetd-adaptive")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteGPUsCSV(&buf, []Result{res}); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	type span struct {
		from, to float64
		gpus     int
	}
	var spans []span
	gpuSec := 0.0
	for _, r := range rows[1:] {
		from, _ := strconv.ParseFloat(r[3], 64)
		to, _ := strconv.ParseFloat(r[4], 64)
		g, _ := strconv.Atoi(r[5])
		if !(to > from) || g < 1 {
			t.Fatalf("row %v", r)
		}
		spans = append(spans, span{from, to, g})
		gpuSec += (to - from) * float64(g)
	}
	for _, s := range spans {
		held := 0
		for _, o := range spans {
			if o.from <= s.from && s.from < o.to {
				held += o.gpus
			}
		}
		if held > cfg.Nodes*cfg.PerNode {
			t.Fatalf("%d GPUs held at %.0f s, pool %d", held, s.from, cfg.Nodes*cfg.PerNode)
		}
	}
	slack := float64(len(res.Jobs)*cfg.Nodes*cfg.PerNode) * time.Minute.Seconds()
	if h := res.GPUHours * 3600; gpuSec > h+1 || gpuSec < h-slack {
		t.Fatalf("timeline %.0f GPU-s, run %.0f GPU-s held", gpuSec, h)
	}
	buf.Reset()
	if err := WriteChart(&buf, res); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(buf.Bytes()))
	names := map[string]bool{}
	inTitle := false
	for {
		tok, err := dec.Token()
		if err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("SVG: %v", err)
			}
			break
		}
		switch v := tok.(type) {
		case xml.StartElement:
			inTitle = v.Name.Local == "title"
		case xml.CharData:
			if inTitle {
				names[strings.TrimSpace(string(v))] = true
			}
		case xml.EndElement:
			inTitle = false
		}
	}
	for _, j := range res.Jobs {
		if !names[j.Name] {
			t.Errorf("no band for job %s in the chart", j.Name)
		}
	}
}
