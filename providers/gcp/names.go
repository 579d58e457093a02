package gcp

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// GCE label rules: keys start with a lowercase letter; keys and values use
// only lowercase letters, digits, '_' and '-', at most 63 characters.
const maxLabelLen = 63

// labelKey and labelValue map a tag onto a valid label deterministically:
// a valid tag is kept as is; anything else is lowercased, has invalid
// characters replaced by '_', and gets a hash of the original appended so
// distinct tags stay distinct. The exact tags are kept in instance
// metadata (metaTags); labels only serve the server-side List filter.
func labelKey(k string) string { return sanitizeLabel(k, true) }

func labelValue(v string) string { return sanitizeLabel(v, false) }

func sanitizeLabel(s string, key bool) string {
	var b strings.Builder
	changed := false
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r >= 'A' && r <= 'Z':
			b.WriteRune(r - 'A' + 'a')
			changed = true
		default:
			b.WriteByte('_')
			changed = true
		}
	}
	out := b.String()
	if key && (out == "" || out[0] < 'a' || out[0] > 'z') {
		out = "k" + out
		changed = true
	}
	if !changed && len(out) <= maxLabelLen {
		return out
	}
	suffix := "-" + shortHash(s, 8)
	if len(out) > maxLabelLen-len(suffix) {
		out = out[:maxLabelLen-len(suffix)]
	}
	return out + suffix
}

func shortHash(s string, n int) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])[:n]
}

// instanceName derives a valid RFC 1035 instance name (at most 63
// characters) from the node id, made unique per (fleet, idempotency token)
// by a hash suffix. Instance names are unique per zone, so the name is
// itself an idempotency guard: a retried insert of the same name fails
// with alreadyExists and the provider adopts the existing instance.
func instanceName(node, fleet, token string, index, count int) string {
	var b strings.Builder
	for _, r := range strings.ToLower(node) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	base := strings.Trim(b.String(), "-")
	for strings.Contains(base, "--") {
		base = strings.ReplaceAll(base, "--", "-")
	}
	if base == "" {
		base = "fleetd"
	}
	if base[0] < 'a' || base[0] > 'z' {
		base = "n-" + base
	}
	suffix := "-" + shortHash(fleet+"\x00"+token, 8)
	if count > 1 {
		suffix += "-" + strconv.Itoa(index)
	}
	if len(base) > maxLabelLen-len(suffix) {
		base = strings.TrimRight(base[:maxLabelLen-len(suffix)], "-")
	}
	return base + suffix
}

// requestID derives the UUID GCE requires as requestId from the launch's
// identity, so a retried insert is answered with the original operation
// instead of creating a second instance.
func requestID(parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	h[6] = (h[6] & 0x0f) | 0x50 // version 5 (name-based, SHA)
	h[8] = (h[8] & 0x3f) | 0x80 // RFC 4122 variant
	x := hex.EncodeToString(h[:16])
	return fmt.Sprintf("%s-%s-%s-%s-%s", x[0:8], x[8:12], x[12:16], x[16:20], x[20:32])
}

// InstanceID is the provider's instance id: "ZONE/NAME". GCE addresses an
// instance by zone and name, so the id carries both.
func InstanceID(zone, name string) string { return zone + "/" + name }

// ParseInstanceID splits an InstanceID; ok is false when id is not one.
func ParseInstanceID(id string) (zone, name string, ok bool) {
	zone, name, ok = strings.Cut(id, "/")
	if !ok || !zoneRE.MatchString(zone) || !nameRE.MatchString(name) {
		return "", "", false
	}
	return zone, name, true
}

// GPUModel turns a GCE accelerator type into the short model name fleet
// specs use in gpu_types ("nvidia-tesla-a100" → "A100", "nvidia-h100-80gb"
// → "H100", "nvidia-l4" → "L4").
func GPUModel(acceleratorType string) string {
	var keep []string
	for _, p := range strings.Split(strings.ToLower(acceleratorType), "-") {
		switch {
		case p == "nvidia" || p == "tesla" || p == "mega" || p == "vws" || p == "":
		case strings.HasSuffix(p, "gb") && isDigits(strings.TrimSuffix(p, "gb")):
		default:
			keep = append(keep, p)
		}
	}
	if len(keep) == 0 {
		return strings.ToUpper(acceleratorType)
	}
	return strings.ToUpper(strings.Join(keep, "-"))
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
