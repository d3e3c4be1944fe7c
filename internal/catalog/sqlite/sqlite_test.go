package sqlite_test

import (
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/catalog"
	"github.com/pandastack/pandastack/internal/catalog/catalogtest"
	"github.com/pandastack/pandastack/internal/catalog/sqlite"
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

// TestTwoCatalogs opens one file twice, as two processes would, and checks
// that a key's quota holds across both.
func TestTwoCatalogs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "catalog.db")
	var cats [2]*sqlite.Catalog
	for i := range cats {
		c, err := sqlite.Open(t.Context(), path)
		if err != nil {
			t.Fatalf("Open #%d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		cats[i] = c
	}
	now := time.Now()
	if err := cats[0].CreateKey(t.Context(), catalog.Key{ID: "key_a", Hash: "h", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	const callers, limit = 30, 10
	start := make(chan struct{})
	results := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			<-start
			sb := catalog.Sandbox{ID: fmt.Sprintf("sb%02d", i), KeyID: "key_a", State: catalog.StateRunning, CreatedAt: now}
			results[i] = cats[i%2].ReserveSandbox(t.Context(), sb, limit, 0)
		})
	}
	close(start)
	wg.Wait()
	ok := 0
	for i, err := range results {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, catalog.ErrQuota):
			t.Errorf("caller %d: %v, want nil or ErrQuota", i, err)
		}
	}
	if ok != limit {
		t.Errorf("%d reservations across two catalogs succeeded, want %d", ok, limit)
	}
}

// TestNewerSchema checks that a program refuses a file migrated by a newer
// one rather than running against a schema it does not know.
func TestNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "catalog.db")
	c, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`INSERT INTO schema_migrations (version, name) VALUES (9999, '9999_future.sql')`); err != nil {
		t.Fatal(err)
	}
	c, err = sqlite.Open(t.Context(), path)
	if err == nil {
		c.Close()
		t.Fatal("Open of a file with a newer schema succeeded")
	}
	if !strings.Contains(err.Error(), "9999") {
		t.Errorf("Open: %v; want it to name the newer version", err)
	}
}
