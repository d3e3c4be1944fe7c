// Package postgres is the catalog store for several control-plane replicas
// sharing one PostgreSQL database, through pgx's connection pool.
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
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pandastack/pandastack/internal/catalog"
	"github.com/pandastack/pandastack/internal/catalog/internal/migration"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationLock is the pg_advisory_lock key held while migrating
// ("panda" in ASCII); any constant works as long as every version uses it.
const migrationLock int64 = 0x70616e6461

// Catalog is a catalog.Catalog in a PostgreSQL database.
type Catalog struct {
	pool *pgxpool.Pool

	closeOnce sync.Once
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
	c := &Catalog{pool: pool}
	if err := pool.Ping(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("open postgres catalog %s: %w", where, err)
	}
	if err := c.migrate(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("open postgres catalog %s: %w", where, err)
	}
	return c, nil
}

// migrate applies the embedded migrations not yet recorded in
// schema_migrations, each in its own transaction, holding the advisory lock
// throughout.
func (c *Catalog) migrate(ctx context.Context) (err error) {
	ms, err := migration.Load(migrations, "migrations")
	if err != nil {
		return err
	}
	conn, err := c.pool.Acquire(ctx)
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
	if newest > len(ms) {
		return fmt.Errorf("schema version %d is newer than this program's %d: run a newer panda", newest, len(ms))
	}
	for _, m := range ms[newest:] {
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

// Close closes the connection pool. It is idempotent.
func (c *Catalog) Close() error {
	c.closeOnce.Do(c.pool.Close)
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

// Keys.

const keyCols = `id, name, hash, prefix, admin, max_sandboxes, max_memory_mib, created_at, revoked_at`

func (c *Catalog) CreateKey(ctx context.Context, k catalog.Key) error {
	_, err := c.pool.Exec(ctx, `INSERT INTO keys (`+keyCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		k.ID, k.Name, k.Hash, k.Prefix, k.Admin, k.MaxSandboxes, k.MaxMemoryMiB, encTime(k.CreatedAt), encTime(k.RevokedAt))
	if err != nil {
		return fmt.Errorf("create key %s: %w", k.ID, classify(err))
	}
	return nil
}

func (c *Catalog) KeyByHash(ctx context.Context, hash string) (catalog.Key, error) {
	k, err := scanKey(c.pool.QueryRow(ctx, `SELECT `+keyCols+` FROM keys WHERE hash = $1`, hash))
	if errors.Is(err, pgx.ErrNoRows) {
		return catalog.Key{}, fmt.Errorf("get key by hash: %w", catalog.ErrNotFound)
	} else if err != nil {
		return catalog.Key{}, fmt.Errorf("get key by hash: %w", err)
	}
	return k, nil
}

func (c *Catalog) GetKey(ctx context.Context, id string) (catalog.Key, error) {
	k, err := scanKey(c.pool.QueryRow(ctx, `SELECT `+keyCols+` FROM keys WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return catalog.Key{}, fmt.Errorf("get key %s: %w", id, catalog.ErrNotFound)
	} else if err != nil {
		return catalog.Key{}, fmt.Errorf("get key %s: %w", id, err)
	}
	return k, nil
}

func (c *Catalog) ListKeys(ctx context.Context) ([]catalog.Key, error) {
	rows, err := c.pool.Query(ctx, `SELECT `+keyCols+` FROM keys ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	ks, err := collect(rows, scanKey)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	return ks, nil
}

func (c *Catalog) RevokeKey(ctx context.Context, id string, at time.Time) error {
	tag, err := c.pool.Exec(ctx, `UPDATE keys SET revoked_at = coalesce(revoked_at, $1) WHERE id = $2`, encTime(at), id)
	if err != nil {
		return fmt.Errorf("revoke key %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("revoke key %s: %w", id, catalog.ErrNotFound)
	}
	return nil
}

func (c *Catalog) CountKeys(ctx context.Context) (int, error) {
	var n int
	if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM keys`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count keys: %w", err)
	}
	return n, nil
}

// Sandboxes.

const sandboxCols = `id, key_id, template, host_id, state, stop_reason, memory_mib, vcpus, metadata, env,
	ttl_seconds, on_expire, parent_id, snapshot_id, created_at, updated_at, expires_at, stopped_at`

func (c *Catalog) ReserveSandbox(ctx context.Context, sb catalog.Sandbox, maxCount, maxMemoryMiB int) error {
	if err := c.reserve(ctx, sb, maxCount, maxMemoryMiB); err != nil {
		return fmt.Errorf("reserve sandbox %s: %w", sb.ID, err)
	}
	return nil
}

func (c *Catalog) reserve(ctx context.Context, sb catalog.Sandbox, maxCount, maxMemoryMiB int) error {
	args, err := sandboxArgs(sb)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		// The key's row lock serializes every reservation for the key,
		// in every process, until this transaction ends.
		var revoked *time.Time
		err := tx.QueryRow(ctx, `SELECT revoked_at FROM keys WHERE id = $1 FOR UPDATE`, sb.KeyID).Scan(&revoked)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("key %s: %w", sb.KeyID, catalog.ErrNotFound)
		} else if err != nil {
			return err
		}
		if revoked != nil {
			return fmt.Errorf("key %s is revoked: %w", sb.KeyID, catalog.ErrNotFound)
		}
		var count, mem int
		if err := tx.QueryRow(ctx, `SELECT count(*), coalesce(sum(memory_mib), 0) FROM sandboxes
			WHERE key_id = $1 AND state <> 'stopped'`, sb.KeyID).Scan(&count, &mem); err != nil {
			return err
		}
		if err := catalog.CheckQuota(sb.KeyID, count, mem, sb.MemoryMiB, maxCount, maxMemoryMiB); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO sandboxes (`+sandboxCols+`)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)`, args...); err != nil {
			return classify(err)
		}
		return nil
	})
}

func (c *Catalog) GetSandbox(ctx context.Context, id string) (catalog.Sandbox, error) {
	sb, err := scanSandbox(c.pool.QueryRow(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return catalog.Sandbox{}, fmt.Errorf("get sandbox %s: %w", id, catalog.ErrNotFound)
	} else if err != nil {
		return catalog.Sandbox{}, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	return sb, nil
}

func (c *Catalog) ListSandboxes(ctx context.Context, f catalog.SandboxFilter) ([]catalog.Sandbox, error) {
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return fmt.Sprintf("$%d", len(args))
	}
	if f.KeyID != "" {
		where = append(where, `key_id = `+arg(f.KeyID))
	}
	if f.HostID != "" {
		where = append(where, `host_id = `+arg(f.HostID))
	}
	if len(f.States) > 0 {
		where = append(where, `state = ANY(`+arg(f.States)+`)`)
	}
	if len(f.Metadata) > 0 {
		md, err := json.Marshal(f.Metadata)
		if err != nil {
			return nil, fmt.Errorf("list sandboxes: encode metadata filter: %w", err)
		}
		where = append(where, `metadata @> `+arg(string(md))+`::jsonb`)
	}
	q := `SELECT ` + sandboxCols + ` FROM sandboxes`
	for i, w := range where {
		if i == 0 {
			q += ` WHERE ` + w
		} else {
			q += ` AND ` + w
		}
	}
	sbs, err := c.querySandboxes(ctx, q+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	return sbs, nil
}

func (c *Catalog) UpdateSandbox(ctx context.Context, id string, fn func(*catalog.Sandbox) error) (catalog.Sandbox, error) {
	sb, err := c.update(ctx, id, fn)
	if err != nil {
		var fe fnError
		if errors.As(err, &fe) {
			return catalog.Sandbox{}, fe.err
		}
		return catalog.Sandbox{}, fmt.Errorf("update sandbox %s: %w", id, err)
	}
	return sb, nil
}

// fnError carries UpdateSandbox's fn error out unwrapped.
type fnError struct{ err error }

func (e fnError) Error() string { return e.err.Error() }

func (c *Catalog) update(ctx context.Context, id string, fn func(*catalog.Sandbox) error) (catalog.Sandbox, error) {
	var sb catalog.Sandbox
	err := pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		var err error
		sb, err = scanSandbox(tx.QueryRow(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = $1 FOR UPDATE`, id))
		if errors.Is(err, pgx.ErrNoRows) {
			return catalog.ErrNotFound
		} else if err != nil {
			return err
		}
		if err := fn(&sb); err != nil {
			return fnError{err}
		}
		if sb.ID != id {
			return fmt.Errorf("fn changed the id to %q", sb.ID)
		}
		args, err := sandboxArgs(sb)
		if err != nil {
			return err
		}
		// args[0] is the id, $1 here.
		if _, err := tx.Exec(ctx, `UPDATE sandboxes SET key_id = $2, template = $3, host_id = $4, state = $5,
			stop_reason = $6, memory_mib = $7, vcpus = $8, metadata = $9, env = $10, ttl_seconds = $11,
			on_expire = $12, parent_id = $13, snapshot_id = $14, created_at = $15, updated_at = $16,
			expires_at = $17, stopped_at = $18
			WHERE id = $1`, args...); err != nil {
			return classify(err)
		}
		return nil
	})
	if err != nil {
		return catalog.Sandbox{}, err
	}
	return normalize(sb), nil
}

func (c *Catalog) DeleteSandbox(ctx context.Context, id string) error {
	tag, err := c.pool.Exec(ctx, `DELETE FROM sandboxes WHERE id = $1`, id)
	if err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("delete sandbox %s: %w", id, catalog.ErrNotFound)
	}
	return nil
}

func (c *Catalog) Due(ctx context.Context, now time.Time) ([]catalog.Sandbox, error) {
	sbs, err := c.querySandboxes(ctx, `SELECT `+sandboxCols+` FROM sandboxes
		WHERE state <> 'stopped' AND expires_at IS NOT NULL AND expires_at <= $1
		ORDER BY expires_at, id`, encTime(now))
	if err != nil {
		return nil, fmt.Errorf("list due sandboxes: %w", err)
	}
	return sbs, nil
}

func (c *Catalog) PurgeStopped(ctx context.Context, before time.Time) (int, error) {
	tag, err := c.pool.Exec(ctx, `DELETE FROM sandboxes
		WHERE state = 'stopped' AND stopped_at IS NOT NULL AND stopped_at < $1`, encTime(before))
	if err != nil {
		return 0, fmt.Errorf("purge stopped sandboxes: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

func (c *Catalog) querySandboxes(ctx context.Context, q string, args ...any) ([]catalog.Sandbox, error) {
	rows, err := c.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return collect(rows, scanSandbox)
}

// Snapshots.

const snapshotCols = `id, key_id, sandbox_id, name, host_id, template, memory_mib, vcpus, size_bytes, created_at`

func (c *Catalog) CreateSnapshot(ctx context.Context, s catalog.Snapshot) error {
	_, err := c.pool.Exec(ctx, `INSERT INTO snapshots (`+snapshotCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		s.ID, s.KeyID, s.SandboxID, s.Name, s.HostID, s.Template, s.MemoryMiB, s.VCPUs, s.SizeBytes, encTime(s.CreatedAt))
	if err != nil {
		return fmt.Errorf("create snapshot %s: %w", s.ID, classify(err))
	}
	return nil
}

func (c *Catalog) GetSnapshot(ctx context.Context, id string) (catalog.Snapshot, error) {
	s, err := scanSnapshot(c.pool.QueryRow(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return catalog.Snapshot{}, fmt.Errorf("get snapshot %s: %w", id, catalog.ErrNotFound)
	} else if err != nil {
		return catalog.Snapshot{}, fmt.Errorf("get snapshot %s: %w", id, err)
	}
	return s, nil
}

func (c *Catalog) ListSnapshots(ctx context.Context, keyID string) ([]catalog.Snapshot, error) {
	// $1 = '' selects every key's snapshots.
	rows, err := c.pool.Query(ctx, `SELECT `+snapshotCols+` FROM snapshots
		WHERE $1 = '' OR key_id = $1 ORDER BY created_at, id`, keyID)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	ss, err := collect(rows, scanSnapshot)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	return ss, nil
}

func (c *Catalog) DeleteSnapshot(ctx context.Context, id string) error {
	tag, err := c.pool.Exec(ctx, `DELETE FROM snapshots WHERE id = $1`, id)
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("delete snapshot %s: %w", id, catalog.ErrNotFound)
	}
	return nil
}

// Encoding.

func collect[T any](rows pgx.Rows, scan func(pgx.Row) (T, error)) ([]T, error) {
	defer rows.Close()
	var ts []T
	for rows.Next() {
		t, err := scan(rows)
		if err != nil {
			return nil, err
		}
		ts = append(ts, t)
	}
	return ts, rows.Err()
}

func scanKey(row pgx.Row) (catalog.Key, error) {
	var k catalog.Key
	var revoked *time.Time
	if err := row.Scan(&k.ID, &k.Name, &k.Hash, &k.Prefix, &k.Admin, &k.MaxSandboxes, &k.MaxMemoryMiB, &k.CreatedAt, &revoked); err != nil {
		return catalog.Key{}, err
	}
	k.CreatedAt = k.CreatedAt.UTC()
	k.RevokedAt = decTime(revoked)
	return k, nil
}

// sandboxArgs returns sb's column values in sandboxCols order.
func sandboxArgs(sb catalog.Sandbox) ([]any, error) {
	md, err := encMap(sb.Metadata)
	if err != nil {
		return nil, fmt.Errorf("encode metadata: %w", err)
	}
	env, err := encMap(sb.Env)
	if err != nil {
		return nil, fmt.Errorf("encode env: %w", err)
	}
	return []any{sb.ID, sb.KeyID, sb.Template, sb.HostID, sb.State, sb.StopReason, sb.MemoryMiB, sb.VCPUs, md, env,
		sb.TTLSeconds, sb.OnExpire, sb.ParentID, sb.SnapshotID,
		encTime(sb.CreatedAt), encTime(sb.UpdatedAt), encTime(sb.ExpiresAt), encTime(sb.StoppedAt)}, nil
}

func scanSandbox(row pgx.Row) (catalog.Sandbox, error) {
	var sb catalog.Sandbox
	var md, env string
	var updated, expires, stopped *time.Time
	if err := row.Scan(&sb.ID, &sb.KeyID, &sb.Template, &sb.HostID, &sb.State, &sb.StopReason, &sb.MemoryMiB, &sb.VCPUs,
		&md, &env, &sb.TTLSeconds, &sb.OnExpire, &sb.ParentID, &sb.SnapshotID,
		&sb.CreatedAt, &updated, &expires, &stopped); err != nil {
		return catalog.Sandbox{}, err
	}
	var err error
	if sb.Metadata, err = decMap(md); err != nil {
		return catalog.Sandbox{}, fmt.Errorf("decode metadata of %s: %w", sb.ID, err)
	}
	if sb.Env, err = decMap(env); err != nil {
		return catalog.Sandbox{}, fmt.Errorf("decode env of %s: %w", sb.ID, err)
	}
	sb.CreatedAt = sb.CreatedAt.UTC()
	sb.UpdatedAt, sb.ExpiresAt, sb.StoppedAt = decTime(updated), decTime(expires), decTime(stopped)
	return sb, nil
}

func scanSnapshot(row pgx.Row) (catalog.Snapshot, error) {
	var s catalog.Snapshot
	if err := row.Scan(&s.ID, &s.KeyID, &s.SandboxID, &s.Name, &s.HostID, &s.Template, &s.MemoryMiB, &s.VCPUs, &s.SizeBytes, &s.CreatedAt); err != nil {
		return catalog.Snapshot{}, err
	}
	s.CreatedAt = s.CreatedAt.UTC()
	return s, nil
}

// encTime returns t as a query argument: NULL for the zero time.
// PostgreSQL keeps microseconds; pgx truncates the rest.
func encTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC()
}

func decTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

func encMap(m map[string]string) (string, error) {
	if len(m) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	return string(b), err
}

func decMap(s string) (map[string]string, error) {
	m := map[string]string{}
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, err
	}
	return m, nil
}

// normalize makes sb what reading it back would return.
func normalize(sb catalog.Sandbox) catalog.Sandbox {
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	if sb.Env == nil {
		sb.Env = map[string]string{}
	}
	for _, t := range []*time.Time{&sb.CreatedAt, &sb.UpdatedAt, &sb.ExpiresAt, &sb.StoppedAt} {
		if !t.IsZero() {
			*t = t.UTC().Truncate(time.Microsecond)
		}
	}
	return sb
}
