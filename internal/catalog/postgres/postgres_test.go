package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pandastack/pandastack/internal/catalog"
	"github.com/pandastack/pandastack/internal/catalog/catalogtest"
	"github.com/pandastack/pandastack/internal/catalog/pgtest"
	"github.com/pandastack/pandastack/internal/catalog/postgres"
)

// TestPostgres runs every test against one server, each in its own
// database: starting a server costs about a second.
func TestPostgres(t *testing.T) {
	server := pgtest.Start(t)
	t.Run("Conformance", func(t *testing.T) {
		catalogtest.Run(t, func(t *testing.T) catalog.Catalog {
			c, err := postgres.Open(t.Context(), pgtest.NewDatabase(t, server))
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			return c
		})
	})
	t.Run("Replicas", func(t *testing.T) { testReplicas(t, pgtest.NewDatabase(t, server)) })
	t.Run("NewerSchema", func(t *testing.T) { testNewerSchema(t, pgtest.NewDatabase(t, server)) })
}

// testReplicas opens the same database from several catalogs at once, as
// control-plane replicas starting together do, and checks that migrations
// are applied once and that a key's quota holds across all of them.
func testReplicas(t *testing.T, dsn string) {
	const replicas = 4
	cats := make([]*postgres.Catalog, replicas)
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() { cats[i], errs[i] = postgres.Open(t.Context(), dsn) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Open #%d: %v", i, err)
		}
		t.Cleanup(func() { cats[i].Close() })
	}

	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(t.Context()))
	var rows, versions int
	if err := conn.QueryRow(t.Context(), `SELECT count(*), count(DISTINCT version) FROM schema_migrations`).Scan(&rows, &versions); err != nil {
		t.Fatal(err)
	}
	if rows != versions || rows == 0 {
		t.Errorf("schema_migrations has %d rows for %d versions, want one row per version", rows, versions)
	}

	now := time.Now()
	if err := cats[0].CreateKey(t.Context(), catalog.Key{ID: "key_a", Hash: "h", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	const callers, limit = 40, 10
	start := make(chan struct{})
	results := make([]error, callers)
	for i := range callers {
		wg.Go(func() {
			<-start
			sb := catalog.Sandbox{ID: fmt.Sprintf("sb%02d", i), KeyID: "key_a", State: catalog.StateRunning, MemoryMiB: 256, CreatedAt: now}
			results[i] = cats[i%replicas].ReserveSandbox(t.Context(), sb, limit, 0)
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
		t.Errorf("%d reservations across %d replicas succeeded, want %d", ok, replicas, limit)
	}
	for i, c := range cats {
		sbs, err := c.ListSandboxes(t.Context(), catalog.SandboxFilter{KeyID: "key_a"})
		if err != nil || len(sbs) != limit {
			t.Errorf("replica %d lists %d sandboxes (%v), want %d", i, len(sbs), err, limit)
		}
	}
}

// testNewerSchema checks that a program refuses a database migrated by a
// newer one rather than running against a schema it does not know.
func testNewerSchema(t *testing.T, dsn string) {
	c, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(t.Context()))
	if _, err := conn.Exec(t.Context(), `INSERT INTO schema_migrations (version, name) VALUES (9999, '9999_future.sql')`); err != nil {
		t.Fatal(err)
	}
	c, err = postgres.Open(t.Context(), dsn)
	if err == nil {
		c.Close()
		t.Fatal("Open of a database with a newer schema succeeded")
	}
	if !strings.Contains(err.Error(), "9999") {
		t.Errorf("Open: %v; want it to name the newer version", err)
	}
}
