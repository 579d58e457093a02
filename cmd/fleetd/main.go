// Command fleetd is the fleetd control daemon, its CLI, the on-VM elastic
// agent and the built-in provider plugins, in one binary.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// Exit codes shared by every subcommand.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// command is one subcommand. Each lives in its own file and registers
// itself from init so files can be added without touching this one.
type command struct {
	name     string
	synopsis string
	hidden   bool
	run      func(args []string, stdout, stderr io.Writer) int
}

var commands = map[string]command{}

func register(c command) {
	if _, dup := commands[c.name]; dup {
		panic("duplicate command " + c.name)
	}
	commands[c.name] = c
}

// usageError marks an error as a usage/spec error (exit 2).
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// exitCode maps an error returned by a command body to an exit code.
func exitCode(stderr io.Writer, err error) int {
	if err == nil {
		return exitOK
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintln(stderr, "Error:", ue.err)
		return exitUsage
	}
	if errors.Is(err, flag.ErrHelp) {
		return exitUsage
	}
	fmt.Fprintln(stderr, "Error:", err)
	if h := errorHint(err); h != "" {
		fmt.Fprintln(stderr, "Hint:", h)
	}
	return exitError
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: fleetd <command> [flags] [args]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, n := range visibleCommands() {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].synopsis)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'fleetd help <command>' (or 'fleetd <command> -h') for a command's usage, flags and examples.")
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || isHelpFlag(args[0]) || (args[0] == "help" && len(args) == 1) {
		usage(stdout)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	// `fleetd help CMD [SUB]` is `fleetd CMD [SUB] -h`.
	if args[0] == "help" {
		args = append(args[1:], "-h")
	}
	name := strings.TrimPrefix(args[0], "--")
	if name == "-version" || name == "-v" {
		name = "version"
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "fleetd: unknown command %q", args[0])
		if s := suggest(name); s != "" {
			fmt.Fprintf(stderr, "; did you mean %s?\n", s)
			return exitUsage
		}
		fmt.Fprint(stderr, "\n\n")
		usage(stderr)
		return exitUsage
	}
	// Help is a success, printed on stdout, whatever the command would do
	// with the flag itself.
	if helpRequested(args[1:]) {
		writeHelp(stdout, helpTopic(name, args[1:]))
		return exitOK
	}
	return c.run(args[1:], stdout, stderr)
}
