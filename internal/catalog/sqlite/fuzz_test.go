package sqlite_test

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pandastack/pandastack/internal/catalog"
	"github.com/pandastack/pandastack/internal/catalog/sqlite"
)

// FuzzMetadataFilter checks ListSandboxes's metadata filter against a
// plain Go filter over the same sandboxes: it must return every sandbox
// whose metadata holds all the filter's pairs and no other, whatever the
// keys and values hold (quotes, %, _, backslashes, JSON syntax, dots,
// unicode). The input is a list of strings separated by NUL bytes, which
// the catalog's contract rules out of every string (so a NUL never reaches
// it); invalid UTF-8, also ruled out, is skipped.
func FuzzMetadataFilter(f *testing.F) {
	for _, words := range [][]string{
		{"env", "prod", "team", "a"},
		{"", "", "k", ""},
		{"a.b", "x", "$.a", "y", "a[0]", "z"},
		{`"`, `'`, `\`, `\\`, `\"`, `''`},
		{"%", "_", "a%", "a_b", "%_%", `\%`},
		{`{"a":1}`, `[1,2]`, "null", "true", "1", "1.0"},
		{"<>&", "\u2028\u2029", "\t\n\r", "\x01\x1f", "\x7f", "é"},
		{"ключ", "значение", "键", "值", "🐼", "e\u0301"},
		{"a", "b", "A", "B", "a ", " a"},
		{"k", "v", "k", "w", "k", ""},
	} {
		f.Add(strings.Join(words, "\x00"))
	}
	cat, err := sqlite.Open(f.Context(), filepath.Join(f.TempDir(), "catalog.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { cat.Close() })
	created := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := cat.CreateKey(f.Context(), catalog.Key{ID: "key_fuzz", Hash: "h", CreatedAt: created}); err != nil {
		f.Fatal(err)
	}
	// The sandboxes are created once; each input rewrites their metadata.
	const nSandboxes = 6
	ids := make([]string, nSandboxes)
	for i := range ids {
		ids[i] = fmt.Sprintf("sb%d", i)
		sb := catalog.Sandbox{ID: ids[i], KeyID: "key_fuzz", Template: "base", HostID: "h", State: catalog.StateRunning,
			MemoryMiB: 256, VCPUs: 1, OnExpire: "kill", CreatedAt: created.Add(time.Duration(i) * time.Second)}
		if err := cat.ReserveSandbox(f.Context(), sb, 0, 0); err != nil {
			f.Fatal(err)
		}
	}

	f.Fuzz(func(t *testing.T, input string) {
		if !utf8.ValidString(input) {
			return
		}
		words := strings.Split(input, "\x00")
		if len(words) > 16 {
			words = words[:16]
		}
		if len(words)%2 == 1 {
			words = append(words, "")
		}
		var pairs [][2]string
		for i := 0; i < len(words); i += 2 {
			pairs = append(pairs, [2]string{words[i], words[i+1]})
		}
		// Sandbox i holds pair j when bit j of a mixing of i and j is set,
		// with its value, its value with something appended, or the
		// key as the value: matches and near misses.
		mds := make([]map[string]string, nSandboxes)
		for i := range mds {
			md := map[string]string{}
			for j, p := range pairs {
				switch (i*7 + j*3 + len(p[0])) % 4 {
				case 0, 1:
					md[p[0]] = p[1]
				case 2:
					md[p[0]] = p[1] + "x"
				case 3:
					md[p[0]] = p[0]
				}
			}
			mds[i] = md
			if _, err := cat.UpdateSandbox(t.Context(), ids[i], func(sb *catalog.Sandbox) error {
				sb.Metadata = md
				return nil
			}); err != nil {
				t.Fatalf("UpdateSandbox %s with metadata %q: %v", ids[i], md, err)
			}
		}
		// Filters: every pair, each pair alone, and each sandbox's whole
		// metadata.
		filters := []map[string]string{{}}
		for _, p := range pairs {
			filters[0][p[0]] = p[1]
			filters = append(filters, map[string]string{p[0]: p[1]})
		}
		filters = append(filters, mds...)
		for _, filter := range filters {
			if len(filter) == 0 {
				continue
			}
			for _, keyID := range []string{"", "key_fuzz"} {
				got, err := cat.ListSandboxes(t.Context(), catalog.SandboxFilter{KeyID: keyID, Metadata: filter})
				if err != nil {
					t.Fatalf("ListSandboxes(metadata %q): %v", filter, err)
				}
				var gotIDs, wantIDs []string
				for _, sb := range got {
					gotIDs = append(gotIDs, sb.ID)
				}
				for i, md := range mds {
					if contains(md, filter) {
						wantIDs = append(wantIDs, ids[i])
					}
				}
				if !slices.Equal(gotIDs, wantIDs) {
					t.Fatalf("ListSandboxes(metadata %q) = %v, want %v; metadata: %q", filter, gotIDs, wantIDs, mds)
				}
				for _, sb := range got {
					if i := slices.Index(ids, sb.ID); !maps.Equal(sb.Metadata, mds[i]) {
						t.Fatalf("sandbox %s came back with metadata %q, stored %q", sb.ID, sb.Metadata, mds[i])
					}
				}
			}
		}
	})
}

// contains reports whether md holds every pair of filter.
func contains(md, filter map[string]string) bool {
	for k, v := range filter {
		if w, ok := md[k]; !ok || w != v {
			return false
		}
	}
	return true
}
