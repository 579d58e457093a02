package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/fleetd/fleetd/fleet/api"
)

func init() {
	register(command{name: "token", synopsis: "Create, list and revoke scoped API tokens (read, operate)", run: runToken})
}

func tokenUsage(w io.Writer) {
	fmt.Fprintln(w, "Usage: fleetd token create -role read|operate [-name NAME] [-project PROJECT] [-json]")
	fmt.Fprintln(w, "       fleetd token list [-json]")
	fmt.Fprintln(w, "       fleetd token revoke [-json] ID")
	fmt.Fprintln(w, "Manages scoped tokens; needs the admin token in FLEETD_TOKEN. A read token sees status,")
	fmt.Fprintln(w, "fleets, events, logs and metrics; an operate token also plans, applies and destroys.")
	fmt.Fprintln(w, "With -project the token acts only on that project's fleets and sees only them (status,")
	fmt.Fprintln(w, "events, projects, queue); daemon-wide routes (metrics, offerings, check) refuse it.")
	fmt.Fprintln(w, "The secret is printed once, at creation: the daemon keeps only its hash.")
}

func runToken(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		tokenUsage(stderr)
		return exitUsage
	}
	sub, args := args[0], args[1:]
	fs, cf := newClientFlagSet("token "+sub, stderr)
	fs.Usage = func() { tokenUsage(stderr) }
	var role, name, project *string
	if sub == "create" {
		role = fs.String("role", "", "read or operate (required)")
		name = fs.String("name", "", "what uses the token, for the list (e.g. prometheus)")
		project = fs.String("project", "", "limit the token to this project's fleets")
	}
	rest, err := parseInterleaved(fs, args)
	if err != nil {
		return exitUsage
	}
	ctx := context.Background()
	switch sub {
	case "create":
		if len(rest) != 0 || *role == "" {
			tokenUsage(stderr)
			return exitUsage
		}
		if _, err := api.ParseRole(*role); err != nil {
			return exitCode(stderr, usageError{err})
		}
		c, err := cf.client()
		if err != nil {
			return exitCode(stderr, err)
		}
		var tc api.TokenCreated
		if err := c.Do(ctx, http.MethodPost, "/v1/tokens", nil, api.TokenRequest{Role: *role, Name: *name, Project: *project}, &tc); err != nil {
			return exitCode(stderr, tokenError(err))
		}
		if cf.json {
			printJSON(stdout, tc)
			return exitOK
		}
		// The secret alone on stdout, so `fleetd token create … > file`
		// makes a credentials file; the rest is for the human.
		fmt.Fprintln(stdout, tc.Token)
		scope := ""
		if tc.Project != "" {
			scope = fmt.Sprintf(", limited to project %s", tc.Project)
		}
		fmt.Fprintf(stderr, "Created %s token %s%s%s. This is the only time the secret is shown.\n", tc.Role, tc.ID, quotedName(tc.Name), scope)
		return exitOK
	case "list":
		if len(rest) != 0 {
			tokenUsage(stderr)
			return exitUsage
		}
		c, err := cf.client()
		if err != nil {
			return exitCode(stderr, err)
		}
		var ts []api.TokenInfo
		if err := c.Do(ctx, http.MethodGet, "/v1/tokens", nil, nil, &ts); err != nil {
			return exitCode(stderr, tokenError(err))
		}
		if cf.json {
			printJSON(stdout, ts)
			return exitOK
		}
		if len(ts) == 0 {
			fmt.Fprintln(stdout, "No scoped tokens (create one with `fleetd token create -role read`).")
			return exitOK
		}
		tw := tabwriter.NewWriter(stdout, 0, 2, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tROLE\tPROJECT\tNAME\tCREATED")
		for _, t := range ts {
			proj := t.Project
			if proj == "" {
				proj = "(all)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s ago\n", t.ID, t.Role, proj, dash(t.Name), age(time.Since(t.CreatedAt)))
		}
		tw.Flush()
		return exitOK
	case "revoke":
		if len(rest) != 1 || rest[0] == "" {
			tokenUsage(stderr)
			return exitUsage
		}
		c, err := cf.client()
		if err != nil {
			return exitCode(stderr, err)
		}
		var info api.TokenInfo
		if err := c.Do(ctx, http.MethodDelete, "/v1/tokens/"+url.PathEscape(rest[0]), nil, nil, &info); err != nil {
			return exitCode(stderr, tokenError(err))
		}
		if cf.json {
			printJSON(stdout, info)
			return exitOK
		}
		fmt.Fprintf(stdout, "Revoked %s token %s%s.\n", info.Role, info.ID, quotedName(info.Name))
		return exitOK
	}
	fmt.Fprintf(stderr, "fleetd token: unknown subcommand %q\n", sub)
	tokenUsage(stderr)
	return exitUsage
}

func quotedName(n string) string {
	if n == "" {
		return ""
	}
	return fmt.Sprintf(" (%q)", n)
}

// tokenError explains the common refusal: token management needs the
// admin token, and a scoped token in FLEETD_TOKEN is not enough.
func tokenError(err error) error {
	var he *api.HTTPError
	if errors.As(err, &he) && he.StatusCode == http.StatusForbidden {
		return fmt.Errorf("%w (token management needs the admin token in FLEETD_TOKEN)", err)
	}
	return err
}
