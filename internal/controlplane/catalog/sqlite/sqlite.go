// Package sqlite is the default catalog store: one SQLite file in the data
// directory (WAL mode, foreign keys on), through the pure Go driver
// modernc.org/sqlite. It serves one control-plane process; several replicas
// need catalog/postgres. The queries are package sqlstore's; this package
// opens the file, migrates it and says how SQLite differs (the dialect
// below).
//
// Writes go through a single connection that begins every transaction with
// BEGIN IMMEDIATE: SQLite has one writer at a time anyway, and queueing
// writers in database/sql is fairer and cheaper than letting them spin on
// SQLITE_BUSY. IMMEDIATE (and the busy timeout) also keeps another process
// opening the same file correct, and is what makes a quota reservation's
// count and insert atomic: the transaction holds the write lock from its
// first statement. Reads use a separate pool of read-only connections,
// which WAL lets run alongside the writer.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/internal/migration"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/internal/sqlstore"
)

//go:embed migrations/*.sql
var migrations embed.FS

// busyTimeout bounds how long a statement waits for another process's lock.
const busyTimeout = 10 * time.Second

// Catalog is a catalog.Catalog in one SQLite file; its methods are
// sqlstore.Store's.
type Catalog struct {
	*sqlstore.Store
}

var _ catalog.Catalog = (*Catalog)(nil)

// Open opens (creating if needed) the catalog in the SQLite file at path and
// applies pending schema migrations. The directory must exist.
func Open(ctx context.Context, path string) (*Catalog, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open sqlite catalog: %w", err)
	}
	// A file: URI, so that any character in the path survives: the driver
	// would otherwise cut a plain path at its first '?'.
	base := (&url.URL{Scheme: "file", Path: abs}).String()
	common := url.Values{
		"_busy_timeout": {fmt.Sprint(busyTimeout.Milliseconds())},
		"_foreign_keys": {"1"},
	}
	wq := url.Values{"_txlock": {"immediate"}, "_journal_mode": {"WAL"}, "_synchronous": {"FULL"}}
	rq := url.Values{"_query_only": {"1"}}
	for k, v := range common {
		wq[k], rq[k] = v, v
	}

	// w: exactly one connection, BEGIN IMMEDIATE; r: read-only connections.
	w, err := sql.Open("sqlite", base+"?"+wq.Encode())
	if err != nil {
		return nil, fmt.Errorf("open sqlite catalog %s: %w", abs, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	r, err := sql.Open("sqlite", base+"?"+rq.Encode())
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open sqlite catalog %s: %w", abs, err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	r.SetMaxOpenConns(n)
	r.SetMaxIdleConns(n)

	if err := migrate(ctx, w); err != nil {
		w.Close()
		r.Close()
		return nil, fmt.Errorf("open sqlite catalog %s: %w", abs, err)
	}
	closeDBs := func() error { return errors.Join(r.Close(), w.Close()) }
	return &Catalog{sqlstore.New(w, r, dialect, closeDBs)}, nil
}

// dialect: no row locks (SQLite has none; BEGIN IMMEDIATE on the writer
// already holds the only write lock), times as text (SQLite has no time
// type), and the constraint errors of modernc.org/sqlite.
var dialect = sqlstore.Dialect{TextTimes: true, MetadataMatch: metadataMatch, Classify: classify}

// metadataMatch uses json_each rather than a JSON path, so that any key
// works, dots and quotes included.
func metadataMatch(m map[string]string) (string, []any, error) {
	var conds []string
	var args []any
	for k, v := range m {
		conds = append(conds, `EXISTS (SELECT 1 FROM json_each(sandboxes.metadata) AS m
			WHERE m.key = ? AND m.type = 'text' AND m.value = ?)`)
		args = append(args, k, v)
	}
	return strings.Join(conds, ` AND `), args, nil
}

// migrate applies the embedded migrations not yet recorded in
// schema_migrations, each in its own IMMEDIATE transaction (so two
// processes opening a new file at once apply each exactly once).
func migrate(ctx context.Context, w *sql.DB) error {
	ms, err := migration.Load(migrations, "migrations")
	if err != nil {
		return err
	}
	if _, err := w.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
	) STRICT`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	var newest int
	if err := w.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&newest); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	pending, err := migration.Pending(ms, newest)
	if err != nil {
		return err
	}
	for _, m := range pending {
		if err := apply(ctx, w, m); err != nil {
			return fmt.Errorf("apply migration %s: %w", m.Name, err)
		}
	}
	return nil
}

func apply(ctx context.Context, w *sql.DB, m migration.Migration) error {
	tx, err := w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations WHERE version = ?`, m.Version).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name) VALUES (?, ?)`, m.Version, m.Name); err != nil {
		return err
	}
	return tx.Commit()
}

// classify turns constraint violations into catalog error classes.
func classify(err error) error {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return err
	}
	switch se.Code() {
	case sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY, sqlite3.SQLITE_CONSTRAINT_UNIQUE:
		return fmt.Errorf("%w (%v)", catalog.ErrConflict, err)
	case sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
		return fmt.Errorf("key %w (%v)", catalog.ErrNotFound, err)
	}
	return err
}
