package providerv1_test

import (
	"bytes"
	"go/build"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoRoot is where mk/proto.mk lives, relative to this package.
const repoRoot = "../../../.."

var (
	pinRE         = regexp.MustCompile(`(?m)^(PROTOC_GEN_GO_VERSION|PROTOC_GEN_GO_GRPC_VERSION)\s*:=\s*(\S+)\s*$`)
	protocLineRE  = regexp.MustCompile(`(?m)^//\s*protoc\s.*$`)
	generatedGo   = []string{"provider/v1/provider.pb.go", "provider/v1/provider_grpc.pb.go"}
	protoFileRoot = filepath.Join(repoRoot, "plugins", "proto")
)

// TestGeneratedCodeIsCurrent regenerates the Go code with the generators
// pinned in mk/proto.mk and compares it with the committed files, so a
// change to provider.proto without `make proto` fails here and not in a
// plugin author's build.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	protoc, err := exec.LookPath("protoc")
	if err != nil {
		t.Skip("protoc not on PATH (apt-get install protobuf-compiler); cannot check generated code")
	}
	mk, err := os.ReadFile(filepath.Join(repoRoot, "mk", "proto.mk"))
	if err != nil {
		t.Fatalf("read the generator pins: %v", err)
	}
	pins := map[string]string{}
	for _, m := range pinRE.FindAllStringSubmatch(string(mk), -1) {
		pins[m[1]] = m[2]
	}
	genGo := findGenerator(t, "protoc-gen-go", pins["PROTOC_GEN_GO_VERSION"])
	genGRPC := findGenerator(t, "protoc-gen-go-grpc", pins["PROTOC_GEN_GO_GRPC_VERSION"])

	out := t.TempDir()
	cmd := exec.Command(protoc, "-I", protoFileRoot,
		"--plugin=protoc-gen-go="+genGo,
		"--plugin=protoc-gen-go-grpc="+genGRPC,
		"--go_out="+out, "--go_opt=paths=source_relative",
		"--go-grpc_out="+out, "--go-grpc_opt=paths=source_relative",
		"provider/v1/provider.proto")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, b)
	}
	for _, f := range generatedGo {
		committed, err := os.ReadFile(filepath.Join(protoFileRoot, f))
		if err != nil {
			t.Fatalf("read committed %s: %v", f, err)
		}
		fresh, err := os.ReadFile(filepath.Join(out, f))
		if err != nil {
			t.Fatalf("read regenerated %s: %v", f, err)
		}
		// protoc stamps its own version into a comment; nothing else
		// in the output depends on it.
		committed = protocLineRE.ReplaceAll(committed, nil)
		fresh = protocLineRE.ReplaceAll(fresh, nil)
		if !bytes.Equal(committed, fresh) {
			t.Errorf("plugins/proto/%s is stale: run 'make proto' and commit the result", f)
		}
	}
}

// findGenerator returns a generator binary of exactly the pinned version:
// first where `make proto-tools` installs it, then on PATH.
func findGenerator(t *testing.T, name, version string) string {
	t.Helper()
	if version == "" {
		t.Fatalf("mk/proto.mk pins no version for %s", name)
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		gopath = build.Default.GOPATH
	}
	candidates := []string{filepath.Join(strings.Split(gopath, string(filepath.ListSeparator))[0], "fleetd-tools", name+"-"+version, name)}
	if p, err := exec.LookPath(name); err == nil {
		candidates = append(candidates, p)
	}
	for _, c := range candidates {
		b, err := exec.Command(c, "--version").Output()
		if err != nil {
			continue
		}
		// "protoc-gen-go v1.36.12" / "protoc-gen-go-grpc 1.6.2"
		got := strings.TrimSpace(string(b))
		if strings.HasSuffix(got, " "+version) || strings.HasSuffix(got, " "+strings.TrimPrefix(version, "v")) {
			return c
		}
	}
	t.Skipf("%s %s not installed (run 'make proto-tools'); cannot check generated code", name, version)
	return ""
}
