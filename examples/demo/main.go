// Command demo is `make demo`: a real fleet on the embedded local provider,
// real training workers (examples/trainer/train.py), an injected spot
// interruption, recovery at a smaller world size, a replacement, and a
// summary. It drives the fleetd binary the way a user would: `fleetd serve
// -dev`, `fleetd apply`, `fleetd debug interrupt`, and the HTTP API.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/internal/freeport"
)

func main() {
	bin := flag.String("bin", "bin/fleetd", "fleetd binary")
	specPath := flag.String("spec", "configs/examples/local.hcl", "fleet spec")
	steps := flag.Int("steps", 400, "training steps")
	interruptAt := flag.Int("interrupt-at", 60, "inject the spot notice once training passed this step")
	timeout := flag.Duration("timeout", 6*time.Minute, "give up after this long")
	flag.Parse()
	if err := run(*bin, *specPath, *steps, *interruptAt, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "\ndemo FAILED:", err)
		os.Exit(1)
	}
}

func say(format string, args ...any) {
	fmt.Printf("[%s] %s\n", time.Now().Format("15:04:05.0"), fmt.Sprintf(format, args...))
}

type stepLine struct {
	Event     string `json:"event"`
	Step      int64  `json:"step"`
	WorldSize int    `json:"world_size"`
	Rank      int    `json:"rank"`
}

// roundSteps is what one rendezvous round's workers did: the steps they
// ran and the step they resumed from.
type roundSteps struct {
	first, last int64 // the lowest and highest step printed
	resumed     int64 // from the resume events; -1: none seen
	worldSize   int
	// confirmed is the step the workers confirmed they checkpointed when
	// the round ended (checkpoint on notice, or any SIGTERM), by which ranks
	// (the log tail is read again at every poll: a set, not a count).
	confirmed   int64
	confirmedBy map[int]bool
}

// progress follows the workers' steps round by round.
type progress map[int64]*roundSteps

func (p progress) add(round int64, s stepLine) {
	r := p[round]
	if r == nil {
		r = &roundSteps{resumed: -1, confirmedBy: map[int]bool{}}
		p[round] = r
	}
	switch s.Event {
	case "step":
		if r.first == 0 || s.Step < r.first {
			r.first = s.Step
		}
		r.last = max(r.last, s.Step)
		r.worldSize = s.WorldSize
	case "resume":
		if r.resumed < 0 || s.Step < r.resumed {
			r.resumed = s.Step
		}
	case "checkpointed":
		r.confirmed = max(r.confirmed, s.Step)
		r.confirmedBy[s.Rank] = true
	}
}

// change is one round change as the workers saw it.
type change struct {
	round, from      int64 // the new round, the last one that trained before it
	reached, resumed int64 // the highest step before it; where it resumed
	lost             int64 // steps it ran again
}

// changes lists the round changes after which training went on, with the
// steps each had to recompute: those the new round ran that an earlier
// round had already run. Summed, that is "max step reached before the
// change minus the step resumed from" over the changes, without counting
// twice a round that ran no step.
func (p progress) changes() (out []change, lost int64) {
	var rounds []int64
	for r, rs := range p {
		if rs.last > 0 {
			rounds = append(rounds, r)
		}
	}
	sort.Slice(rounds, func(i, j int) bool { return rounds[i] < rounds[j] })
	var high int64 // the highest step run so far
	for i, r := range rounds {
		rs := p[r]
		resumed := rs.first - 1
		if rs.resumed >= 0 {
			resumed = rs.resumed
		}
		if i > 0 {
			c := change{round: r, from: rounds[i-1], reached: high, resumed: resumed, lost: max(0, min(rs.last, high)-resumed)}
			out = append(out, c)
			lost += c.lost
		}
		high = max(high, rs.last)
	}
	return out, lost
}

func run(bin, specPath string, steps, interruptAt int, timeout time.Duration) error {
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("%s not found: run `make build` first (make demo does)", bin)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	work, err := os.MkdirTemp("", "fleetd-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	ckpt := filepath.Join(work, "checkpoints")
	addr, err := freeport.Addr()
	if err != nil {
		return err
	}

	say("starting a dev daemon (local provider) on %s", addr)
	daemon := exec.Command(bin, "serve", "-dev", "-listen", addr, "-data-dir", filepath.Join(work, "data"))
	out, err := daemon.StdoutPipe()
	if err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(os.TempDir(), "fleetd-demo-daemon.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	daemon.Stderr = logf
	if err := daemon.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- daemon.Wait() }()
	defer func() {
		// Graceful stop: a dev daemon terminates its nodes on the way out.
		_ = daemon.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = daemon.Process.Kill()
		}
	}()
	sc := bufio.NewScanner(out)
	base, token := api.ScanDevExports(sc)
	if token == "" {
		return fmt.Errorf("daemon did not start; see %s", logf.Name())
	}
	go func() {
		for sc.Scan() {
		}
	}()
	c, err := api.NewClient(base, api.ClientOptions{Token: token})
	if err != nil {
		return err
	}
	for i := 0; ; i++ {
		if _, err := c.Status(ctx); err == nil {
			break
		}
		if i > 100 {
			return errors.New("daemon not answering")
		}
		time.Sleep(50 * time.Millisecond)
	}
	env := append(os.Environ(), "FLEETD_ADDR="+base, "FLEETD_TOKEN="+token)

	say("fleetd apply %s (checkpoints in %s, %d steps)", specPath, ckpt, steps)
	apply := exec.CommandContext(ctx, bin, "apply", "-auto-approve", "-var", "checkpoint_dir="+ckpt, "-var", fmt.Sprintf("steps=%d", steps), specPath)
	apply.Env, apply.Stdout, apply.Stderr = env, os.Stdout, os.Stderr
	if err := apply.Run(); err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	const fleet = "demo"
	start := time.Now()

	var (
		lastLine     string
		maxStep      int64
		worldSizes   = map[int]bool{}
		rounds       = progress{}
		interrupted  string
		interruptT   time.Time
		sawTwo       bool
		backToThree  bool
		stepAtNotice int64
		twoAfter     time.Duration
		threeAt      time.Time
	)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out (%s); daemon log: %s", ctx.Err(), logf.Name())
		case err := <-exited:
			return fmt.Errorf("daemon exited: %v; log: %s", err, logf.Name())
		case <-tick.C:
		}
		det, err := c.Fleet(ctx, fleet)
		if err != nil {
			continue
		}
		var lines []api.LogLine
		_ = c.Do(ctx, http.MethodGet, "/v1/fleets/"+fleet+"/logs", url.Values{"tail": {"400"}}, nil, &lines)
		curWS := 0
		for _, l := range lines {
			var s stepLine
			if json.Unmarshal([]byte(l.Line), &s) != nil {
				continue
			}
			if s.Event == "step" || s.Event == "resume" || s.Event == "checkpointed" {
				rounds.add(l.Round, s)
			}
			if s.Event != "step" {
				continue
			}
			if s.Step > maxStep {
				maxStep = s.Step
			}
			curWS = s.WorldSize
			worldSizes[s.WorldSize] = true
		}
		rd := det.Rendezvous
		round, ws := 0, 0
		if rd != nil {
			round, ws = rd.Round, rd.WorldSize
		}
		line := fmt.Sprintf("nodes %s | round %d world size %d | step %d (workers at world size %d) | $%.3f/h", states(det.NodesByState), round, ws, maxStep, curWS, det.CostPerHour)
		if line != lastLine {
			say("%s", line)
			lastLine = line
		}
		switch {
		case interrupted == "" && maxStep >= int64(interruptAt) && curWS == 3:
			victim := pickVictim(det)
			if victim == "" {
				continue
			}
			say(">>> injecting a spot interruption notice on %s (fleetd debug interrupt %s %s)", victim, fleet, victim)
			cmd := exec.CommandContext(ctx, bin, "debug", "interrupt", "-lead", "30s", fleet, victim)
			cmd.Env, cmd.Stdout, cmd.Stderr = env, os.Stdout, os.Stderr
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("debug interrupt: %w", err)
			}
			interrupted, interruptT, stepAtNotice = victim, time.Now(), maxStep
		case interrupted != "" && !sawTwo && curWS == 2 && maxStep > stepAtNotice:
			sawTwo, twoAfter = true, time.Since(interruptT)
			say(">>> survivors continue at world size 2 from step %d (%.1fs after the notice)", maxStep, twoAfter.Seconds())
		case sawTwo && !backToThree && curWS == 3:
			backToThree, threeAt = true, time.Now()
			say(">>> replacement joined: training back at world size 3 (step %d)", maxStep)
		}
		if det.Completed {
			say("job finished (succeeded=%v) after %s", det.Succeeded, time.Since(start).Round(time.Second))
			return summary(det, maxStep, steps, worldSizes, rounds, interrupted != "", sawTwo, backToThree, twoAfter, threeAt.Sub(interruptT))
		}
	}
}

func states(m map[string]int) string {
	var ks []string
	for k, v := range m {
		if v > 0 {
			ks = append(ks, fmt.Sprintf("%s=%d", k, v))
		}
	}
	sort.Strings(ks)
	return strings.Join(ks, " ")
}

// pickVictim prefers a running node that is not the rendezvous master, so
// the demo shows a non-master loss (the master case works the same way).
func pickVictim(det api.FleetDetail) string {
	var ids []string
	for _, n := range det.Nodes {
		if n.State == "running" {
			ids = append(ids, n.ID)
		}
	}
	sort.Strings(ids)
	if len(ids) == 0 {
		return ""
	}
	return ids[len(ids)-1]
}

func summary(det api.FleetDetail, maxStep int64, steps int, ws map[int]bool, rounds progress, interrupted, sawTwo, backToThree bool, twoAfter, threeAfter time.Duration) error {
	fmt.Println()
	fmt.Println("================ fleetd demo summary ================")
	fmt.Printf("training steps completed     %d of %d\n", maxStep, steps)
	if det.Rendezvous != nil {
		fmt.Printf("rendezvous rounds            %d\n", det.Rendezvous.Round)
	}
	var sizes []int
	for k := range ws {
		sizes = append(sizes, k)
	}
	sort.Ints(sizes)
	fmt.Printf("world sizes trained at       %v\n", sizes)
	for _, r := range det.Recoveries {
		switch r.Kind {
		case "round-reformed":
			fmt.Printf("notice → survivors' round    %.2f s (daemon: new rendezvous round without the node)\n", r.DurationSeconds)
		case "training-resumed":
			lost := ""
			if r.LostSteps != nil {
				lost = fmt.Sprintf(", %d steps behind the last report", *r.LostSteps)
			}
			fmt.Printf("notice → training again      %.2f s (daemon: the workers' first progress report of the new round%s)\n", r.DurationSeconds, lost)
		case "replacement-joined":
			fmt.Printf("replacement → joined         %.2f s (%s: launch requested → agent registered)\n", r.DurationSeconds, r.Node)
		}
	}
	if sawTwo {
		fmt.Printf("notice → survivors training  %.2f s (first step at world size 2 seen by this demo; includes ~1 s log shipping)\n", twoAfter.Seconds())
	}
	if backToThree {
		fmt.Printf("notice → back at 3 nodes     %.2f s (first step at world size 3 after the replacement joined)\n", threeAfter.Seconds())
	}
	chs, lost := rounds.changes()
	fmt.Printf("lost steps                   %d (steps run again after a round change; the trainer checkpoints every 50 steps on its own)\n", lost)
	for _, c := range chs {
		how := "no checkpoint confirmed by the stopped workers"
		if old := rounds[c.from]; len(old.confirmedBy) > 0 {
			how = fmt.Sprintf("%d workers of round %d confirmed a checkpoint at step %d", len(old.confirmedBy), c.from, old.confirmed)
		}
		fmt.Printf("  round %d at world size %d resumed from step %d; step %d had been reached: %d lost (%s)\n",
			c.round, rounds[c.round].worldSize, c.resumed, c.reached, c.lost, how)
	}
	fmt.Printf("cost                         $%.4f spent (spot)\n", det.SpendUSD)
	fmt.Println("=====================================================")
	switch {
	case !det.Succeeded:
		return errors.New("the training job did not succeed")
	case maxStep < int64(steps):
		return fmt.Errorf("final step %d < %d", maxStep, steps)
	case !interrupted || !sawTwo:
		return errors.New("the interruption was not survived at world size 2")
	case !backToThree:
		return errors.New("the replacement never brought training back to world size 3")
	}
	return nil
}
