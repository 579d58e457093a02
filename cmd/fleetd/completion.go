package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"
)

func init() {
	register(command{name: "completion", synopsis: "Print a bash or zsh completion script", run: runCompletion})
}

// Argument kinds for completion: what a command's positional arguments or a
// flag's value are.
const (
	argSpec  = "spec"  // a spec file (*.hcl)
	argFleet = "fleet" // a fleet name, asked of the daemon
	argFile  = "file"
	argDir   = "dir"
)

// positionalKinds: what each command's first positional argument is.
var positionalKinds = map[string]string{
	"apply": argSpec, "plan": argSpec, "check": argSpec, "offerings": argSpec, "validate": argSpec, "fmt": argSpec,
	"status": argFleet, "destroy": argFleet, "logs": argFleet, "events": argFleet, "debug interrupt": argFleet,
	"state import": argFile,
}

// flagValueKinds: what a flag's value is, for the flags whose value can be
// completed; other value flags complete nothing.
var flagValueKinds = map[string]string{
	"var-file": argFile, "config": argFile, "ca-cert": argFile, "spec": argSpec,
	"etcd-cacert": argFile, "etcd-cert": argFile, "etcd-key": argFile,
	"trace": argDir, "data-dir": argDir, "root": argDir, "fleet": argFleet,
}

// flagWords: flags whose value is one of a few words.
var flagWords = map[string][]string{
	"role":      {"read", "operate"},
	"log-level": {"debug", "info", "warn", "error"},
	"kind":      {"spot-interruption", "rebalance", "maintenance", "preempted", "lost"},
}

// fleetsTimeout bounds the daemon lookup a completion makes, so a missing
// daemon costs the user a second at most.
const fleetsTimeout = time.Second

func runCompletion(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && args[0] == "fleets" {
		// Called by the scripts; prints nothing when the daemon is not there.
		return completeFleets(stdout)
	}
	if len(args) != 1 || (args[0] != "bash" && args[0] != "zsh") {
		fmt.Fprintln(stderr, "Usage: fleetd completion bash|zsh")
		return exitUsage
	}
	m := completionModel()
	if args[0] == "bash" {
		writeBashCompletion(stdout, m)
	} else {
		writeZshCompletion(stdout, m)
	}
	return exitOK
}

// completeFleets prints the daemon's fleet names, one a line.
func completeFleets(stdout io.Writer) int {
	var cf clientFlags
	fs := flag.NewFlagSet("completion", flag.ContinueOnError)
	cf.register(fs) // defaults from FLEETD_ADDR, FLEETD_CACERT, ...
	c, err := cf.client()
	if err != nil {
		return exitError
	}
	ctx, cancel := context.WithTimeout(context.Background(), fleetsTimeout)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		return exitError
	}
	for _, f := range st.Fleets {
		fmt.Fprintln(stdout, f.Name)
	}
	return exitOK
}

// compCommand is what the scripts know about one command (or "group sub").
type compCommand struct {
	name       string
	synopsis   string
	subs       []string
	flags      []string // names without the dash
	valueFlags []string // the flags that take a value
	positional string   // argSpec, argFleet, ... or ""
}

// completionModel gathers the visible commands, their subcommands and their
// real flags (from their flag sets), sorted, so the scripts are stable.
func completionModel() []compCommand {
	var out []compCommand
	add := func(name, synopsis string, subs []string) {
		cc := compCommand{name: name, synopsis: synopsis, subs: subs, positional: positionalKinds[name]}
		if len(subs) == 0 {
			if fs := commandFlags(name); fs != nil {
				fs.VisitAll(func(f *flag.Flag) {
					cc.flags = append(cc.flags, f.Name)
					if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !ok || !b.IsBoolFlag() {
						cc.valueFlags = append(cc.valueFlags, f.Name)
					}
				})
			}
		}
		out = append(out, cc)
	}
	for _, n := range visibleCommands() {
		h := helpTexts[n]
		add(n, commands[n].synopsis, h.subs)
		if n == "completion" {
			continue // its subcommands are words, not commands with flags
		}
		for _, s := range h.subs {
			add(n+" "+s, "", nil)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func dashed(names []string) string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = "-" + n
	}
	return strings.Join(out, " ")
}

func writeBashCompletion(w io.Writer, m []compCommand) {
	var top []string
	for _, c := range m {
		if !strings.Contains(c.name, " ") {
			top = append(top, c.name)
		}
	}
	fmt.Fprintf(w, `# bash completion for fleetd. Load it with:
#   source <(fleetd completion bash)
# or save it as /etc/bash_completion.d/fleetd.

_fleetd_fleets() {
    COMPREPLY=($(compgen -W "$(fleetd completion fleets 2>/dev/null)" -- "$1"))
}

_fleetd() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local cmd i=2
    COMPREPLY=()
    if [[ $COMP_CWORD -eq 1 ]]; then
        COMPREPLY=($(compgen -W "help %s" -- "$cur"))
        return
    fi
    cmd="${COMP_WORDS[1]}"
    if [[ $cmd == help ]]; then
        [[ $COMP_CWORD -eq 2 ]] && COMPREPLY=($(compgen -W "%s" -- "$cur"))
        return
    fi
    case "$cmd" in
`, strings.Join(top, " "), strings.Join(top, " "))
	for _, c := range m {
		if len(c.subs) > 0 {
			fmt.Fprintf(w, "    %s)\n        if [[ $COMP_CWORD -eq 2 ]]; then\n            COMPREPLY=($(compgen -W \"%s\" -- \"$cur\"))\n            return\n        fi\n        cmd=\"$cmd ${COMP_WORDS[2]}\"; i=3 ;;\n",
				c.name, strings.Join(c.subs, " "))
		}
	}
	fmt.Fprint(w, `    esac
    case "$prev" in
`)
	writeFlagValueCases(w, bashComplete, func(ws []string) string {
		return fmt.Sprintf(`COMPREPLY=($(compgen -W "%s" -- "$cur"))`, strings.Join(ws, " "))
	})
	fmt.Fprint(w, `    esac
    # vf: the command's flags that take a value. The value of any other
    # one has nothing to offer, and is no positional argument.
    local vf=""
    case "$cmd" in
`)
	for _, c := range m {
		if len(c.valueFlags) > 0 {
			fmt.Fprintf(w, "    %q) vf=\" %s \" ;;\n", c.name, dashed(c.valueFlags))
		}
	}
	fmt.Fprint(w, `    esac
    [[ $prev == -* && $vf == *" $prev "* ]] && return
    if [[ $cur == -* ]]; then
        case "$cmd" in
`)
	for _, c := range m {
		if len(c.flags) > 0 {
			fmt.Fprintf(w, "        %q) COMPREPLY=($(compgen -W \"%s\" -- \"$cur\")) ;;\n", c.name, dashed(c.flags))
		}
	}
	fmt.Fprint(w, `        esac
        return
    fi
    # Only the first positional argument is completed (flags may come
    # before or after it).
    local n=0 w
    for ((; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        if [[ $w == -* ]]; then
            [[ $vf == *" $w "* ]] && ((i++))
        else
            ((n++))
        fi
    done
    [[ $n -eq 0 ]] || return
    case "$cmd" in
`)
	byPos := map[string][]string{}
	for _, c := range m {
		if c.positional != "" {
			byPos[c.positional] = append(byPos[c.positional], fmt.Sprintf("%q", c.name))
		}
	}
	for _, k := range []string{argSpec, argFleet, argFile} {
		if len(byPos[k]) > 0 {
			fmt.Fprintf(w, "    %s)\n        %s ;;\n", strings.Join(byPos[k], "|"), bashComplete(k))
		}
	}
	fmt.Fprint(w, `    esac
}

complete -F _fleetd fleetd
`)
}

// writeFlagValueCases writes the case arms that complete a flag's value:
// the same arms for both shells, but for how each offers files or words.
func writeFlagValueCases(w io.Writer, complete func(kind string) string, words func([]string) string) {
	byKind := map[string][]string{}
	for f, k := range flagValueKinds {
		byKind[k] = append(byKind[k], "-"+f)
	}
	for _, k := range []string{argFile, argDir, argSpec, argFleet} {
		sort.Strings(byKind[k])
		fmt.Fprintf(w, "    %s)\n        %s\n        return ;;\n", strings.Join(byKind[k], "|"), complete(k))
	}
	for _, f := range slices.Sorted(maps.Keys(flagWords)) {
		fmt.Fprintf(w, "    -%s)\n        %s\n        return ;;\n", f, words(flagWords[f]))
	}
}

func bashComplete(kind string) string {
	switch kind {
	case argSpec:
		return `COMPREPLY=($(compgen -f -X '!*.hcl' -- "$cur") $(compgen -d -- "$cur"))`
	case argDir:
		return `COMPREPLY=($(compgen -d -- "$cur"))`
	case argFleet:
		return `_fleetd_fleets "$cur"`
	}
	return `COMPREPLY=($(compgen -f -- "$cur"))`
}

func writeZshCompletion(w io.Writer, m []compCommand) {
	fmt.Fprint(w, `#compdef fleetd
# zsh completion for fleetd. Save it as _fleetd in a directory of $fpath:
#   fleetd completion zsh > "${fpath[1]}/_fleetd"
# or load it in a running shell (after compinit) with:
#   source <(fleetd completion zsh)

_fleetd() {
    local -a cmds
    cmds=(
`)
	var top []string
	for _, c := range m {
		if !strings.Contains(c.name, " ") {
			top = append(top, c.name)
			fmt.Fprintf(w, "        %s\n", zshQuote(c.name+":"+c.synopsis))
		}
	}
	fmt.Fprint(w, `    )
    if (( CURRENT == 2 )); then
        _describe -t commands 'fleetd command' cmds
        return
    fi
    local cmd=${words[2]} first=3
    if [[ $cmd == help ]]; then
        (( CURRENT == 3 )) && _describe -t commands 'fleetd command' cmds
        return
    fi
    case $cmd in
`)
	for _, c := range m {
		if len(c.subs) > 0 {
			fmt.Fprintf(w, "    %s)\n        if (( CURRENT == 3 )); then\n            compadd -- %s\n            return\n        fi\n        cmd=\"$cmd ${words[3]}\"; first=4 ;;\n", c.name, strings.Join(c.subs, " "))
		}
	}
	fmt.Fprint(w, `    esac
    local prev=${words[CURRENT-1]} cur=${words[CURRENT]}
    case $prev in
`)
	writeFlagValueCases(w, zshComplete, func(ws []string) string { return "compadd -- " + strings.Join(ws, " ") })
	fmt.Fprint(w, `    esac
    # vf: the command's flags that take a value. The value of any other
    # one has nothing to offer, and is no positional argument.
    local vf=""
    case $cmd in
`)
	for _, c := range m {
		if len(c.valueFlags) > 0 {
			fmt.Fprintf(w, "    %s) vf=' %s ' ;;\n", zshQuote(c.name), dashed(c.valueFlags))
		}
	}
	fmt.Fprint(w, `    esac
    [[ $prev == -* && $vf == *" $prev "* ]] && return
    if [[ $cur == -* ]]; then
        case $cmd in
`)
	for _, c := range m {
		if len(c.flags) > 0 {
			fmt.Fprintf(w, "        %s) compadd -- %s ;;\n", zshQuote(c.name), dashed(c.flags))
		}
	}
	fmt.Fprint(w, `        esac
        return
    fi
    local n=0 i
    for (( i = first; i < CURRENT; i++ )); do
        if [[ ${words[i]} == -* ]]; then
            [[ $vf == *" ${words[i]} "* ]] && (( i++ ))
        else
            (( n++ ))
        fi
    done
    (( n == 0 )) || return
    case $cmd in
`)
	byPos := map[string][]string{}
	for _, c := range m {
		if c.positional != "" {
			byPos[c.positional] = append(byPos[c.positional], zshQuote(c.name))
		}
	}
	for _, k := range []string{argSpec, argFleet, argFile} {
		if len(byPos[k]) > 0 {
			fmt.Fprintf(w, "    %s)\n        %s ;;\n", strings.Join(byPos[k], "|"), zshComplete(k))
		}
	}
	fmt.Fprint(w, `    esac
}

if [[ $funcstack[1] == _fleetd ]]; then
    _fleetd "$@"
else
    compdef _fleetd fleetd
fi
`)
}

func zshComplete(kind string) string {
	switch kind {
	case argSpec:
		return `_files -g '*.hcl'`
	case argDir:
		return `_files -/`
	case argFleet:
		return `compadd -- ${(f)"$(fleetd completion fleets 2>/dev/null)"}`
	}
	return `_files`
}

// zshQuote single-quotes s for zsh.
func zshQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
