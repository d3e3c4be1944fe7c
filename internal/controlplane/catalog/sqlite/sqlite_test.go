package sqlite_test

import (
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/catalogtest"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/sqlite"
)

func TestConformance(t *testing.T) {
	catalogtest.Run(t, func(t *testing.T) catalog.Catalog {
		c, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "catalog.db"))
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return c
	})
}

// TestReopen checks that data survives a reopen and that migrations are
// applied once, also with a path the driver's DSN syntax would misread.
func TestReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "odd ?name#x&y.db")
	c, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	k := catalog.Key{ID: "key_a", Hash: "h", CreatedAt: time.Now()}
	if err := c.CreateKey(t.Context(), k); err != nil {
		t.Fatalf("CreateKey: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	c, err = sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open again: %v", err)
	}
	defer c.Close()
	if _, err := c.GetKey(t.Context(), "key_a"); err != nil {
		t.Errorf("GetKey after reopening: %v", err)
	}
	if matches, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*")); len(matches) == 0 || !strings.Contains(matches[0], "odd ?name#x&y.db") {
		t.Errorf("files in the directory: %v, want %s", matches, path)
	}
}

// TestTwoCatalogs opens one file twice, as two processes would.
func TestTwoCatalogs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "catalog.db")
	var cats []catalog.Catalog
	for i := range 2 {
		c, err := sqlite.Open(t.Context(), path)
		if err != nil {
			t.Fatalf("Open #%d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		cats = append(cats, c)
	}
	catalogtest.Shared(t, cats)
}

func TestLegacyPublic(t *testing.T) {
	path := filepath.Join(t.TempDir(), "catalog.db")
	c, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer c.Close()
	catalogtest.LegacyPublic(t, c, func(doc string) error {
		db, err := sql.Open("sqlite", path)
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.Exec(`INSERT INTO templates (name, owner, doc, created_at) VALUES ('old', 'key_a', ?, '2025-03-04T05:06:07.000000Z')`, doc)
		return err
	})
}

func TestNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "catalog.db")
	open := func() (*sqlite.Catalog, error) { return sqlite.Open(t.Context(), path) }
	catalogtest.NewerSchema(t, open, func(version int) error {
		db, err := sql.Open("sqlite", path)
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.Exec(`INSERT INTO schema_migrations (version, name) VALUES (?, ?)`, version, fmt.Sprintf("%04d_future.sql", version))
		return err
	})
}
