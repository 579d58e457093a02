package main

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/hashicorp/hcl/v2"

	"github.com/fleetd/fleetd/fleet/spec"
)

func init() {
	register(command{name: "fmt", synopsis: "Rewrite spec files in canonical format", run: runFmt})
}

// fmtOptions are the flags of one fmt run.
type fmtOptions struct {
	check, diff, recursive bool
}

// fmtResult gathers what a run found across all files.
type fmtResult struct {
	unformatted int
	ioErrors    int
	files       map[string]*hcl.File
	diags       hcl.Diagnostics
}

func runFmt(args []string, stdout, stderr io.Writer) int {
	flags := newFlagSet("fmt", stderr)
	flags.SetOutput(stderr)
	var o fmtOptions
	flags.BoolVar(&o.check, "check", false, "change no file; list unformatted files and exit 1 if there are any")
	flags.BoolVar(&o.diff, "diff", false, "print a unified diff of the changes")
	flags.BoolVar(&o.recursive, "recursive", false, "also format *.hcl files in subdirectories of a DIR argument")
	setUsage(flags, stderr,
		"Usage: fleetd fmt [-check] [-diff] [-recursive] FILE|DIR|- ...",
		"\nRewrites HCL files in canonical layout and lists the files it changed.",
		"A DIR argument means its *.hcl files; - reads stdin and writes stdout.",
		"Exit status: 0 done (or, with -check, all formatted), 1 unformatted files",
		"with -check or an I/O error, 2 a file does not parse or usage error.",
	)
	paths, err := parseInterleaved(flags, args)
	if err != nil {
		return exitUsage
	}
	if len(paths) == 0 {
		flags.Usage()
		return exitUsage
	}
	res := &fmtResult{files: map[string]*hcl.File{}}
	for _, p := range paths {
		if p == "-" {
			fmtStdin(o, res, stdout, stderr)
			continue
		}
		files, err := fmtTargets(p, o.recursive)
		if err != nil {
			fmt.Fprintln(stderr, "Error:", err)
			res.ioErrors++
			continue
		}
		for _, f := range files {
			fmtFile(f, o, res, stdout, stderr)
		}
	}
	if len(res.diags) > 0 {
		width, color := diagStyle(stderr)
		_ = spec.WriteDiagnostics(stderr, res.files, res.diags, width, color)
	}
	switch {
	case res.diags.HasErrors():
		return exitUsage
	case res.ioErrors > 0:
		return exitError
	case o.check && res.unformatted > 0:
		return exitError
	}
	return exitOK
}

// fmtTargets expands a path argument: a file is itself, a directory its
// *.hcl files (sorted, subdirectories with recursive, hidden ones skipped).
func fmtTargets(path string, recursive bool) ([]string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return []string{path}, nil
	}
	var out []string
	err = filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != path && (!recursive || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(d.Name(), ".hcl") {
			out = append(out, p)
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}

// format checks the syntax first: a file that does not parse is reported
// and never rewritten, since formatting it could move its mistakes around.
func (r *fmtResult) format(name string, src []byte) ([]byte, bool) {
	f, diags := spec.CheckSyntax(name, src)
	if f != nil {
		r.files[name] = f
	} else {
		r.files[name] = &hcl.File{Bytes: src}
	}
	if diags.HasErrors() {
		r.diags = append(r.diags, diags...)
		return nil, false
	}
	return spec.Format(src), true
}

func fmtFile(path string, o fmtOptions, res *fmtResult, stdout, stderr io.Writer) {
	src, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(stderr, "Error:", err)
		res.ioErrors++
		return
	}
	out, ok := res.format(path, src)
	if !ok || bytes.Equal(src, out) {
		return
	}
	res.unformatted++
	fmt.Fprintln(stdout, path)
	if o.diff {
		fmt.Fprint(stdout, unifiedDiff(path, src, out))
	}
	if o.check {
		return
	}
	if err := writeFileAtomic(path, out); err != nil {
		fmt.Fprintln(stderr, "Error:", err)
		res.ioErrors++
	}
}

func fmtStdin(o fmtOptions, res *fmtResult, stdout, stderr io.Writer) {
	src, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(stderr, "Error: reading stdin:", err)
		res.ioErrors++
		return
	}
	out, ok := res.format("<stdin>", src)
	if !ok {
		return
	}
	changed := !bytes.Equal(src, out)
	if changed {
		res.unformatted++
	}
	switch {
	case o.diff:
		fmt.Fprint(stdout, unifiedDiff("<stdin>", src, out))
	case o.check:
		if changed {
			fmt.Fprintln(stdout, "<stdin>")
		}
	default:
		_, _ = stdout.Write(out)
	}
}

// writeFileAtomic replaces path with data through a temporary file in the
// same directory, keeping the file's mode, so an interrupted fmt never
// leaves a truncated spec behind.
func writeFileAtomic(path string, data []byte) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".fmt-*")
	if err != nil {
		return fmt.Errorf("rewrite %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("rewrite %s: %w", path, err)
	}
	if err := tmp.Chmod(fi.Mode().Perm()); err != nil {
		tmp.Close()
		return fmt.Errorf("rewrite %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("rewrite %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rewrite %s: %w", path, err)
	}
	return nil
}

// diffContext is the number of unchanged lines around each hunk.
const diffContext = 3

// maxDiffCells bounds the line-matching table; beyond it the changed middle
// of the file is shown as one replacement.
const maxDiffCells = 4 << 20

type diffOp struct {
	kind byte // ' ', '-' or '+'
	a, b int  // line index in old and new at this point
	text string
}

// unifiedDiff renders the change from a to b as a unified diff with
// "a/NAME" and "b/NAME" headers; "" when they are equal.
func unifiedDiff(name string, a, b []byte) string {
	if bytes.Equal(a, b) {
		return ""
	}
	ops := diffLines(splitKeepLines(a), splitKeepLines(b))
	var out strings.Builder
	fmt.Fprintf(&out, "--- a/%s\n+++ b/%s\n", name, name)
	for i := 0; i < len(ops); {
		for i < len(ops) && ops[i].kind == ' ' {
			i++
		}
		if i == len(ops) {
			break
		}
		start, end := max(0, i-diffContext), i
		for {
			for end < len(ops) && ops[end].kind != ' ' {
				end++
			}
			j := end
			for j < len(ops) && ops[j].kind == ' ' {
				j++
			}
			if j < len(ops) && j-end <= 2*diffContext {
				end = j
				continue
			}
			end = min(len(ops), end+diffContext)
			break
		}
		writeHunk(&out, ops[start:end])
		i = end
	}
	return out.String()
}

func writeHunk(out *strings.Builder, h []diffOp) {
	var aLen, bLen int
	for _, op := range h {
		if op.kind != '+' {
			aLen++
		}
		if op.kind != '-' {
			bLen++
		}
	}
	aStart, bStart := h[0].a+1, h[0].b+1
	if aLen == 0 {
		aStart--
	}
	if bLen == 0 {
		bStart--
	}
	fmt.Fprintf(out, "@@ -%d,%d +%d,%d @@\n", aStart, aLen, bStart, bLen)
	for _, op := range h {
		out.WriteByte(op.kind)
		out.WriteString(strings.TrimSuffix(op.text, "\n"))
		out.WriteByte('\n')
		if !strings.HasSuffix(op.text, "\n") {
			out.WriteString("\\ No newline at end of file\n")
		}
	}
}

func splitKeepLines(b []byte) []string {
	var lines []string
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			lines = append(lines, string(b))
			break
		}
		lines = append(lines, string(b[:i+1]))
		b = b[i+1:]
	}
	return lines
}

// diffLines computes an edit script by longest common subsequence over the
// lines between the common prefix and suffix.
func diffLines(a, b []string) []diffOp {
	pre := 0
	for pre < len(a) && pre < len(b) && a[pre] == b[pre] {
		pre++
	}
	suf := 0
	for suf < len(a)-pre && suf < len(b)-pre && a[len(a)-1-suf] == b[len(b)-1-suf] {
		suf++
	}
	ma, mb := a[pre:len(a)-suf], b[pre:len(b)-suf]

	ops := make([]diffOp, 0, len(a)+len(b))
	for i := 0; i < pre; i++ {
		ops = append(ops, diffOp{' ', i, i, a[i]})
	}
	n, m := len(ma), len(mb)
	if (n+1)*(m+1) > maxDiffCells {
		for i := range ma {
			ops = append(ops, diffOp{'-', pre + i, pre, ma[i]})
		}
		for j := range mb {
			ops = append(ops, diffOp{'+', pre + n, pre + j, mb[j]})
		}
	} else {
		// lcs[i][j] is the LCS length of ma[i:] and mb[j:].
		lcs := make([][]int32, n+1)
		for i := range lcs {
			lcs[i] = make([]int32, m+1)
		}
		for i := n - 1; i >= 0; i-- {
			for j := m - 1; j >= 0; j-- {
				if ma[i] == mb[j] {
					lcs[i][j] = lcs[i+1][j+1] + 1
				} else {
					lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
				}
			}
		}
		i, j := 0, 0
		for i < n || j < m {
			switch {
			case i < n && j < m && ma[i] == mb[j]:
				ops = append(ops, diffOp{' ', pre + i, pre + j, ma[i]})
				i++
				j++
			case j == m || (i < n && lcs[i+1][j] >= lcs[i][j+1]):
				ops = append(ops, diffOp{'-', pre + i, pre + j, ma[i]})
				i++
			default:
				ops = append(ops, diffOp{'+', pre + i, pre + j, mb[j]})
				j++
			}
		}
	}
	for k := 0; k < suf; k++ {
		ops = append(ops, diffOp{' ', len(a) - suf + k, len(b) - suf + k, a[len(a)-suf+k]})
	}
	return ops
}
