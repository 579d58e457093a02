package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
)

// printCheckpoint renders a fleet's checkpoint store for `fleetd status
// FLEET`: the newest checkpoint in the store, transfers in progress, the
// last measured throughputs and a failing store.
func printCheckpoint(w io.Writer, c *api.CheckpointStatus, now time.Time) {
	if c == nil {
		return
	}
	where := c.Dir
	if c.Store != "" {
		where += " → " + c.Store
		if c.Access != "" {
			where += " (" + c.Access + ")"
		}
	}
	line := "none in the store yet"
	if c.Store == "" {
		line = "kept on the nodes only"
	}
	if c.LastStep >= 0 {
		line = fmt.Sprintf("step %d, %s", c.LastStep, mibText(c.Bytes))
		if !c.LastAt.IsZero() {
			line += ", " + age(now.Sub(c.LastAt)) + " old"
		}
	}
	var rates []string
	if c.UploadMiBps > 0 {
		rates = append(rates, fmt.Sprintf("upload %.1f MiB/s", c.UploadMiBps))
	}
	if c.RestoreMiBps > 0 {
		rates = append(rates, fmt.Sprintf("restore %.1f MiB/s", c.RestoreMiBps))
	}
	if len(rates) > 0 {
		line += "; " + strings.Join(rates, ", ")
	}
	fmt.Fprintf(w, "Checkpoints:\t%s, keep %d: %s\n", where, c.Keep, line)
	for _, t := range []struct {
		what string
		tr   *api.CheckpointTransfer
	}{{"uploading", c.Uploading}, {"restoring", c.Restoring}} {
		if t.tr == nil {
			continue
		}
		pct := 0.0
		if t.tr.TotalBytes > 0 {
			pct = 100 * float64(t.tr.DoneBytes) / float64(t.tr.TotalBytes)
		}
		fmt.Fprintf(w, "\t%s step %d on %s: %s of %s (%.0f%%)\n", t.what, t.tr.Step, t.tr.Node, mibText(t.tr.DoneBytes), mibText(t.tr.TotalBytes), pct)
	}
	if r := c.LastRestore; r != nil {
		fmt.Fprintf(w, "\tlast restore: step %d on %s, %s ago\n", r.Step, r.Node, age(now.Sub(r.At)))
	}
	if c.Error != "" {
		fmt.Fprintf(w, "\tfailing (%s on %s, %s ago): %s\n", c.ErrorKind, dash(c.ErrorNode), age(now.Sub(c.ErrorAt)), c.Error)
	}
}

func mibText(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
}
