package host_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/host"
)

// validIDRef is the contract of ValidID, written out byte by byte:
// 1 to 64 characters, each a lowercase ASCII letter or a digit. Ids name
// directories and appear in URLs, so nothing else may pass.
func validIDRef(id string) bool {
	if len(id) < 1 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

// FuzzValidID holds ValidID to its contract for any string, and checks that
// a valid id is a safe single path component and that NewID's ids are valid.
func FuzzValidID(f *testing.F) {
	for _, s := range []string{
		"", "a", "0", "abc123", "mdhsfn3xc2basi0awjjb", strings.Repeat("a", 64), strings.Repeat("a", 65),
		"A", "a-b", "a_b", "a.b", ".", "..", "../x", "a/b", "a\\b", "a b", " a", "a\n", "\x00", "a\x00",
		"é", "ａ", "\xff", "a\xffb", "\u0131", "K", "snap_1", "%2e%2e", strings.Repeat("é", 32),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		got, want := host.ValidID(id), validIDRef(id)
		if got != want {
			t.Fatalf("ValidID(%q) = %v, want %v", id, got, want)
		}
		if got && (filepath.Base(id) != id || id == "." || id == ".." || strings.ContainsAny(id, "/\\\x00")) {
			t.Fatalf("ValidID(%q) = true for something that is not one plain path component", id)
		}
		if n := host.NewID(); !host.ValidID(n) {
			t.Fatalf("NewID() = %q, which ValidID rejects", n)
		}
	})
}

// TestNewIDValid checks many of NewID's ids: all valid, none repeated.
func TestNewIDValid(t *testing.T) {
	seen := map[string]bool{}
	for range 10000 {
		id := host.NewID()
		if !host.ValidID(id) {
			t.Fatalf("NewID() = %q, which ValidID rejects", id)
		}
		if seen[id] {
			t.Fatalf("NewID() repeated %q", id)
		}
		seen[id] = true
	}
}
