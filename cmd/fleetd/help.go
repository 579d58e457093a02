package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// helpText is what `fleetd help CMD` and `fleetd CMD -h` print besides the
// flags: the usage line(s) first, a few lines on what the command does, and
// examples, the way Terraform and Nomad lay out their help.
type helpText struct {
	usage    []string // without the leading "fleetd "
	about    string
	examples []string
	subs     []string // subcommands of a group command (token, state, debug, completion)
}

var helpTexts = map[string]helpText{
	"agent": {
		usage:    []string{"agent [-config FILE] [-root DIR]"},
		about:    "Runs the elastic agent on a node. cloud-init starts it; you do not normally run it by hand.",
		examples: []string{"fleetd agent -config /etc/fleetd/agent.json"},
	},
	"apply": {
		usage: []string{"apply [-auto-approve] [-wait] [-timeout D] [-skip-check] [-var NAME=VALUE] [-var-file FILE] [-json] FILE"},
		about: "Creates or updates the fleets of a spec file. Shows the plan and asks for 'yes' unless\n" +
			"-auto-approve. With -wait it follows progress until every fleet has its target number of\n" +
			"running nodes; with -json every progress line is one JSON object (needs -auto-approve).",
		examples: []string{
			"fleetd apply train.hcl",
			"fleetd apply -auto-approve -wait -var-file prod.tfvars train.hcl",
			"fleetd apply -auto-approve -wait -json train.hcl | jq .fleets",
		},
	},
	"check": {
		usage: []string{"check [-quick] [-var NAME=VALUE] [-var-file FILE] [-json] FILE"},
		about: "Preflight: the daemon proves credentials, permissions, images, networks and quotas for\n" +
			"every provider block of the spec, launching nothing. Exit 0 when nothing failed, 1 otherwise.",
		examples: []string{"fleetd check train.hcl", "fleetd check -quick -json train.hcl"},
	},
	"completion": {
		usage: []string{"completion bash|zsh"},
		about: "Prints a shell completion script: commands, flags, spec files and, when the daemon\n" +
			"answers within a second, fleet names.",
		examples: []string{
			"source <(fleetd completion bash)",
			"fleetd completion zsh > \"${fpath[1]}/_fleetd\"",
		},
		subs: []string{"bash", "zsh"},
	},
	"debug": {
		usage:    []string{"debug interrupt [-kind KIND] [-lead D] FLEET NODE"},
		about:    "Operator tools. interrupt injects an interruption notice on a node, as the cloud would.",
		examples: []string{"fleetd debug interrupt -kind spot-interruption -lead 2m bert bert-1-0"},
		subs:     []string{"interrupt"},
	},
	"debug interrupt": {
		usage:    []string{"debug interrupt [-kind KIND] [-lead D] [-json] FLEET NODE"},
		about:    "Injects an interruption notice on one node of a fleet, as the cloud would send it.",
		examples: []string{"fleetd debug interrupt bert bert-1-0", "fleetd debug interrupt -kind preempted -lead 30s bert bert-1-0"},
	},
	"destroy": {
		usage: []string{"destroy [-auto-approve] [-wait] [-timeout D] [-json] FLEET"},
		about: "Terminates a fleet's nodes and forgets the fleet once none is left. Asks you to type the\n" +
			"fleet name (or yes) unless -auto-approve; without a terminal and without -auto-approve it\n" +
			"refuses. With -wait it returns when the fleet and its nodes are gone.",
		examples: []string{"fleetd destroy bert", "fleetd destroy -auto-approve -wait bert"},
	},
	"projects": {
		usage: []string{"projects [-json]",
			"projects set NAME -quota GPUS [-max GPUS] [-priority N] [-budget-per-hour USD] [-budget-total USD] [...]",
			"projects delete [-json] NAME"},
		about: "Shows the daemon's projects: GPU quota and borrowing ceiling, the GPUs allocated, borrowed\n" +
			"and lent, the fleets waiting, spend against the budget, and who set them (docs/projects.md).\n" +
			"set and delete change a project (admin token); the change is stored and overrides daemon.hcl.\n" +
			"A token limited to a project sees only that project.",
		examples: []string{"fleetd projects", "fleetd projects -json | jq '.projects[] | {name, used_gpus}'",
			"fleetd projects set vision -quota 16 -max 32 -priority 10 -budget-total 5000"},
		subs: []string{"set", "delete"},
	},
	"projects set": {
		usage: []string{"projects set NAME -quota GPUS [-max GPUS] [-priority N] [-budget-per-hour USD] [-budget-total USD]\n" +
			"         [-warn-at FRACTION] [-on-exhausted pause|stop] [-json]"},
		about: "Creates or replaces a project: its whole settings, flags left out take their defaults. The daemon\n" +
			"stores it; it overrides daemon.hcl's project of that name and survives restarts and failover.\n" +
			"Needs the admin token.",
		examples: []string{"fleetd projects set vision -quota 16 -max 32 -priority 10 -budget-per-hour 60 -budget-total 5000"},
	},
	"projects delete": {
		usage: []string{"projects delete [-json] NAME"},
		about: "Deletes a project, daemon.hcl's too (the deletion is stored). Refused, changing nothing, while\n" +
			"fleets of the project run: the error names them. Needs the admin token.",
		examples: []string{"fleetd projects delete scratch"},
	},
	"queue": {
		usage:    []string{"queue [-json]"},
		about:    "Shows the fleets waiting to start, in the order they start, with the reason each waits.",
		examples: []string{"fleetd queue", "fleetd queue -json"},
	},
	"resume": {
		usage: []string{"resume [-json] FLEET"},
		about: "Resumes a paused fleet: it queues to start again and restarts from its checkpoint. A fleet\n" +
			"paused by its budget is paused again while the budget stays exhausted: raise it first.",
		examples: []string{"fleetd resume bert"},
	},
	"events": {
		usage:    []string{"events [-f] [-since N] [-fleet NAME] [-json]"},
		about:    "Shows the daemon's event log, oldest first; -f keeps following it.",
		examples: []string{"fleetd events -fleet bert", "fleetd events -f -json | jq -c ."},
	},
	"fmt": {
		usage: []string{"fmt [-check] [-diff] [-recursive] FILE|DIR|- ..."},
		about: "Rewrites HCL files in canonical layout and lists the files it changed. Exit 0 done,\n" +
			"1 unformatted files with -check or an I/O error, 2 a file does not parse.",
		examples: []string{"fleetd fmt train.hcl", "fleetd fmt -check -recursive specs/"},
	},
	"logs": {
		usage:    []string{"logs [-n N] [-f] [-json] FLEET [NODE]"},
		about:    "Shows the tail of a fleet's worker logs (all nodes, or one); -f keeps following.",
		examples: []string{"fleetd logs bert", "fleetd logs -f -n 20 bert bert-1-0"},
	},
	"offerings": {
		usage:    []string{"offerings [-all] [-var NAME=VALUE] [-var-file FILE] [-json] FILE"},
		about:    "Shows the ranked market view (price, capacity, score) the daemon sees for a spec's fleets.",
		examples: []string{"fleetd offerings train.hcl", "fleetd offerings -all -json train.hcl"},
	},
	"plan": {
		usage: []string{"plan [-var NAME=VALUE] [-var-file FILE] [-detailed-exitcode] [-json] FILE"},
		about: "Shows what apply would do, changing nothing. With -detailed-exitcode the exit status\n" +
			"is 0 for no changes, 1 for an error and 2 when apply would change something.",
		examples: []string{"fleetd plan train.hcl", "fleetd plan -detailed-exitcode -var-file prod.tfvars train.hcl"},
	},
	"serve": {
		usage: []string{"serve [-config daemon.hcl] [-dev] [-listen ADDR] [-advertise-url URL] [-data-dir DIR] [-log-json]"},
		about: "Runs the control daemon: API, dashboard, reconciler and provider plugins. -dev starts a\n" +
			"throwaway daemon with the local provider and prints its token.",
		examples: []string{"fleetd serve -dev", "fleetd serve -config /etc/fleetd/daemon.hcl -log-json"},
	},
	"sim": {
		usage: []string{"sim -spec FILE [-trace DIR] [-start T,...] [-windows N] [-seed S] [-json] [flags]", "sim -workload FILE.csv [-apps DIR] [-pool 16x4] [-policies fifo,fleetd,fleetd-adaptive] [-json]"},
		about: "Runs the reconciler, placement and deadline policies in virtual time over a spot trace,\n" +
			"for many start windows, and compares them with baselines and the optimum. With -workload,\n" +
			"simulates many jobs sharing a fixed GPU pool (Pollux's setting) under fleetd's allocator\n" +
			"and baselines.",
		examples: []string{"fleetd sim -spec examples/sim/deadline.hcl", "fleetd sim -workload configs/pollux/workloads/workload-1.csv", "fleetd sim -spec deadline.hcl -start 72h -policies fleetd,greedy -v"},
	},
	"state": {
		usage: []string{
			"state export (-data-dir DIR | -etcd ENDPOINTS [-prefix P]) > FILE",
			"state import (-data-dir DIR | -etcd ENDPOINTS [-prefix P]) [-force] [FILE]",
		},
		about: "Exports the daemon's state as JSON lines, or imports such a file into an empty store and\n" +
			"checks it byte for byte. Stop the daemon first.",
		examples: []string{"fleetd state export -data-dir /var/lib/fleetd > backup.jsonl", "fleetd state import -data-dir /var/lib/fleetd backup.jsonl"},
		subs:     []string{"export", "import"},
	},
	"state export": {
		usage:    []string{"state export (-data-dir DIR | -etcd ENDPOINTS [-prefix P]) > FILE"},
		about:    "Writes every record of a stopped daemon's store as JSON lines on stdout.",
		examples: []string{"fleetd state export -data-dir /var/lib/fleetd > backup.jsonl"},
	},
	"state import": {
		usage:    []string{"state import (-data-dir DIR | -etcd ENDPOINTS [-prefix P]) [-force] [FILE]"},
		about:    "Loads an export (FILE or stdin) into an empty store (-force: a non-empty one) and checks it.",
		examples: []string{"fleetd state import -data-dir /var/lib/fleetd backup.jsonl"},
	},
	"status": {
		usage:    []string{"status [-json] [FLEET]"},
		about:    "Shows the fleets and, for one FLEET, its nodes, training progress, alerts and recoveries.",
		examples: []string{"fleetd status", "fleetd status bert", "fleetd status -json bert | jq .nodes"},
	},
	"token": {
		usage: []string{
			"token create -role read|operate [-name NAME] [-project PROJECT] [-json]",
			"token list [-json]",
			"token revoke [-json] ID",
		},
		about: "Manages scoped tokens; needs the admin token in FLEETD_TOKEN. A read token sees status,\n" +
			"fleets, events, logs and metrics; an operate token also plans, applies and destroys. A token\n" +
			"made with -project acts on and sees only that project's fleets.",
		examples: []string{"fleetd token create -role read -name prometheus", "fleetd token revoke tok-3"},
		subs:     []string{"create", "list", "revoke"},
	},
	"token create": {
		usage: []string{"token create -role read|operate [-name NAME] [-project PROJECT] [-json]"},
		about: "Creates a token; its secret is printed once, the daemon keeps only its hash. With -project it\n" +
			"is limited to that project: its fleets only, and no daemon-wide route (metrics, offerings).",
		examples: []string{"fleetd token create -role read -name prometheus", "fleetd token create -role operate -project vision -name vision-ci"},
	},
	"token list": {
		usage:    []string{"token list [-json]"},
		about:    "Lists the scoped tokens (never their secrets).",
		examples: []string{"fleetd token list"},
	},
	"token revoke": {
		usage:    []string{"token revoke [-json] ID"},
		about:    "Revokes a scoped token at once.",
		examples: []string{"fleetd token revoke tok-3"},
	},
	"validate": {
		usage: []string{"validate [-var NAME=VALUE] [-var-file FILE] [-json] [-no-color] FILE"},
		about: "Checks a fleet spec locally and prints every problem with its position. Exit 0 valid\n" +
			"(warnings allowed), 2 errors. In -json output durations are seconds, as in the API.",
		examples: []string{"fleetd validate train.hcl", "fleetd validate -json -var-file prod.tfvars train.hcl"},
	},
	"version": {
		usage:    []string{"version [-json]"},
		about:    "Prints the version, commit and platform of this binary.",
		examples: []string{"fleetd version", "fleetd version -json"},
	},
}

// flagSink is the stderr the dispatcher gives a command it runs only to
// learn its flags (for help and completion): it keeps the last flag set the
// command made and swallows everything the command prints.
type flagSink struct{ fs *flag.FlagSet }

func (*flagSink) Write(p []byte) (int, error) { return len(p), nil }

// newFlagSet is flag.NewFlagSet for commands: errors go to stderr, and a
// flagSink learns the set, so help pages and completion list the real flags.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	if s, ok := stderr.(*flagSink); ok {
		s.fs = fs
	}
	return fs
}

// setUsage makes fs's usage the text (a line per element), a blank line
// and the flags.
func setUsage(fs *flag.FlagSet, w io.Writer, text ...string) {
	fs.Usage = func() {
		for _, l := range text {
			fmt.Fprintln(w, l)
		}
		fmt.Fprintln(w)
		fs.PrintDefaults()
	}
}

// commandFlags runs a command (name may be "group sub") with -h only to
// learn its flag set; nil when it has no flags. Every command parses its
// flags before doing anything, so -h has no other effect.
func commandFlags(name string) *flag.FlagSet {
	parts := strings.Fields(name)
	c, ok := commands[parts[0]]
	if !ok {
		return nil
	}
	var sink flagSink
	c.run(append(parts[1:], "-h"), io.Discard, &sink)
	return sink.fs
}

// isHelpFlag says whether a is one of the spellings of "help" as a flag.
func isHelpFlag(a string) bool { return a == "-h" || a == "-help" || a == "--help" }

// helpRequested says whether args (after the command name) ask for help:
// a help flag before any "--".
func helpRequested(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if isHelpFlag(a) {
			return true
		}
	}
	return false
}

// helpTopic is the page args ask for: "token create" for
// `fleetd token create -h`, "token" for `fleetd token -h`.
func helpTopic(name string, args []string) string {
	h := helpTexts[name]
	if len(args) > 0 && contains(h.subs, args[0]) {
		if _, ok := helpTexts[name+" "+args[0]]; ok {
			return name + " " + args[0]
		}
	}
	return name
}

// writeHelp prints a command's help page: usage first, then what it does,
// its flags and examples.
func writeHelp(w io.Writer, topic string) {
	h, ok := helpTexts[topic]
	c := commands[strings.Fields(topic)[0]]
	if !ok || len(h.usage) == 0 {
		h.usage = []string{topic + " [flags]"}
	}
	for i, u := range h.usage {
		if i == 0 {
			fmt.Fprintln(w, "Usage: fleetd "+u)
		} else {
			fmt.Fprintln(w, "       fleetd "+u)
		}
	}
	fmt.Fprintln(w)
	about := h.about
	if about == "" {
		about = c.synopsis + "."
	}
	for _, l := range strings.Split(about, "\n") {
		fmt.Fprintln(w, "  "+l)
	}
	if len(h.subs) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintf(w, "Subcommands: %s (fleetd %s SUBCOMMAND -h for its flags)\n", strings.Join(h.subs, ", "), topic)
	} else if fs := commandFlags(topic); fs != nil {
		var b bytes.Buffer
		fs.SetOutput(&b)
		fs.PrintDefaults()
		if b.Len() > 0 {
			fmt.Fprintln(w)
			fmt.Fprintln(w, "Flags:")
			w.Write(b.Bytes())
		}
	}
	if len(h.examples) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Examples:")
		for _, e := range h.examples {
			fmt.Fprintln(w, "  "+e)
		}
	}
}

// visibleCommands are the command names `fleetd help` lists, sorted.
func visibleCommands() []string {
	names := make([]string, 0, len(commands))
	for n, c := range commands {
		if !c.hidden {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// suggest returns the known command closest to a mistyped one, or "" when
// none is close enough to be a likely typo.
func suggest(typed string) string {
	best, bestD := "", 0
	for _, n := range visibleCommands() {
		d := editDistance(strings.ToLower(typed), n)
		// A prefix of a command is a likely abbreviation ("dest").
		if len(typed) >= 3 && strings.HasPrefix(n, strings.ToLower(typed)) {
			d = 1
		}
		if best == "" || d < bestD {
			best, bestD = n, d
		}
	}
	// Allow about one edit in three characters, at least one, at most two.
	limit := max(1, min(2, len(typed)/3))
	if best == "" || bestD > limit {
		return ""
	}
	return best
}

// editDistance is the Levenshtein distance with adjacent transpositions
// (optimal string alignment), so "aplpy" is one edit from "apply".
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}
