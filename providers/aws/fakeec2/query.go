package fakeec2

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// params is a decoded EC2 Query request body. EC2 flattens lists as
// Name.1, Name.2, … and structures as Name.Member, so a request is a flat
// map of dotted keys.
type params url.Values

func (p params) get(key string) string { return url.Values(p).Get(key) }

func (p params) has(key string) bool { _, ok := p[key]; return ok }

// list returns prefix.1, prefix.2, … up to the first gap.
func (p params) list(prefix string) []string {
	var out []string
	for i := 1; ; i++ {
		k := prefix + "." + strconv.Itoa(i)
		if !p.has(k) {
			return out
		}
		out = append(out, p.get(k))
	}
}

// count returns how many consecutive prefix.N.* groups exist.
func (p params) count(prefix string) int {
	n := 0
	for i := 1; ; i++ {
		pre := prefix + "." + strconv.Itoa(i) + "."
		found := false
		for k := range p {
			if strings.HasPrefix(k, pre) {
				found = true
				break
			}
		}
		if !found {
			return n
		}
		n++
	}
}

// filter is one Filter.N of a Describe call.
type filter struct {
	Name   string
	Values []string
}

func (p params) filters() []filter {
	var out []filter
	for i := 1; i <= p.count("Filter"); i++ {
		pre := "Filter." + strconv.Itoa(i)
		out = append(out, filter{Name: p.get(pre + ".Name"), Values: p.list(pre + ".Value")})
	}
	return out
}

// filtered keeps the items that pass every filter, as EC2 applies them: a
// filter passes when any value the item has for it matches any of the
// filter's values (wildcards allowed). values answers an item's values for
// a filter name, known false for a name the call does not support, which
// is an error (once an item reaches that filter).
func filtered[T any](items []T, filters []filter, values func(item T, name string) (have []string, known bool)) ([]T, *apiError) {
	var out []T
items:
	for _, it := range items {
		for _, f := range filters {
			have, known := values(it, f.Name)
			if !known {
				return nil, invalidFilter(f.Name)
			}
			if !anyMatch(have, f.Values) {
				continue items
			}
		}
		out = append(out, it)
	}
	return out, nil
}

// tagValues answers the tag filters on a resource's tags: tag:<key>, the
// tag's value (none when the tag is missing), and tag-key, every key.
func tagValues(tags map[string]string, name string) (have []string, known bool) {
	if key, ok := strings.CutPrefix(name, "tag:"); ok {
		if v, ok := tags[key]; ok {
			return []string{v}, true
		}
		return nil, true
	}
	if name == "tag-key" {
		return slices.Collect(maps.Keys(tags)), true
	}
	return nil, false
}

// invalidFilter is EC2's answer to a filter name the call does not support.
func invalidFilter(name string) *apiError {
	return &apiError{Code: "InvalidParameterValue", Message: fmt.Sprintf("The filter '%s' is invalid", name)}
}

// tags decodes TagSpecification.N of a launch call into resource type → tags.
func (p params) tagSpecs() []tagSpec {
	var out []tagSpec
	for i := 1; i <= p.count("TagSpecification"); i++ {
		pre := "TagSpecification." + strconv.Itoa(i)
		ts := tagSpec{ResourceType: p.get(pre + ".ResourceType"), Tags: map[string]string{}}
		for j := 1; ; j++ {
			tp := pre + ".Tag." + strconv.Itoa(j)
			if !p.has(tp + ".Key") {
				break
			}
			ts.Tags[p.get(tp+".Key")] = p.get(tp + ".Value")
		}
		out = append(out, ts)
	}
	return out
}

type tagSpec struct {
	ResourceType string
	Tags         map[string]string
}

// canonical renders the request without the fields that do not take part
// in EC2's idempotency comparison, so two calls can be compared.
func (p params) canonical() string {
	keys := make([]string, 0, len(p))
	for k := range p {
		switch k {
		case "Action", "Version", "ClientToken", "DryRun":
			continue
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strings.Join(p[k], ","))
		b.WriteByte('\n')
	}
	return b.String()
}

// intParam parses an optional integer parameter.
func (p params) intParam(key string) (int, bool, error) {
	v := p.get(key)
	if v == "" {
		return 0, false, nil
	}
	n, err := strconv.Atoi(v)
	return n, true, err
}
