package catalogtest

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// MetadataFilter is the body of every store's FuzzMetadataFilter: it checks
// ListSandboxes's metadata filter on c (a new, empty catalog, which it does
// not close) against a plain Go filter over the same sandboxes. The store
// must return every sandbox whose metadata holds all of the filter's pairs
// and no other, whatever the keys and values hold (quotes, %, _,
// backslashes, JSON syntax, dots, unicode), and give each sandbox's
// metadata back as stored.
//
// An input is a list of strings separated by NUL bytes, which the
// catalog's contract rules out of every string (so a NUL never reaches the
// store); inputs with invalid UTF-8, also ruled out, are skipped.
func MetadataFilter(f *testing.F, c catalog.Catalog) {
	for _, words := range [][]string{
		{"env", "prod", "team", "a"},
		{"", "", "k", ""},
		{"a.b", "x", "$.a", "y", "a[0]", "z", "a->b", "w"},
		{`"`, `'`, `\`, `\\`, `\"`, `''`},
		{"%", "_", "a%", "a_b", "%_%", `\%`},
		{`{"a":1}`, `[1,2]`, "null", "true", "1", "1.0", "{}", "[]"},
		{"<>&", "\u2028\u2029", "\t\n\r", "\x01\x1f", "\x7f", "é"},
		{"ключ", "значение", "键", "值", "🐼", "e\u0301", "\ufeff", "\U0010ffff"},
		{"a", "b", "A", "B", "a ", " a"},
		{"k", "v", "k", "w", "k", ""},
	} {
		f.Add(strings.Join(words, "\x00"))
	}
	ctx := f.Context()
	created := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := c.CreateKey(ctx, catalog.Key{ID: "key_fuzz", Hash: "hash_fuzz", CreatedAt: created}); err != nil {
		f.Fatal(err)
	}
	// The sandboxes are created once; each input rewrites their metadata.
	const nSandboxes = 6
	ids := make([]string, nSandboxes)
	for i := range ids {
		ids[i] = fmt.Sprintf("sb%d", i)
		sb := newSandbox(ids[i], "key_fuzz")
		sb.CreatedAt = created.Add(time.Duration(i) * time.Second)
		if err := c.ReserveSandbox(ctx, sb, catalog.Limits{}); err != nil {
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
		// Sandbox i holds pair j, or the pair's key with its value plus a
		// character, or with the key as its value, or not the key at
		// all, depending on i and j: matches and near misses.
		mds := make([]map[string]string, nSandboxes)
		for i := range mds {
			md := map[string]string{}
			for j, p := range pairs {
				switch (i*7 + j*3 + len(p[0])) % 5 {
				case 0, 1:
					md[p[0]] = p[1]
				case 2:
					md[p[0]] = p[1] + "x"
				case 3:
					md[p[0]] = p[0]
				}
			}
			mds[i] = md
			if _, err := c.UpdateSandbox(t.Context(), ids[i], func(sb *catalog.Sandbox) error {
				sb.Metadata = md
				return nil
			}); err != nil {
				t.Fatalf("UpdateSandbox %s with metadata %q: %v", ids[i], md, err)
			}
		}
		// Filters: every pair at once, each pair alone, and each
		// sandbox's whole metadata.
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
			var want []string
			for i, md := range mds {
				if holds(md, filter) {
					want = append(want, ids[i])
				}
			}
			for _, keyID := range []string{"", "key_fuzz"} {
				got, err := c.ListSandboxes(t.Context(), catalog.SandboxFilter{KeyID: keyID, Metadata: filter})
				if err != nil {
					t.Fatalf("ListSandboxes(metadata %q): %v", filter, err)
				}
				var gotIDs []string
				for _, sb := range got {
					gotIDs = append(gotIDs, sb.ID)
					if i := slices.Index(ids, sb.ID); i < 0 || !maps.Equal(sb.Metadata, mds[i]) {
						t.Fatalf("ListSandboxes(metadata %q) returned %s with metadata %q; stored: %q", filter, sb.ID, sb.Metadata, mds)
					}
				}
				if !slices.Equal(gotIDs, want) {
					t.Fatalf("ListSandboxes(metadata %q) = %v, want %v; metadata stored: %q", filter, gotIDs, want, mds)
				}
			}
		}
	})
}

// holds reports whether md has every pair of filter.
func holds(md, filter map[string]string) bool {
	for k, v := range filter {
		if w, ok := md[k]; !ok || w != v {
			return false
		}
	}
	return true
}
