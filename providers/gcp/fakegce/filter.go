package fakegce

import (
	"fmt"
	"strconv"
	"strings"
)

// filter is a parsed Compute Engine list filter. The subset understood is
// the one documented for the v1 list methods:
//
//	labels.env = "prod"
//	(status = RUNNING) (labels.fleet = "a")      implicit AND between terms
//	a = "x" AND (b != "y" OR c:*)
//	NOT a = "x"
//
// Operators: = != > < >= <= and ':' (has: substring, or presence with *).
// AND binds tighter than OR. Anything else is rejected with a 400, as the
// real API does for a filter it cannot parse.
type filter interface {
	match(doc map[string]any) bool
}

type andFilter []filter
type orFilter []filter
type notFilter struct{ f filter }
type cmpFilter struct {
	path  []string
	op    string
	value string
}

func (a andFilter) match(doc map[string]any) bool {
	for _, f := range a {
		if !f.match(doc) {
			return false
		}
	}
	return true
}

func (o orFilter) match(doc map[string]any) bool {
	for _, f := range o {
		if f.match(doc) {
			return true
		}
	}
	return false
}

func (n notFilter) match(doc map[string]any) bool { return !n.f.match(doc) }

func (c cmpFilter) match(doc map[string]any) bool {
	vals := lookup(doc, c.path)
	if c.op == "!=" {
		// A missing field is "not equal" to anything.
		for _, v := range vals {
			if compare(v, "=", c.value) {
				return false
			}
		}
		return true
	}
	for _, v := range vals {
		if compare(v, c.op, c.value) {
			return true
		}
	}
	return false
}

// lookup returns the scalar values at a dotted path; arrays fan out, so a
// term matches when any element does.
func lookup(v any, path []string) []string {
	if len(path) == 0 {
		switch x := v.(type) {
		case nil:
			return nil
		case string:
			return []string{x}
		case bool:
			return []string{strconv.FormatBool(x)}
		case float64:
			return []string{strconv.FormatFloat(x, 'f', -1, 64)}
		case []any:
			var out []string
			for _, e := range x {
				out = append(out, lookup(e, nil)...)
			}
			return out
		default: // objects are not scalars
			return nil
		}
	}
	switch x := v.(type) {
	case map[string]any:
		return lookup(x[path[0]], path[1:])
	case []any:
		var out []string
		for _, e := range x {
			out = append(out, lookup(e, path)...)
		}
		return out
	}
	return nil
}

func compare(have, op, want string) bool {
	switch op {
	case "=":
		return strings.EqualFold(have, want) && (have == want || isBool(want))
	case ":":
		if want == "*" {
			return true
		}
		return strings.Contains(have, want)
	}
	hf, herr := strconv.ParseFloat(have, 64)
	wf, werr := strconv.ParseFloat(want, 64)
	var c int
	if herr == nil && werr == nil {
		switch {
		case hf < wf:
			c = -1
		case hf > wf:
			c = 1
		}
	} else {
		c = strings.Compare(have, want)
	}
	switch op {
	case ">":
		return c > 0
	case "<":
		return c < 0
	case ">=":
		return c >= 0
	case "<=":
		return c <= 0
	}
	return false
}

func isBool(s string) bool { return strings.EqualFold(s, "true") || strings.EqualFold(s, "false") }

// parseFilter parses s; an empty filter matches everything.
func parseFilter(s string) (filter, error) {
	toks, err := tokenize(s)
	if err != nil {
		return nil, err
	}
	if len(toks) == 0 {
		return andFilter(nil), nil
	}
	p := &filterParser{toks: toks}
	f, err := p.or()
	if err != nil {
		return nil, err
	}
	if p.pos != len(p.toks) {
		return nil, fmt.Errorf("unexpected %q at the end of the filter", p.toks[p.pos].text)
	}
	return f, nil
}

type token struct {
	text   string
	quoted bool
}

func tokenize(s string) ([]token, error) {
	var out []token
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			i++
		case c == '(' || c == ')':
			out = append(out, token{text: string(c)})
			i++
		case c == '"' || c == '\'':
			j := i + 1
			var b strings.Builder
			for ; j < len(s) && s[j] != c; j++ {
				if s[j] == '\\' && j+1 < len(s) {
					j++
				}
				b.WriteByte(s[j])
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated string in filter")
			}
			out = append(out, token{text: b.String(), quoted: true})
			i = j + 1
		case strings.ContainsRune("=!<>:", rune(c)):
			op := string(c)
			if i+1 < len(s) && s[i+1] == '=' && c != '=' && c != ':' {
				op += "="
			}
			if op == "!" {
				return nil, fmt.Errorf("bad operator '!' in filter")
			}
			out = append(out, token{text: op})
			i += len(op)
		default:
			j := i
			for j < len(s) && !strings.ContainsRune(" \t\n()=!<>:\"'", rune(s[j])) {
				j++
			}
			out = append(out, token{text: s[i:j]})
			i = j
		}
	}
	return out, nil
}

type filterParser struct {
	toks []token
	pos  int
}

func (p *filterParser) peek() (token, bool) {
	if p.pos < len(p.toks) {
		return p.toks[p.pos], true
	}
	return token{}, false
}

func (p *filterParser) keyword(word string) bool {
	t, ok := p.peek()
	if ok && !t.quoted && t.text == word {
		p.pos++
		return true
	}
	return false
}

func (p *filterParser) or() (filter, error) {
	return p.chain(p.and, func() bool { return p.keyword("OR") }, func(fs []filter) filter { return orFilter(fs) })
}

func (p *filterParser) and() (filter, error) {
	more := func() bool {
		t, ok := p.peek()
		if !ok || t.text == ")" || (!t.quoted && t.text == "OR") {
			return false
		}
		p.keyword("AND") // explicit or implicit
		return true
	}
	return p.chain(p.unary, more, func(fs []filter) filter { return andFilter(fs) })
}

// chain parses one term, then another for as long as more says one
// follows, and joins them; a lone term stands for itself.
func (p *filterParser) chain(term func() (filter, error), more func() bool, join func([]filter) filter) (filter, error) {
	var fs []filter
	for {
		f, err := term()
		if err != nil {
			return nil, err
		}
		fs = append(fs, f)
		if !more() {
			break
		}
	}
	if len(fs) == 1 {
		return fs[0], nil
	}
	return join(fs), nil
}

func (p *filterParser) unary() (filter, error) {
	if p.keyword("NOT") {
		f, err := p.unary()
		if err != nil {
			return nil, err
		}
		return notFilter{f}, nil
	}
	t, ok := p.peek()
	if !ok {
		return nil, fmt.Errorf("filter ends where a term was expected")
	}
	if !t.quoted && t.text == "(" {
		p.pos++
		f, err := p.or()
		if err != nil {
			return nil, err
		}
		if t, ok := p.peek(); !ok || t.text != ")" {
			return nil, fmt.Errorf("missing ')' in filter")
		}
		p.pos++
		return f, nil
	}
	return p.comparison()
}

func (p *filterParser) comparison() (filter, error) {
	if p.pos+2 >= len(p.toks) {
		return nil, fmt.Errorf("incomplete comparison in filter")
	}
	field, op, val := p.toks[p.pos], p.toks[p.pos+1], p.toks[p.pos+2]
	if field.quoted || field.text == "" || field.text == "(" || field.text == ")" {
		return nil, fmt.Errorf("expected a field name, got %q", field.text)
	}
	switch op.text {
	case "=", "!=", ">", "<", ">=", "<=", ":":
	default:
		return nil, fmt.Errorf("expected a comparison operator after %q, got %q", field.text, op.text)
	}
	if op.quoted || (!val.quoted && (val.text == "(" || val.text == ")")) {
		return nil, fmt.Errorf("expected a value after %s %s", field.text, op.text)
	}
	p.pos += 3
	return cmpFilter{path: strings.Split(field.text, "."), op: op.text, value: val.text}, nil
}
