package spec

import (
	"fmt"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
)

// Checkpoint is training.checkpoint: the directory the workers write
// checkpoints into on each node and the object store the agent keeps the
// completed ones in, so a job that moves to new nodes (another zone,
// region or cloud) restores the latest one before its workers start
// (docs/checkpoints.md).
type Checkpoint struct {
	// Dir is where the workers write `step-N/` directories, each complete
	// once it holds a COMPLETE file. Absolute, or relative to the
	// workers' workdir. Workers get it as FLEETD_CHECKPOINT_DIR.
	Dir string `json:"dir"`
	// Store is the object store prefix: s3://bucket/prefix,
	// gs://bucket/prefix or file:///path. Empty: checkpoints stay on the
	// node (the agent still prunes beyond Keep).
	Store string `json:"store,omitempty"`
	// Keep is how many complete checkpoints the store (and the dir) keep.
	Keep int `json:"keep"`
	// Access is how nodes reach the store: "signed" (the daemon hands
	// out short-lived signed URLs for exactly the objects a node reads or
	// writes; nodes need no cloud credentials) or "node" (the node's own
	// credentials, e.g. an instance role, through gocloud.dev/blob).
	Access string `json:"access,omitempty"`
	// SizeGB is the expected checkpoint size before one was measured; the
	// placement prices a job move with it (0: unknown).
	SizeGB float64 `json:"size_gb,omitempty"`
}

// Checkpoint access modes.
const (
	CheckpointAccessSigned = "signed"
	CheckpointAccessNode   = "node"
)

// DefaultCheckpointKeep is training.checkpoint.keep's default.
const DefaultCheckpointKeep = 3

var checkpointSchema = &hcl.BodySchema{
	Attributes: []hcl.AttributeSchema{
		{Name: "dir"},
		{Name: "store"},
		{Name: "keep"},
		{Name: "access"},
		{Name: "size_gb"},
	},
}

// storeParams are the query parameters a store URL may carry, per scheme;
// they are handed to gocloud.dev's URL openers (an S3-compatible endpoint,
// a region...).
var storeParams = map[string][]string{
	"s3":   {"region", "endpoint", "use_path_style", "disable_https", "profile", "anonymous", "ssetype", "kmskeyid", "dualstack", "fips"},
	"gs":   {"access_id", "private_key_path", "anonymous"},
	"file": {},
}

// StoreURL is a parsed checkpoint store: scheme, bucket, key prefix
// (without leading or trailing slash) and the opener's query parameters.
type StoreURL struct {
	Scheme, Bucket, Prefix string
	Query                  url.Values
}

// ParseStoreURL parses and checks a checkpoint store URL.
func ParseStoreURL(s string) (StoreURL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return StoreURL{}, fmt.Errorf("store %q is not a URL: %v", s, err)
	}
	allowed, ok := storeParams[u.Scheme]
	if !ok {
		return StoreURL{}, fmt.Errorf("store %q must start with s3://, gs:// or file:///", s)
	}
	st := StoreURL{Scheme: u.Scheme, Query: u.Query()}
	for k := range st.Query {
		if !slices.Contains(allowed, k) {
			if len(allowed) == 0 {
				return StoreURL{}, fmt.Errorf("store %q: a %s:// store takes no parameters, got %q", s, u.Scheme, k)
			}
			if sug := suggest(k, allowed); sug != "" {
				return StoreURL{}, fmt.Errorf("store %q: unknown parameter %q for %s://; did you mean %q?", s, k, u.Scheme, sug)
			}
			return StoreURL{}, fmt.Errorf("store %q: unknown parameter %q for %s:// (known: %s)", s, k, u.Scheme, strings.Join(allowed, ", "))
		}
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" {
			return StoreURL{}, fmt.Errorf("store %q: a file URL has an absolute path and no host, e.g. file:///var/ckpt (three slashes)", s)
		}
		if !path.IsAbs(u.Path) || path.Clean(u.Path) == "/" {
			return StoreURL{}, fmt.Errorf("store %q: a file URL needs an absolute directory other than /, e.g. file:///var/ckpt", s)
		}
		st.Bucket = path.Clean(u.Path)
	default:
		if u.Host == "" {
			return StoreURL{}, fmt.Errorf("store %q names no bucket: write %s://BUCKET/PREFIX", s, u.Scheme)
		}
		st.Bucket = u.Host
		st.Prefix = strings.Trim(path.Clean("/"+u.Path), "/")
		if strings.Contains(u.Path, "//") || strings.Contains(u.Path, "/../") || strings.HasSuffix(u.Path, "/..") {
			return StoreURL{}, fmt.Errorf("store %q: the prefix must not contain empty or .. segments", s)
		}
	}
	return st, nil
}

// OpenerURL is the URL gocloud.dev/blob opens the bucket with (the key
// prefix is applied separately).
func (s StoreURL) OpenerURL() string {
	u := url.URL{Scheme: s.Scheme, Host: s.Bucket, RawQuery: s.Query.Encode()}
	if s.Scheme == "file" {
		u.Host, u.Path = "", s.Bucket
	}
	return u.String()
}

// Cloud is the cloud a store lives in: "aws" (s3), "gcp" (gs) or "" (file).
func (s StoreURL) Cloud() string {
	switch s.Scheme {
	case "s3":
		return "aws"
	case "gs":
		return "gcp"
	}
	return ""
}

// localCheckpointPath is the local directory a checkpoint_uri names: an
// absolute path or a file:// URL; "" for an object store.
func localCheckpointPath(uri string) string {
	switch {
	case strings.HasPrefix(uri, "/"):
		return uri
	case strings.HasPrefix(uri, "file://"):
		return strings.TrimPrefix(uri, "file://")
	}
	return ""
}

func (p *parser) decodeCheckpoint(blocks hcl.Blocks, t *Training) {
	b := p.singleBlock(blocks, "checkpoint")
	if b == nil {
		return
	}
	c := &Checkpoint{Keep: DefaultCheckpointKeep}
	content, diags := b.Body.Content(checkpointSchema)
	p.diags = append(p.diags, diags...)
	a := content.Attributes

	if da := a["dir"]; da != nil {
		if p.stringAttr(da, &c.Dir) {
			switch d := strings.TrimSpace(c.Dir); {
			case d == "":
				p.attrError(da, "Empty checkpoint dir", `dir must name the directory the workers write checkpoints into, e.g. "/mnt/ckpt".`)
			case strings.Contains(c.Dir, "://"):
				p.attrError(da, "Invalid checkpoint dir",
					fmt.Sprintf("dir is a directory on the node, not a URL, got %q; put the object store in store = %q.", c.Dir, c.Dir))
			case path.Clean(c.Dir) == "/":
				p.attrError(da, "Invalid checkpoint dir", `dir must not be "/": the agent restores and prunes step-N directories in it.`)
			}
		}
	} else if local := localCheckpointPath(t.CheckpointURI); local != "" {
		c.Dir = local // checkpoint_uri names the local directory
	} else {
		p.errorAt(b.DefRange, "Missing checkpoint dir",
			`A checkpoint block needs dir, the directory the workers write step-N/ checkpoints into on each node, e.g. dir = "/mnt/ckpt".`)
	}

	var storeA = a["store"]
	var st StoreURL
	storeOK := false
	if storeA != nil {
		if p.stringAttr(storeA, &c.Store) {
			var err error
			if st, err = ParseStoreURL(c.Store); err != nil {
				msg := err.Error()
				if !strings.HasSuffix(msg, "?") {
					msg += "."
				}
				p.attrError(storeA, "Invalid checkpoint store", msg)
			} else {
				storeOK = true
			}
		}
	} else if t.CheckpointURI != "" && localCheckpointPath(t.CheckpointURI) == "" {
		// An object-store checkpoint_uri becomes the store.
		if s, err := ParseStoreURL(t.CheckpointURI); err == nil {
			c.Store, st, storeOK = t.CheckpointURI, s, true
		}
	}

	if ka := a["keep"]; p.intAttr(ka, &c.Keep) && c.Keep < 1 {
		p.attrError(ka, "Invalid keep", fmt.Sprintf("keep must be at least 1 (the latest checkpoint), got %d.", c.Keep))
		c.Keep = DefaultCheckpointKeep
	}
	if sa := a["size_gb"]; p.floatAttr(sa, &c.SizeGB) && c.SizeGB < 0 {
		p.attrError(sa, "Invalid size_gb", fmt.Sprintf("size_gb must be 0 or more, got %g.", c.SizeGB))
		c.SizeGB = 0
	}
	accA := a["access"]
	if accA != nil {
		p.enumAttr(accA, []string{CheckpointAccessSigned, CheckpointAccessNode}, &c.Access)
	}
	if storeOK {
		switch {
		case st.Scheme == "file" && c.Access == CheckpointAccessSigned:
			p.attrError(accA, "Signed URLs for a file store",
				`A file:// store is a directory the nodes reach themselves (a shared mount), so nothing can be signed for it: use access = "node", or an s3:// or gs:// store.`)
		case c.Access == "" && st.Scheme == "file":
			c.Access = CheckpointAccessNode
		case c.Access == "":
			c.Access = CheckpointAccessSigned
		}
	} else if accA != nil && storeA == nil {
		p.attrWarning(accA, "access has no effect", "access says how nodes reach the store, and this checkpoint block has no store.")
	}
	t.Checkpoint = c
}

// egressSideRE is one side of an egress_per_gb key: "*", "cloud" or
// "cloud:region".
var egressSideRE = regexp.MustCompile(`^(\*|[a-z][a-z0-9-]*(:[a-z0-9-]+)?)$`)

// ParseEgressKey splits "FROM->TO".
func ParseEgressKey(k string) (from, to string, ok bool) {
	from, to, found := strings.Cut(k, "->")
	from, to = strings.TrimSpace(from), strings.TrimSpace(to)
	if !found || !egressSideRE.MatchString(from) || !egressSideRE.MatchString(to) {
		return "", "", false
	}
	return from, to, true
}

// decodeEgress reads placement.egress_per_gb: { "aws->gcp" = 0.09,
// "aws:us-east-1->aws:us-west-2" = 0.02, "*->*" = 0 }.
func (p *parser) decodeEgress(a *hcl.Attribute, pl *Placement) {
	if a == nil {
		return
	}
	v, ok := p.eval(a, cty.Map(cty.Number))
	if !ok {
		return
	}
	out := map[string]float64{}
	for it := v.ElementIterator(); it.Next(); {
		k, ev := it.Element()
		key := k.AsString()
		subject := a.Expr.Range()
		if r, ok := mapKeyRange(a.Expr, key); ok {
			subject = r
		}
		if _, _, ok := ParseEgressKey(key); !ok {
			p.diags = append(p.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid egress_per_gb key",
				Detail:  fmt.Sprintf("%q must read FROM->TO, each side a cloud (\"aws\"), a cloud and region (\"gcp:us-central1\") or \"*\", e.g. \"aws->gcp\".", key),
				Subject: subject.Ptr(), Context: a.Range.Ptr()})
			continue
		}
		if ev.IsNull() {
			continue
		}
		f, _ := ev.AsBigFloat().Float64()
		if f < 0 {
			p.diags = append(p.diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: "Invalid egress price",
				Detail: fmt.Sprintf("egress_per_gb[%q] must be 0 or more $/GB, got %g.", key, f), Subject: subject.Ptr(), Context: a.Range.Ptr()})
			continue
		}
		out[key] = f
	}
	if len(out) > 0 {
		pl.EgressPerGB = out
	}
}
