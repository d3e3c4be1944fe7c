package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/catalogtest"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/postgres"
	"github.com/pandastack/pandastack/internal/testing/pgtest"
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
	t.Run("LegacyPublic", func(t *testing.T) { testLegacyPublic(t, pgtest.NewDatabase(t, server)) })
}

// testReplicas opens the same database from several catalogs at once, as
// control-plane replicas starting together do, and checks that migrations
// are applied once and that a key's quota holds across all of them.
func testReplicas(t *testing.T, dsn string) {
	const replicas = 4
	cats := make([]catalog.Catalog, replicas)
	errs := make([]error, replicas)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() {
			c, err := postgres.Open(t.Context(), dsn)
			if err == nil {
				cats[i] = c
			}
			errs[i] = err
		})
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

	catalogtest.Shared(t, cats)
}

func testLegacyPublic(t *testing.T, dsn string) {
	c, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer c.Close()
	catalogtest.LegacyPublic(t, c, func(doc string) error {
		conn, err := pgx.Connect(t.Context(), dsn)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(t.Context()))
		_, err = conn.Exec(t.Context(), `INSERT INTO templates (name, owner, doc, created_at) VALUES ('old', 'key_a', $1, now())`, doc)
		return err
	})
}

func testNewerSchema(t *testing.T, dsn string) {
	open := func() (*postgres.Catalog, error) { return postgres.Open(t.Context(), dsn) }
	catalogtest.NewerSchema(t, open, func(version int) error {
		conn, err := pgx.Connect(t.Context(), dsn)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(t.Context()))
		_, err = conn.Exec(t.Context(), `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, version, fmt.Sprintf("%04d_future.sql", version))
		return err
	})
}
