package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
	"github.com/fleetd/fleetd/fleet/state"
)

// errNoConfirmation: destroy was not confirmed and could not ask.
var errNoConfirmation = errors.New("destroy needs confirmation, and stdin is not a terminal: pass -auto-approve to destroy without asking")

func runDestroy(args []string, stdout, stderr io.Writer) int {
	return destroy(args, os.Stdin, stdout, stderr)
}

// destroy is the destroy command with its confirmation read from in.
func destroy(args []string, in io.Reader, stdout, stderr io.Writer) int {
	fs, cf := newClientFlagSet("destroy", stderr)
	auto := fs.Bool("auto-approve", false, "do not ask for confirmation")
	wait := fs.Bool("wait", false, "return when the fleet and its nodes are gone")
	timeout := fs.Duration("timeout", 15*time.Minute, "with -wait: give up after this long")
	rest, err := parseInterleaved(fs, args)
	if err != nil || len(rest) != 1 {
		fmt.Fprintln(stderr, "Usage: fleetd destroy [-auto-approve] [-wait] [-timeout D] [-json] FLEET")
		return exitUsage
	}
	name := rest[0]
	c, ctx, stop, err := cf.interruptible()
	if err != nil {
		return exitCode(stderr, err)
	}
	defer stop()
	if !*auto {
		// Look the fleet up first: an unknown name fails here, before any
		// question, and the question can say what goes.
		d, err := c.Fleet(ctx, name)
		if err != nil {
			return exitCode(stderr, unknownFleet(err, name))
		}
		if err := confirmDestroy(d, in, stderr); err != nil {
			return exitCode(stderr, err)
		}
	}
	f, err := c.Destroy(ctx, name)
	if err != nil {
		return exitCode(stderr, unknownFleet(err, name))
	}
	if !*wait {
		if cf.json {
			printJSON(stdout, f)
		} else {
			fmt.Fprintf(stdout, "Fleet %q is being destroyed; its nodes are terminated and the fleet is removed when none is left.\n", f.Name)
		}
		return exitOK
	}
	if !cf.json {
		fmt.Fprintf(stdout, "Destroying fleet %q; waiting for its nodes to be gone.\n", f.Name)
	}
	if err := waitGone(ctx, c, name, *timeout, cf.json, stdout); err != nil {
		return exitCode(stderr, err)
	}
	return exitOK
}

// confirmDestroy asks on stderr (stdout may be a pipe to a file) and reads
// one line: the fleet's name or "yes" confirms.
func confirmDestroy(d api.FleetDetail, in io.Reader, stderr io.Writer) error {
	live := 0
	for _, n := range d.Nodes {
		if n.State != state.NodeTerminated {
			live++
		}
	}
	fmt.Fprintf(stderr, "Destroy fleet %q? Its %d node(s) will be terminated and the fleet forgotten.\n", d.Name, live)
	fmt.Fprintf(stderr, "Type the fleet name (or yes) to confirm: ")
	line, err := bufio.NewReader(in).ReadString('\n')
	answer := strings.TrimSpace(line)
	if answer == "" && err != nil {
		fmt.Fprintln(stderr)
		if !isTerminal(in) {
			return errNoConfirmation
		}
		return errors.New("destroy cancelled")
	}
	if answer != d.Name && answer != "yes" {
		return fmt.Errorf("destroy cancelled: %q is neither %q nor yes", answer, d.Name)
	}
	return nil
}

// isTerminal says whether r is a terminal. /dev/null is a character
// device too, so the file mode is not enough: ask the terminal driver.
func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	return ok && ttyFile(f)
}

// waitGone polls the fleet until the daemon no longer knows it (all nodes
// terminated, fleet removed), printing node counts as they change.
func waitGone(ctx context.Context, c *api.Client, name string, timeout time.Duration, asJSON bool, w io.Writer) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last := ""
	for {
		d, err := c.Fleet(ctx, name)
		switch {
		case api.IsNotFound(err):
			el := time.Since(start).Truncate(time.Second)
			if asJSON {
				printJSONLine(w, map[string]any{"fleet": name, "destroyed": true, "elapsed_seconds": el.Seconds()})
			} else {
				fmt.Fprintf(w, "Fleet %q destroyed in %s.\n", name, el)
			}
			return nil
		case err != nil && ctx.Err() == nil:
			return err
		case err == nil:
			line := fmt.Sprintf("%d node(s) left%s", liveNodes(d.NodesByState), stateCounts(d.NodesByState))
			if line != last {
				if asJSON {
					printJSONLine(w, map[string]any{"fleet": name, "nodes_by_state": d.NodesByState, "elapsed_seconds": time.Since(start).Truncate(time.Second).Seconds()})
				} else {
					fmt.Fprintf(w, "[%6s] %s\n", time.Since(start).Truncate(time.Second), line)
				}
				last = line
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("fleet %q was not gone within %s (last: %s)", name, timeout, last)
		case <-tick.C:
		}
	}
}

func liveNodes(byState map[string]int) int {
	n := 0
	for s, v := range byState {
		if s != "terminated" {
			n += v
		}
	}
	return n
}

// fleetExists returns the daemon's "not found" error, as a plain error
// naming the fleet, when name is not a fleet it knows.
func fleetExists(c *api.Client, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.Fleet(ctx, name)
	return unknownFleet(err, name)
}

// unknownFleet says a daemon 404 about a fleet in the CLI's words; other
// errors pass unchanged.
func unknownFleet(err error, name string) error {
	if api.IsNotFound(err) {
		return fmt.Errorf("unknown fleet %q (fleetd status lists the fleets)", name)
	}
	return err
}
