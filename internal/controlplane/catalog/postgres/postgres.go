// Package postgres is the catalog store for several control-plane replicas
// sharing one PostgreSQL database, through pgx's connection pool. The
// queries are package sqlstore's, which uses the pool through database/sql;
// this package connects, migrates the schema and says how PostgreSQL
// differs (the dialect below).
//
// Concurrency: ReserveSandbox locks the key's row (SELECT ... FOR UPDATE)
// before counting, so reservations for one key are serialized across every
// replica; UpdateSandbox locks the sandbox's row the same way. Both run at
// READ COMMITTED, where each statement after the lock sees every commit made
// before it, so neither needs retries. Schema migrations run under a session
// advisory lock, so replicas starting together apply each one exactly once.
package postgres

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/internal/migration"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/internal/sqlstore"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationLock is the pg_advisory_lock key held while migrating
// ("panda" in ASCII); any constant works as long as every version uses it.
const migrationLock int64 = 0x70616e6461

// Catalog is a catalog.Catalog in a PostgreSQL database; its methods are
// sqlstore.Store's.
type Catalog struct {
	*sqlstore.Store
}

var _ catalog.Catalog = (*Catalog)(nil)

// Open connects to the database named by dsn (a postgres:// URL or a
// keyword/value string, as libpq takes) and applies pending schema
// migrations. The tables go in the connection's current schema (normally
// public; set search_path in the DSN's options to use another).
func Open(ctx context.Context, dsn string) (*Catalog, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// The parse error can quote the DSN, password included.
		return nil, errors.New("open postgres catalog: cannot parse the connection string")
	}
	where := fmt.Sprintf("database %s on %s", cfg.ConnConfig.Database, cfg.ConnConfig.Host)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres catalog %s: %w", where, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("open postgres catalog %s: %w", where, err)
	}
	if err := migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("open postgres catalog %s: %w", where, err)
	}
	// database/sql over the pool: each statement or transaction takes a
	// connection from the pool and gives it back (the DB keeps none idle).
	db := stdlib.OpenDBFromPool(pool)
	closeDB := func() error {
		err := db.Close()
		pool.Close()
		return err
	}
	return &Catalog{sqlstore.New(db, db, dialect, closeDB)}, nil
}

// dialect: $n parameters, FOR UPDATE row locks (see the package comment),
// native timestamptz, metadata matched by jsonb containment (which the
// sandboxes_metadata index serves), and PostgreSQL's constraint errors.
var dialect = sqlstore.Dialect{
	Placeholder: sqlstore.Numbered,
	LockRow:     " FOR UPDATE",
	MetadataMatch: func(m map[string]string) (string, []any, error) {
		b, err := json.Marshal(m)
		return `metadata @> ?::jsonb`, []any{string(b)}, err
	},
	Classify: classify,
}

// migrate applies the embedded migrations not yet recorded in
// schema_migrations, each in its own transaction, holding the advisory lock
// throughout.
func migrate(ctx context.Context, pool *pgxpool.Pool) (err error) {
	ms, err := migration.Load(migrations, "migrations")
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrationLock); err != nil {
		return fmt.Errorf("lock schema: %w", err)
	}
	defer func() {
		// A session lock outlives transactions: if unlocking fails, end
		// the session, which releases it.
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, migrationLock); uerr != nil {
			conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	var newest int
	if err := conn.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&newest); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	pending, err := migration.Pending(ms, newest)
	if err != nil {
		return err
	}
	for _, m := range pending {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
			return err
		})
		if err != nil {
			return fmt.Errorf("apply migration %s: %w", m.Name, err)
		}
	}
	return nil
}

// classify turns constraint violations into catalog error classes.
func classify(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case "23505": // unique_violation
		return fmt.Errorf("%w (%v)", catalog.ErrConflict, err)
	case "23503": // foreign_key_violation
		return fmt.Errorf("key %w (%v)", catalog.ErrNotFound, err)
	}
	return err
}
