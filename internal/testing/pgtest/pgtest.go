// Package pgtest starts throwaway PostgreSQL servers for tests: a fresh
// cluster (initdb) in a temporary directory, run by package pgserver on a
// unix socket only, without durability, stopped and removed when the test
// ends. It needs the Debian postgresql package (`make setup`); the
// cluster that package may run as a service is never used.
package pgtest

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pandastack/pandastack/internal/testing/pgserver"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// startTimeout bounds the creation of a database.
const startTimeout = 60 * time.Second

// Start runs a new PostgreSQL server for the duration of the test and
// returns the URL of its "postgres" database, e.g.
// postgres://postgres@/postgres?host=/tmp/pgtest-123&sslmode=disable.
// The server stops (and its files are removed) in t.Cleanup, whether the
// test passed or not. Under -short it skips the test (testkit.Postgres);
// otherwise it fails it when PostgreSQL is missing. When the test runs
// as root the server runs as the postgres system user (or nobody), since
// PostgreSQL refuses root.
func Start(t testing.TB) string {
	t.Helper()
	testkit.Postgres(t)
	dir, err := socketDir()
	if err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove postgres directory: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	srv, err := pgserver.Start(ctx, pgserver.Config{Dir: dir})
	if err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	t.Cleanup(func() {
		select {
		case <-srv.Exited():
			t.Errorf("postgres exited before the end of the test: %v\nserver log:\n%s", srv.Err(), srv.ReadLog())
			return
		default:
		}
		began := time.Now()
		if err := srv.Stop(); err != nil {
			t.Errorf("%v\nserver log:\n%s", err, srv.ReadLog())
			return
		}
		t.Logf("postgres stopped in %v", time.Since(began).Round(time.Millisecond))
	})
	t.Logf("postgres %s ready in %v (initdb %v) at %s", filepath.Base(filepath.Dir(srv.Binaries)),
		srv.Ready.Round(time.Millisecond), srv.InitDB.Round(time.Millisecond), dir)
	return srv.DSN()
}

var databases atomic.Int64

// NewDatabase creates an empty database on the server at dsn (a URL as
// Start returns) and returns its URL. Tests sharing one server use it to
// start from a clean state.
func NewDatabase(t testing.TB, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("new database: %v", err)
	}
	name := "test_" + strconv.FormatInt(databases.Add(1), 10)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	conn, err := pgconn.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("new database: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name).ReadAll(); err != nil {
		t.Fatalf("new database %s: %v", name, err)
	}
	u.Path = "/" + name
	return u.String()
}

// socketDir creates the server's directory (data, socket, log). A unix
// socket path must fit in 107 bytes, so a long TMPDIR gives way to /tmp.
func socketDir() (string, error) {
	parent := os.TempDir()
	if len(parent) > 60 {
		parent = "/tmp"
	}
	return os.MkdirTemp(parent, "pgtest-")
}
