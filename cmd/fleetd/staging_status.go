package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
)

// printStaging renders the nodes' data staging (training.data mode
// "stage"): what each has copied, from where, how fast, and the ETA.
func printStaging(w io.Writer, nodes []api.NodeInfo) {
	some := false
	for _, n := range nodes {
		some = some || len(n.Staging) > 0
	}
	if !some {
		return
	}
	fmt.Fprintln(w, "\nData staging (copied to the node's disk before it joins):")
	tw := tabwriter.NewWriter(w, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "  NODE\tPATH\tSOURCE\tFROM\tCOPIED\tRATE\tETA")
	for _, n := range nodes {
		for _, s := range n.Staging {
			copied := fmt.Sprintf("%s of %s", gb(s.Bytes), gb(s.Total))
			if s.Total > 0 {
				copied += fmt.Sprintf(" (%.0f%%)", 100*float64(s.Bytes)/float64(s.Total))
			}
			eta := "-"
			switch {
			case s.Error != "":
				eta = "failed: " + s.Error
			case s.Done:
				eta = "done"
			case s.ETASeconds > 0:
				eta = age(time.Duration(s.ETASeconds * float64(time.Second)).Round(time.Second))
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%.1f MB/s\t%s\n", n.ID, s.MountPath, s.Source, dash(s.From), copied, s.RateBps/1e6, eta)
		}
	}
	tw.Flush()
}

// gb renders a byte count in GB with enough digits for small copies.
func gb(b int64) string {
	v := float64(b) / 1e9
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f GB", v)
	case v >= 1:
		return fmt.Sprintf("%.1f GB", v)
	}
	return fmt.Sprintf("%.3f GB", v)
}
