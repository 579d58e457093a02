package bootstrap

import (
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

var checksumCmd = regexp.MustCompile(`^echo '[0-9a-f]{64}  ` + regexp.QuoteMeta(AgentBinaryPath) + `\.download' \| sha256sum -c - && chmod 0755 \S+ && mv \S+ \S+$`)

// FuzzRender feeds arbitrary node identities, URLs, tokens, certificates,
// setup lines and environment into Render. Either it refuses with an
// error, or the document is valid YAML under #cloud-config, gives back
// exactly the agent config it was given, writes the setup and CA verbatim,
// and no field can add a shell command or a unit directive of its own.
func FuzzRender(f *testing.F) {
	s := sample()
	f.Add(s.Agent.Fleet, s.Agent.NodeID, s.Agent.DaemonURL, s.Agent.Token, s.Agent.CAFingerprint, string(s.CACertPEM), s.AgentURL, s.AgentSHA256, strings.Join(s.Setup, "\n"), "NCCL_DEBUG", "WARN")
	f.Add("f", "n", "", "", "", "", "", "", "", "", "")
	f.Add("f", "n", "http://127.0.0.1:7777", "tok", "", "", "http://x/bin", strings.Repeat("a", 64), "echo hi", "K", "v\nExecStart=/bin/evil")
	f.Add("f", "n", "http://127.0.0.1:7777", "tok\r\nX-Evil: 1", "", "", "http://x/bin", "'; rm -rf / #"+strings.Repeat("a", 51), "", "A B", "\"")
	f.Add("f\x00", "n: [x]", "u", "t", "sha256:00", "-----BEGIN CERTIFICATE-----\n\xff\n", "", "", "#!/bin/sh\n'\"", "", "")
	f.Fuzz(func(t *testing.T, fleet, node, url, token, fp, caPEM, agentURL, sha, setup, envK, envV string) {
		in := Input{
			Agent:       AgentConfig{Fleet: fleet, NodeID: node, DaemonURL: url, Token: token, CAFingerprint: fp, WorkDir: "/var/lib/fleetd"},
			CACertPEM:   []byte(caPEM),
			AgentURL:    agentURL,
			AgentSHA256: sha,
		}
		if setup != "" {
			in.Setup = strings.Split(setup, "\n")
		}
		if envK != "" {
			in.Env = map[string]string{envK: envV}
		}
		doc, err := Render(in)
		if err != nil {
			if doc != "" {
				t.Fatal("a document together with an error")
			}
			return
		}
		if !strings.HasPrefix(doc, "#cloud-config\n") {
			t.Fatalf("no #cloud-config header:\n%s", doc)
		}
		var cc cloudConfig
		if err := yaml.Unmarshal([]byte(doc), &cc); err != nil {
			t.Fatalf("rendered YAML does not parse: %v\n%s", err, doc)
		}

		// The agent config comes back as its JSON form of the input.
		want := in.Agent
		if want.Metadata.Kind == "" {
			want.Metadata.Kind = "none"
		}
		b, _ := json.Marshal(want)
		want = AgentConfig{}
		_ = json.Unmarshal(b, &want)
		got, err := AgentConfigFrom(doc)
		if err != nil {
			t.Fatalf("agent config: %v\n%s", err, doc)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("agent config round trip:\n got %+v\nwant %+v", got, want)
		}

		files := map[string]writeFile{}
		for _, wf := range cc.WriteFiles {
			if _, dup := files[wf.Path]; dup {
				t.Fatalf("%s written twice", wf.Path)
			}
			files[wf.Path] = wf
		}
		if files[AgentConfigPath].Permissions != "0600" {
			t.Fatalf("agent config (holds the node token) has permissions %q", files[AgentConfigPath].Permissions)
		}
		if len(in.CACertPEM) > 0 && files[CACertPath].Content != caPEM {
			t.Fatalf("CA certificate not written verbatim: %q", files[CACertPath].Content)
		}
		if sc := files[SetupPath].Content; !strings.HasSuffix(sc, strings.Join(in.Setup, "\n")+"\n") && len(in.Setup) > 0 {
			t.Fatalf("setup script does not end with the spec's setup:\n%s", sc)
		}
		checkUnit(t, files[UnitPath].Content, in.Env)

		// The command list is fixed: fields are arguments, never commands.
		wantCmds := 3
		if agentURL != "" {
			wantCmds = 5
			curl := cc.RunCmd[0]
			if curl[0] != "curl" || curl[len(curl)-1] != agentURL {
				t.Fatalf("download command %q", curl)
			}
			if !checksumCmd.MatchString(cc.RunCmd[1][2]) {
				t.Fatalf("checksum command is not exactly the expected shell line: %q", cc.RunCmd[1][2])
			}
			for _, a := range curl {
				if strings.ContainsAny(a, "\r\n") {
					t.Fatalf("curl argument with a line break (header injection): %q", a)
				}
			}
		}
		if len(cc.RunCmd) != wantCmds {
			t.Fatalf("%d commands, want %d: %q", len(cc.RunCmd), wantCmds, cc.RunCmd)
		}
	})
}

// checkUnit: the unit has exactly one Environment= line per variable and
// otherwise only the fixed directives.
func checkUnit(t *testing.T, unitText string, env map[string]string) {
	t.Helper()
	fixed := unit(nil)
	var envLines int
	var rest []string
	for _, l := range strings.Split(unitText, "\n") {
		if strings.HasPrefix(l, "Environment=") {
			envLines++
			continue
		}
		rest = append(rest, l)
	}
	if envLines != len(env) {
		t.Fatalf("%d Environment= lines for %d variables:\n%s", envLines, len(env), unitText)
	}
	if strings.Join(rest, "\n") != fixed {
		t.Fatalf("unit directives changed by the environment:\n%s", unitText)
	}
}
