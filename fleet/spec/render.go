package spec

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// maxSnippetLines bounds the source shown for one diagnostic.
const maxSnippetLines = 6

const (
	ansiReset  = "\x1b[0m"
	ansiBold   = "\x1b[1m"
	ansiRed    = "\x1b[1;31m"
	ansiYellow = "\x1b[1;33m"
)

// WriteDiagnostics renders every diagnostic with its file:line:col, the
// enclosing block, a source snippet with the offending part underlined and
// the detail text wrapped at width (0: no wrapping), then a footer such as
// "3 errors, 1 warning". color adds ANSI escapes for terminals.
func WriteDiagnostics(w io.Writer, files map[string]*hcl.File, diags hcl.Diagnostics, width uint, color bool) error {
	bw := bufio.NewWriter(w)
	r := renderer{w: bw, files: files, width: int(width), color: color}
	for _, d := range diags {
		if d != nil {
			r.diagnostic(d)
		}
	}
	if footer := Summary(diags); footer != "" {
		fmt.Fprintln(bw, footer)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write diagnostics: %w", err)
	}
	return nil
}

// Summary counts diagnostics: "1 error", "2 errors, 1 warning", "" if none.
func Summary(diags hcl.Diagnostics) string {
	var errs, warns int
	for _, d := range diags {
		switch {
		case d == nil:
		case d.Severity == hcl.DiagError:
			errs++
		case d.Severity == hcl.DiagWarning:
			warns++
		}
	}
	var parts []string
	if errs > 0 {
		parts = append(parts, plural(errs, "error"))
	}
	if warns > 0 {
		parts = append(parts, plural(warns, "warning"))
	}
	return strings.Join(parts, ", ")
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

type renderer struct {
	w     io.Writer
	files map[string]*hcl.File
	width int
	color bool
}

func (r *renderer) paint(code, s string) string {
	if !r.color || s == "" {
		return s
	}
	return code + s + ansiReset
}

func (r *renderer) diagnostic(d *hcl.Diagnostic) {
	sev, code := "Error", ansiRed
	if d.Severity == hcl.DiagWarning {
		sev, code = "Warning", ansiYellow
	}
	fmt.Fprintf(r.w, "%s: %s\n", r.paint(code, sev), r.paint(ansiBold, d.Summary))
	if d.Subject != nil {
		s := d.Subject
		file := r.files[s.Filename]
		where := fmt.Sprintf("%s:%d:%d", s.Filename, s.Start.Line, s.Start.Column)
		if file != nil {
			if c := blockContext(file, s.Start.Byte); c != "" {
				where += ", in " + c
			}
		}
		fmt.Fprintf(r.w, "\n  on %s:\n", where)
		if file != nil && file.Bytes != nil {
			r.snippet(file.Bytes, d, code)
		}
		if with := valuesUsed(d); len(with) > 0 {
			fmt.Fprintf(r.w, "  with %s\n", strings.Join(with, ",\n       "))
		}
	}
	if d.Detail != "" {
		fmt.Fprintln(r.w)
		for _, line := range wrap(d.Detail, r.width-2) {
			if line == "" {
				fmt.Fprintln(r.w)
				continue
			}
			fmt.Fprintf(r.w, "  %s\n", line)
		}
	}
	fmt.Fprintln(r.w)
}

// blockContext names the blocks enclosing offset, outermost first:
// `fleet "bert", provider "aws"`.
func blockContext(f *hcl.File, offset int) string {
	body, ok := f.Body.(*hclsyntax.Body)
	var parts []string
	for ok && len(parts) < 16 {
		ok = false
		for _, b := range body.Blocks {
			if b.Range().ContainsOffset(offset) {
				label := b.Type
				for _, l := range b.Labels {
					label += fmt.Sprintf(" %q", l)
				}
				parts = append(parts, label)
				body, ok = b.Body, true
				break
			}
		}
	}
	return strings.Join(parts, ", ")
}

type srcLine struct {
	num        int
	start, end int // byte offsets, end excludes the newline
}

func splitLines(src []byte) []srcLine {
	var lines []srcLine
	start := 0
	for i := 0; i <= len(src); i++ {
		if i == len(src) || src[i] == '\n' {
			end := i
			if end > start && src[end-1] == '\r' {
				end--
			}
			lines = append(lines, srcLine{num: len(lines) + 1, start: start, end: end})
			start = i + 1
		}
	}
	return lines
}

// snippetLines picks the lines to show: the subject and its context when
// that fits, else the subject alone, elided in the middle when long.
func snippetLines(lines []srcLine, d *hcl.Diagnostic) []srcLine {
	span := func(r hcl.Range) []srcLine {
		from, to := r.Start.Line, r.End.Line
		if r.End.Byte > r.Start.Byte && r.End.Column == 1 && to > from {
			to-- // a range ending at the start of a line does not show it
		}
		if from < 1 {
			from = 1
		}
		if to > len(lines) {
			to = len(lines)
		}
		if from > to {
			return nil
		}
		return lines[from-1 : to]
	}
	shown := span(*d.Subject)
	if d.Context != nil {
		if c := span(hcl.RangeOver(*d.Subject, *d.Context)); len(c) <= maxSnippetLines {
			shown = c
		}
	}
	if len(shown) > maxSnippetLines {
		head := append([]srcLine{}, shown[:maxSnippetLines-2]...)
		head = append(head, srcLine{num: -1})
		shown = append(head, shown[len(shown)-1])
	}
	return shown
}

func (r *renderer) snippet(src []byte, d *hcl.Diagnostic, code string) {
	lines := snippetLines(splitLines(src), d)
	if len(lines) == 0 {
		return
	}
	numWidth := len(fmt.Sprint(lines[len(lines)-1].num))
	if numWidth < 3 {
		numWidth = 3
	}
	hlStart, hlEnd := d.Subject.Start.Byte, d.Subject.End.Byte
	if hlEnd <= hlStart {
		hlEnd = hlStart + 1 // an empty range still gets one caret
	}
	for _, l := range lines {
		if l.num < 0 {
			fmt.Fprintf(r.w, "  %*s |\n", numWidth, "...")
			continue
		}
		text := string(src[l.start:l.end])
		fmt.Fprintf(r.w, "  %*d | %s\n", numWidth, l.num, strings.TrimRight(text, " \t"))
		from, to := max(hlStart, l.start), min(hlEnd, l.end+1)
		if from > hlStart { // a continuation line: underline from its text
			for from < min(to, l.end) && (src[from] == ' ' || src[from] == '\t') {
				from++
			}
		}
		if from >= to || from > l.end {
			continue
		}
		var pad strings.Builder
		for _, c := range string(src[l.start:from]) {
			if c == '\t' {
				pad.WriteByte('\t')
			} else {
				pad.WriteByte(' ')
			}
		}
		n := utf8.RuneCount(src[from:min(to, l.end)])
		if n == 0 {
			n = 1
		}
		fmt.Fprintf(r.w, "  %*s | %s%s\n", numWidth, "", pad.String(), r.paint(code, strings.Repeat("^", n)))
	}
}

// valuesUsed describes the variables an erroneous expression read, so a
// value that came from -var or the environment is visible in the message.
func valuesUsed(d *hcl.Diagnostic) []string {
	if d.Expression == nil || d.EvalContext == nil {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	for _, tr := range d.Expression.Variables() {
		v, diags := tr.TraverseAbs(d.EvalContext)
		if diags.HasErrors() || !v.IsWhollyKnown() {
			continue
		}
		name := traversalString(tr)
		if seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, name+" = "+shortValue(v))
	}
	sort.Strings(out)
	return out
}

func traversalString(tr hcl.Traversal) string {
	var b strings.Builder
	for _, step := range tr {
		switch s := step.(type) {
		case hcl.TraverseRoot:
			b.WriteString(s.Name)
		case hcl.TraverseAttr:
			b.WriteString("." + s.Name)
		case hcl.TraverseIndex:
			if s.Key.Type().IsPrimitiveType() && s.Key.IsKnown() && !s.Key.IsNull() {
				b.WriteString("[" + shortValue(s.Key) + "]")
			} else {
				b.WriteString("[...]")
			}
		}
	}
	return b.String()
}

func shortValue(v cty.Value) string {
	ty := v.Type()
	switch {
	case v.IsNull():
		return "null"
	case ty == cty.String:
		return fmt.Sprintf("%q", v.AsString())
	case ty == cty.Number:
		return v.AsBigFloat().Text('g', -1)
	case ty == cty.Bool:
		return fmt.Sprint(v.True())
	case ty.IsCollectionType() || ty.IsTupleType():
		return fmt.Sprintf("%s with %s", ty.FriendlyName(), plural(v.LengthInt(), "element"))
	case ty.IsObjectType():
		return fmt.Sprintf("object with %s", plural(len(ty.AttributeTypes()), "attribute"))
	}
	return ty.FriendlyName()
}

// wrap breaks text into lines of at most width columns at spaces; width
// <= 0 keeps each paragraph on one line.
func wrap(text string, width int) []string {
	var out []string
	for _, para := range strings.Split(text, "\n") {
		if width <= 0 || utf8.RuneCountInString(para) <= width {
			out = append(out, para)
			continue
		}
		var line bytes.Buffer
		for _, word := range strings.Fields(para) {
			if line.Len() > 0 && utf8.RuneCount(line.Bytes())+1+utf8.RuneCountInString(word) > width {
				out = append(out, line.String())
				line.Reset()
			}
			if line.Len() > 0 {
				line.WriteByte(' ')
			}
			line.WriteString(word)
		}
		out = append(out, line.String())
	}
	return out
}

// JSONDiagnostic is a diagnostic for machines (validate -json, the API).
type JSONDiagnostic struct {
	Severity string       `json:"severity"` // "error" or "warning"
	Summary  string       `json:"summary"`
	Detail   string       `json:"detail,omitempty"`
	Range    *JSONRange   `json:"range,omitempty"`
	Snippet  *JSONSnippet `json:"snippet,omitempty"`
}

// JSONRange is a source range; lines and columns count from 1, bytes from 0.
type JSONRange struct {
	Filename string  `json:"filename"`
	Start    JSONPos `json:"start"`
	End      JSONPos `json:"end"`
}

// JSONPos is a position in a source file.
type JSONPos struct {
	Line   int `json:"line"`
	Column int `json:"column"`
	Byte   int `json:"byte"`
}

// JSONSnippet is the source around a diagnostic: Code holds the subject's
// lines starting at StartLine, and the highlight offsets are bytes in Code.
type JSONSnippet struct {
	Context              string `json:"context,omitempty"`
	Code                 string `json:"code"`
	StartLine            int    `json:"start_line"`
	HighlightStartOffset int    `json:"highlight_start_offset"`
	HighlightEndOffset   int    `json:"highlight_end_offset"`
}

// DiagnosticsJSON converts diagnostics for JSON output, with snippets from
// files where the source is known.
func DiagnosticsJSON(files map[string]*hcl.File, diags hcl.Diagnostics) []JSONDiagnostic {
	out := make([]JSONDiagnostic, 0, len(diags))
	for _, d := range diags {
		if d == nil {
			continue
		}
		jd := JSONDiagnostic{Severity: "error", Summary: d.Summary, Detail: d.Detail}
		if d.Severity == hcl.DiagWarning {
			jd.Severity = "warning"
		}
		if s := d.Subject; s != nil {
			jd.Range = &JSONRange{
				Filename: s.Filename,
				Start:    JSONPos{Line: s.Start.Line, Column: s.Start.Column, Byte: s.Start.Byte},
				End:      JSONPos{Line: s.End.Line, Column: s.End.Column, Byte: s.End.Byte},
			}
			if f := files[s.Filename]; f != nil && f.Bytes != nil {
				jd.Snippet = jsonSnippet(f, *s)
			}
		}
		out = append(out, jd)
	}
	return out
}

func jsonSnippet(f *hcl.File, s hcl.Range) *JSONSnippet {
	lines := splitLines(f.Bytes)
	if s.Start.Line < 1 || s.Start.Line > len(lines) {
		return nil
	}
	last := min(max(s.End.Line, s.Start.Line), len(lines))
	first := lines[s.Start.Line-1]
	code := string(f.Bytes[first.start:lines[last-1].end])
	start := min(max(s.Start.Byte-first.start, 0), len(code))
	end := min(max(s.End.Byte-first.start, start), len(code))
	return &JSONSnippet{
		Context:              blockContext(f, s.Start.Byte),
		Code:                 code,
		StartLine:            s.Start.Line,
		HighlightStartOffset: start,
		HighlightEndOffset:   end,
	}
}
