package opencatalog_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/opencatalog"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/postgres"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/sqlite"
	"github.com/pandastack/pandastack/internal/testing/pgtest"
)

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	pg := pgtest.NewDatabase(t, pgtest.Start(t))
	tests := []struct {
		name     string
		url      string
		wantType any
		wantFile string // for SQLite, the file that must exist afterwards
	}{
		{"sqlite url", "sqlite://" + filepath.Join(dir, "a.db"), &sqlite.Catalog{}, filepath.Join(dir, "a.db")},
		{"sqlite opaque", "sqlite:" + filepath.Join(dir, "b.db"), &sqlite.Catalog{}, filepath.Join(dir, "b.db")},
		{"plain path", filepath.Join(dir, "c.db"), &sqlite.Catalog{}, filepath.Join(dir, "c.db")},
		{"postgres", pg, &postgres.Catalog{}, ""},
		{"postgresql", strings.Replace(pg, "postgres://", "postgresql://", 1), &postgres.Catalog{}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := opencatalog.Open(t.Context(), tc.url)
			if err != nil {
				t.Fatalf("Open(%q): %v", tc.url, err)
			}
			defer c.Close()
			if got, want := typeName(c), typeName(tc.wantType); got != want {
				t.Errorf("Open(%q) = %s, want %s", tc.url, got, want)
			}
			// Usable, and (on a shared database) idempotent to reopen.
			if _, err := c.CountKeys(t.Context()); err != nil {
				t.Errorf("CountKeys: %v", err)
			}
			if tc.wantFile != "" {
				if _, err := os.Stat(tc.wantFile); err != nil {
					t.Errorf("Open(%q) did not create %s: %v", tc.url, tc.wantFile, err)
				}
			}
		})
	}
}

func TestOpenErrors(t *testing.T) {
	for _, u := range []string{"", "sqlite://", "sqlite:", "mysql://user:secret@host/db",
		"postgres://user:secret@/db?host=/nonexistent&connect_timeout=5", "postgres://user:secret@host:badport/db"} {
		c, err := opencatalog.Open(t.Context(), u)
		if err == nil {
			c.Close()
			t.Errorf("Open(%q) succeeded, want an error", u)
			continue
		}
		t.Logf("Open(%q): %v", u, err)
		if strings.Contains(err.Error(), "secret") {
			t.Errorf("Open(%q): %v; the error shows the password", u, err)
		}
	}
}

func typeName(v any) string {
	switch v.(type) {
	case *sqlite.Catalog:
		return "sqlite"
	case *postgres.Catalog:
		return "postgres"
	case catalog.Catalog:
		return "another catalog"
	}
	return "not a catalog"
}
