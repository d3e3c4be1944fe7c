// Package sqlite is the default catalog store: one SQLite file in the data
// directory (WAL mode, foreign keys on), through the pure Go driver
// modernc.org/sqlite. It serves one control-plane process; several replicas
// need catalog/postgres.
//
// Writes go through a single connection that begins every transaction with
// BEGIN IMMEDIATE: SQLite has one writer at a time anyway, and queueing
// writers in database/sql is fairer and cheaper than letting them spin on
// SQLITE_BUSY. IMMEDIATE (and the busy timeout) also keeps another process
// opening the same file correct. Reads use a separate pool of read-only
// connections, which WAL lets run alongside the writer.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/pandastack/pandastack/internal/catalog"
	"github.com/pandastack/pandastack/internal/catalog/internal/migration"
)

//go:embed migrations/*.sql
var migrations embed.FS

// busyTimeout bounds how long a statement waits for another process's lock.
const busyTimeout = 10 * time.Second

// timeLayout is how times are stored: UTC, microseconds, fixed width so
// that text order is time order.
const timeLayout = "2006-01-02T15:04:05.000000Z"

// Catalog is a catalog.Catalog in one SQLite file.
type Catalog struct {
	w *sql.DB // exactly one connection, BEGIN IMMEDIATE
	r *sql.DB // read-only connections

	closeOnce sync.Once
	closeErr  error
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

	c := &Catalog{w: w, r: r}
	if err := c.migrate(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("open sqlite catalog %s: %w", abs, err)
	}
	return c, nil
}

// migrate applies the embedded migrations not yet recorded in
// schema_migrations, each in its own IMMEDIATE transaction (so two
// processes opening a new file at once apply each exactly once).
func (c *Catalog) migrate(ctx context.Context) error {
	ms, err := migration.Load(migrations, "migrations")
	if err != nil {
		return err
	}
	if _, err := c.w.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
	) STRICT`); err != nil {
		return fmt.Errorf("create schema_migrations: %w", err)
	}
	var newest int
	if err := c.w.QueryRowContext(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&newest); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if newest > len(ms) {
		return fmt.Errorf("schema version %d is newer than this program's %d: run a newer panda", newest, len(ms))
	}
	for _, m := range ms {
		if err := c.apply(ctx, m); err != nil {
			return fmt.Errorf("apply migration %s: %w", m.Name, err)
		}
	}
	return nil
}

func (c *Catalog) apply(ctx context.Context, m migration.Migration) error {
	tx, err := c.w.BeginTx(ctx, nil)
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

// Close closes the database. It is idempotent.
func (c *Catalog) Close() error {
	c.closeOnce.Do(func() {
		c.closeErr = errors.Join(c.r.Close(), c.w.Close())
	})
	return c.closeErr
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

// Keys.

const keyCols = `id, name, hash, prefix, admin, max_sandboxes, max_memory_mib, created_at, revoked_at`

func (c *Catalog) CreateKey(ctx context.Context, k catalog.Key) error {
	_, err := c.w.ExecContext(ctx, `INSERT INTO keys (`+keyCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		k.ID, k.Name, k.Hash, k.Prefix, k.Admin, k.MaxSandboxes, k.MaxMemoryMiB, encTime(k.CreatedAt), encTime(k.RevokedAt))
	if err != nil {
		return fmt.Errorf("create key %s: %w", k.ID, classify(err))
	}
	return nil
}

func (c *Catalog) KeyByHash(ctx context.Context, hash string) (catalog.Key, error) {
	k, err := scanKey(c.r.QueryRowContext(ctx, `SELECT `+keyCols+` FROM keys WHERE hash = ?`, hash))
	if errors.Is(err, sql.ErrNoRows) {
		return catalog.Key{}, fmt.Errorf("get key by hash: %w", catalog.ErrNotFound)
	} else if err != nil {
		return catalog.Key{}, fmt.Errorf("get key by hash: %w", err)
	}
	return k, nil
}

func (c *Catalog) GetKey(ctx context.Context, id string) (catalog.Key, error) {
	k, err := scanKey(c.r.QueryRowContext(ctx, `SELECT `+keyCols+` FROM keys WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return catalog.Key{}, fmt.Errorf("get key %s: %w", id, catalog.ErrNotFound)
	} else if err != nil {
		return catalog.Key{}, fmt.Errorf("get key %s: %w", id, err)
	}
	return k, nil
}

func (c *Catalog) ListKeys(ctx context.Context) ([]catalog.Key, error) {
	rows, err := c.r.QueryContext(ctx, `SELECT `+keyCols+` FROM keys ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	defer rows.Close()
	var ks []catalog.Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("list keys: %w", err)
		}
		ks = append(ks, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	return ks, nil
}

func (c *Catalog) RevokeKey(ctx context.Context, id string, at time.Time) error {
	res, err := c.w.ExecContext(ctx, `UPDATE keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?`, encTime(at), id)
	if err != nil {
		return fmt.Errorf("revoke key %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("revoke key %s: %w", id, err)
	} else if n == 0 {
		return fmt.Errorf("revoke key %s: %w", id, catalog.ErrNotFound)
	}
	return nil
}

func (c *Catalog) CountKeys(ctx context.Context) (int, error) {
	var n int
	if err := c.r.QueryRowContext(ctx, `SELECT count(*) FROM keys`).Scan(&n); err != nil {
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
	tx, err := c.w.BeginTx(ctx, nil) // IMMEDIATE: holds the write lock from here
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var revoked sql.NullString
	err = tx.QueryRowContext(ctx, `SELECT revoked_at FROM keys WHERE id = ?`, sb.KeyID).Scan(&revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("key %s: %w", sb.KeyID, catalog.ErrNotFound)
	} else if err != nil {
		return err
	}
	if revoked.Valid {
		return fmt.Errorf("key %s is revoked: %w", sb.KeyID, catalog.ErrNotFound)
	}
	var count, mem int
	if err := tx.QueryRowContext(ctx, `SELECT count(*), coalesce(sum(memory_mib), 0) FROM sandboxes
		WHERE key_id = ? AND state <> 'stopped'`, sb.KeyID).Scan(&count, &mem); err != nil {
		return err
	}
	if err := catalog.CheckQuota(sb.KeyID, count, mem, sb.MemoryMiB, maxCount, maxMemoryMiB); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO sandboxes (`+sandboxCols+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, args...); err != nil {
		return classify(err)
	}
	return tx.Commit()
}

func (c *Catalog) GetSandbox(ctx context.Context, id string) (catalog.Sandbox, error) {
	sb, err := scanSandbox(c.r.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return catalog.Sandbox{}, fmt.Errorf("get sandbox %s: %w", id, catalog.ErrNotFound)
	} else if err != nil {
		return catalog.Sandbox{}, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	return sb, nil
}

func (c *Catalog) ListSandboxes(ctx context.Context, f catalog.SandboxFilter) ([]catalog.Sandbox, error) {
	var where []string
	var args []any
	if f.KeyID != "" {
		where = append(where, `key_id = ?`)
		args = append(args, f.KeyID)
	}
	if f.HostID != "" {
		where = append(where, `host_id = ?`)
		args = append(args, f.HostID)
	}
	if len(f.States) > 0 {
		where = append(where, `state IN (?`+strings.Repeat(`, ?`, len(f.States)-1)+`)`)
		for _, s := range f.States {
			args = append(args, s)
		}
	}
	for k, v := range f.Metadata {
		// json_each rather than a JSON path: any key works, dots and
		// quotes included.
		where = append(where, `EXISTS (SELECT 1 FROM json_each(sandboxes.metadata) AS m
			WHERE m.key = ? AND m.type = 'text' AND m.value = ?)`)
		args = append(args, k, v)
	}
	q := `SELECT ` + sandboxCols + ` FROM sandboxes`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, ` AND `)
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
	tx, err := c.w.BeginTx(ctx, nil)
	if err != nil {
		return catalog.Sandbox{}, err
	}
	defer tx.Rollback()
	sb, err := scanSandbox(tx.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return catalog.Sandbox{}, catalog.ErrNotFound
	} else if err != nil {
		return catalog.Sandbox{}, err
	}
	if err := fn(&sb); err != nil {
		return catalog.Sandbox{}, fnError{err}
	}
	if sb.ID != id {
		return catalog.Sandbox{}, fmt.Errorf("fn changed the id to %q", sb.ID)
	}
	args, err := sandboxArgs(sb)
	if err != nil {
		return catalog.Sandbox{}, err
	}
	// args[0] is the id: move it to the WHERE clause.
	if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET key_id = ?, template = ?, host_id = ?, state = ?,
		stop_reason = ?, memory_mib = ?, vcpus = ?, metadata = ?, env = ?, ttl_seconds = ?, on_expire = ?,
		parent_id = ?, snapshot_id = ?, created_at = ?, updated_at = ?, expires_at = ?, stopped_at = ?
		WHERE id = ?`, append(args[1:], id)...); err != nil {
		return catalog.Sandbox{}, classify(err)
	}
	if err := tx.Commit(); err != nil {
		return catalog.Sandbox{}, err
	}
	return normalize(sb), nil
}

func (c *Catalog) DeleteSandbox(ctx context.Context, id string) error {
	res, err := c.w.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	} else if n == 0 {
		return fmt.Errorf("delete sandbox %s: %w", id, catalog.ErrNotFound)
	}
	return nil
}

func (c *Catalog) Due(ctx context.Context, now time.Time) ([]catalog.Sandbox, error) {
	sbs, err := c.querySandboxes(ctx, `SELECT `+sandboxCols+` FROM sandboxes
		WHERE state <> 'stopped' AND expires_at IS NOT NULL AND expires_at <= ?
		ORDER BY expires_at, id`, encTime(now))
	if err != nil {
		return nil, fmt.Errorf("list due sandboxes: %w", err)
	}
	return sbs, nil
}

func (c *Catalog) PurgeStopped(ctx context.Context, before time.Time) (int, error) {
	res, err := c.w.ExecContext(ctx, `DELETE FROM sandboxes
		WHERE state = 'stopped' AND stopped_at IS NOT NULL AND stopped_at < ?`, encTime(before))
	if err != nil {
		return 0, fmt.Errorf("purge stopped sandboxes: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("purge stopped sandboxes: %w", err)
	}
	return int(n), nil
}

func (c *Catalog) querySandboxes(ctx context.Context, q string, args ...any) ([]catalog.Sandbox, error) {
	rows, err := c.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var sbs []catalog.Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		sbs = append(sbs, sb)
	}
	return sbs, rows.Err()
}

// Snapshots.

const snapshotCols = `id, key_id, sandbox_id, name, host_id, template, memory_mib, vcpus, size_bytes, created_at`

func (c *Catalog) CreateSnapshot(ctx context.Context, s catalog.Snapshot) error {
	_, err := c.w.ExecContext(ctx, `INSERT INTO snapshots (`+snapshotCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		s.ID, s.KeyID, s.SandboxID, s.Name, s.HostID, s.Template, s.MemoryMiB, s.VCPUs, s.SizeBytes, encTime(s.CreatedAt))
	if err != nil {
		return fmt.Errorf("create snapshot %s: %w", s.ID, classify(err))
	}
	return nil
}

func (c *Catalog) GetSnapshot(ctx context.Context, id string) (catalog.Snapshot, error) {
	s, err := scanSnapshot(c.r.QueryRowContext(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return catalog.Snapshot{}, fmt.Errorf("get snapshot %s: %w", id, catalog.ErrNotFound)
	} else if err != nil {
		return catalog.Snapshot{}, fmt.Errorf("get snapshot %s: %w", id, err)
	}
	return s, nil
}

func (c *Catalog) ListSnapshots(ctx context.Context, keyID string) ([]catalog.Snapshot, error) {
	q, args := `SELECT `+snapshotCols+` FROM snapshots`, []any(nil)
	if keyID != "" {
		q, args = q+` WHERE key_id = ?`, append(args, keyID)
	}
	rows, err := c.r.QueryContext(ctx, q+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	defer rows.Close()
	var ss []catalog.Snapshot
	for rows.Next() {
		s, err := scanSnapshot(rows)
		if err != nil {
			return nil, fmt.Errorf("list snapshots: %w", err)
		}
		ss = append(ss, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	return ss, nil
}

func (c *Catalog) DeleteSnapshot(ctx context.Context, id string) error {
	res, err := c.w.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	} else if n == 0 {
		return fmt.Errorf("delete snapshot %s: %w", id, catalog.ErrNotFound)
	}
	return nil
}

// Encoding.

type scanner interface{ Scan(dest ...any) error }

func scanKey(row scanner) (catalog.Key, error) {
	var k catalog.Key
	var created string
	var revoked sql.NullString
	if err := row.Scan(&k.ID, &k.Name, &k.Hash, &k.Prefix, &k.Admin, &k.MaxSandboxes, &k.MaxMemoryMiB, &created, &revoked); err != nil {
		return catalog.Key{}, err
	}
	var err error
	if k.CreatedAt, err = decTime(created); err != nil {
		return catalog.Key{}, err
	}
	if k.RevokedAt, err = decTime(revoked.String); err != nil {
		return catalog.Key{}, err
	}
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

func scanSandbox(row scanner) (catalog.Sandbox, error) {
	var sb catalog.Sandbox
	var md, env string
	var created string
	var updated, expires, stopped sql.NullString
	if err := row.Scan(&sb.ID, &sb.KeyID, &sb.Template, &sb.HostID, &sb.State, &sb.StopReason, &sb.MemoryMiB, &sb.VCPUs,
		&md, &env, &sb.TTLSeconds, &sb.OnExpire, &sb.ParentID, &sb.SnapshotID,
		&created, &updated, &expires, &stopped); err != nil {
		return catalog.Sandbox{}, err
	}
	var err error
	if sb.Metadata, err = decMap(md); err != nil {
		return catalog.Sandbox{}, fmt.Errorf("decode metadata of %s: %w", sb.ID, err)
	}
	if sb.Env, err = decMap(env); err != nil {
		return catalog.Sandbox{}, fmt.Errorf("decode env of %s: %w", sb.ID, err)
	}
	for _, t := range []struct {
		dst *time.Time
		s   string
	}{{&sb.CreatedAt, created}, {&sb.UpdatedAt, updated.String}, {&sb.ExpiresAt, expires.String}, {&sb.StoppedAt, stopped.String}} {
		if *t.dst, err = decTime(t.s); err != nil {
			return catalog.Sandbox{}, err
		}
	}
	return sb, nil
}

func scanSnapshot(row scanner) (catalog.Snapshot, error) {
	var s catalog.Snapshot
	var created string
	if err := row.Scan(&s.ID, &s.KeyID, &s.SandboxID, &s.Name, &s.HostID, &s.Template, &s.MemoryMiB, &s.VCPUs, &s.SizeBytes, &created); err != nil {
		return catalog.Snapshot{}, err
	}
	var err error
	s.CreatedAt, err = decTime(created)
	return s, err
}

// encTime returns t as stored: NULL for the zero time.
func encTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(timeLayout)
}

// decTime parses a stored time; "" (from NULL) is the zero time.
func decTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(timeLayout, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("decode time: %w", err)
	}
	return t, nil
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
