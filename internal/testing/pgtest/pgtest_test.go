package pgtest_test

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pandastack/pandastack/internal/testing/pgtest"
)

// TestStart checks that the server answers, that NewDatabase gives a
// separate empty database, and that nothing is left once the test is over.
func TestStart(t *testing.T) {
	var dir string
	var pid int
	t.Run("server", func(t *testing.T) {
		dsn := pgtest.Start(t)
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		dir = u.Query().Get("host")
		b, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
		if err != nil {
			t.Fatal(err)
		}
		if pid, err = strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0]); err != nil {
			t.Fatalf("postmaster.pid: %v", err)
		}

		db := pgtest.NewDatabase(t, dsn)
		conn, err := pgx.Connect(t.Context(), db)
		if err != nil {
			t.Fatalf("connect to the new database: %v", err)
		}
		defer conn.Close(t.Context())
		var name string
		var tables int
		if err := conn.QueryRow(t.Context(), `SELECT current_database(),
			(SELECT count(*) FROM pg_tables WHERE schemaname = 'public')`).Scan(&name, &tables); err != nil {
			t.Fatal(err)
		}
		if name == "postgres" || tables != 0 {
			t.Errorf("NewDatabase gave database %s with %d tables, want a new empty one", name, tables)
		}
	})
	if pid == 0 {
		return // the subtest failed before finding the server
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("postmaster %d after the test: kill -0 = %v, want ESRCH", pid, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("server directory %s after the test: %v, want it removed", dir, err)
	}
}
