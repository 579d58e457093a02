// Package agentwire is what the daemon and the on-VM agent agree on
// without importing each other (agent/ must never import fleet/, and the
// daemon must not link the agent's supervisor): the supported version
// window between them. A leaf package: it imports only the standard
// library.
package agentwire

import (
	"fmt"
	"regexp"
	"strconv"
)

// The supported window: a daemon accepts agents of its own major version
// and of its own minor release or the one before (daemon v1.4.x: agents
// v1.3.x and v1.4.x). One minor back is what a rolling daemon upgrade needs:
// nodes that booted before the upgrade keep running the agent they
// downloaded, and each node replaced afterwards downloads the daemon's
// current one. Patch releases never matter.
const WindowMinors = 1

// Skew is how an agent's version relates to the daemon's.
type Skew int

const (
	// InWindow: the same release line, or one minor back.
	InWindow Skew = iota
	// Unknown: one side is not a release version ("dev", a bare commit,
	// an agent too old to say): accepted with a warning, since a build
	// from a checkout is the normal case during development.
	Unknown
	// TooOld: the agent is more than WindowMinors minors behind, or of an
	// older major version.
	TooOld
	// TooNew: the agent is newer than the daemon (minor or major).
	TooNew
)

func (s Skew) String() string {
	return [...]string{"in-window", "unknown", "too-old", "too-new"}[s]
}

// Version is a parsed release version.
type Version struct{ Major, Minor, Patch int }

func (v Version) String() string { return fmt.Sprintf("v%d.%d.%d", v.Major, v.Minor, v.Patch) }

// releaseRE matches what `git describe --tags` gives for a release tag,
// with or without the commits-since suffix and -dirty: v1.2.3,
// v1.2.3-rc.1, v1.2.3-14-gdeadbee-dirty.
var releaseRE = regexp.MustCompile(`^v?(\d+)\.(\d+)\.(\d+)(?:[-+].*)?$`)

// ParseVersion parses a release version; ok is false for anything else.
func ParseVersion(s string) (Version, bool) {
	m := releaseRE.FindStringSubmatch(s)
	if m == nil {
		return Version{}, false
	}
	var v Version
	var err error
	for i, p := range []*int{&v.Major, &v.Minor, &v.Patch} {
		if *p, err = strconv.Atoi(m[i+1]); err != nil {
			return Version{}, false
		}
	}
	return v, true
}

// CheckSkew places agent relative to daemon. Equal strings are always in
// the window, release versions or not.
func CheckSkew(daemon, agent string) Skew {
	if daemon == agent && agent != "" {
		return InWindow
	}
	d, ok1 := ParseVersion(daemon)
	a, ok2 := ParseVersion(agent)
	switch {
	case !ok1 || !ok2:
		return Unknown
	case a.Major < d.Major || a.Major == d.Major && a.Minor < d.Minor-WindowMinors:
		return TooOld
	case a.Major > d.Major || a.Minor > d.Minor:
		return TooNew
	}
	return InWindow
}

// Window describes the agents a daemon of version daemon accepts, for
// messages: "v1.3.x–v1.4.x".
func Window(daemon string) string {
	d, ok := ParseVersion(daemon)
	if !ok {
		return "any (the daemon " + strconv.Quote(daemon) + " is not a release version)"
	}
	lo := max(d.Minor-WindowMinors, 0)
	return fmt.Sprintf("v%d.%d.x–v%d.%d.x", d.Major, lo, d.Major, d.Minor)
}
