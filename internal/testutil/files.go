package testutil

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// CheckModes fails tb unless dir has permissions dirMode and each named
// file in it fileMode: what a daemon's data directory must show, since it
// holds tokens and keys.
func CheckModes(tb testing.TB, dir string, dirMode, fileMode fs.FileMode, names ...string) {
	tb.Helper()
	fi, err := os.Stat(dir)
	if err != nil {
		tb.Fatal(err)
	}
	if m := fi.Mode().Perm(); m != dirMode {
		tb.Errorf("data dir mode %o, want %o", m, dirMode)
	}
	for _, name := range names {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			tb.Fatal(err)
		}
		if m := fi.Mode().Perm(); m != fileMode {
			tb.Errorf("%s mode %o, want %o", name, m, fileMode)
		}
	}
}

// ReadJSON decodes the JSON file at path into a T, failing tb when the file
// cannot be read or decoded.
func ReadJSON[T any](tb testing.TB, path string) T {
	tb.Helper()
	var v T
	b, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, &v)
	}
	if err != nil {
		tb.Fatalf("%s: %v", filepath.Base(path), err)
	}
	return v
}
