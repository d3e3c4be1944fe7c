// Package sqlstore is the part of the catalog's SQL stores that does not
// depend on the database: the queries, the row encoding and the
// transactions behind every catalog.Catalog method, written once against
// database/sql. catalog/sqlite and catalog/postgres keep what differs:
// opening the database (pragmas, pools), their migrations and how those are
// locked, classifying their driver's errors, and the Dialect below.
//
// Both stores keep one schema (see their migrations): the same tables and
// columns, ids that sort bytewise (the schema's collation, so ORDER BY
// created_at, id needs nothing here), maps as JSON objects. Only the
// column types differ, and Dialect says how to write to them.
//
// A Store is safe for concurrent use. Its transactions run at the
// database's default isolation; what makes a quota reservation and an
// update of a sandbox atomic is Dialect.LockRow with the writer the store
// gives New.
package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// Dialect is what the SQL of one database needs that the other's does not.
type Dialect struct {
	// Placeholder returns the nth (from 1) query parameter; nil means
	// "?" for every one (SQLite). Queries here, MetadataMatch's included,
	// are written with "?" parameters and rewritten with it, so "?" must
	// not appear in them otherwise (not even PostgreSQL's jsonb operator).
	Placeholder func(n int) string
	// LockRow ends the SELECT of the row a write transaction depends on:
	// the key's row when reserving a sandbox, the sandbox's row when
	// updating it. It must keep any other transaction from changing that
	// row, or from locking it in turn, until this one ends: PostgreSQL's
	// " FOR UPDATE", which is what serializes reservations of one key
	// across replicas. It is "" where the transaction already holds the
	// database's only write lock from its BEGIN (SQLite's BEGIN
	// IMMEDIATE, which the sqlite package sets on its writer).
	LockRow string
	// TextTimes stores times as fixed-width UTC text (TimeLayout), for a
	// database without a time type (SQLite); otherwise as time.Time.
	// Either way, stored times are UTC with microsecond precision.
	TextTimes bool
	// MetadataMatch returns the condition (with "?" parameters, and their
	// arguments) that a row of sandboxes has every key of m with that
	// value in its metadata column, a JSON object of strings. m is not
	// empty.
	MetadataMatch func(m map[string]string) (cond string, args []any, err error)
	// Classify returns err, from the driver, as a catalog error class
	// where it is one: a unique or primary key violation wraps
	// catalog.ErrConflict; a foreign key violation (an unknown key id)
	// wraps catalog.ErrNotFound. Other errors come back unchanged.
	Classify func(err error) error
}

// bind rewrites q's "?" parameters with d.Placeholder.
func (d Dialect) bind(q string) string {
	if d.Placeholder == nil {
		return q
	}
	var b strings.Builder
	n := 0
	for {
		i := strings.IndexByte(q, '?')
		if i < 0 {
			b.WriteString(q)
			return b.String()
		}
		n++
		b.WriteString(q[:i])
		b.WriteString(d.Placeholder(n))
		q = q[i+1:]
	}
}

// Numbered is the Placeholder of PostgreSQL: $1, $2, ...
func Numbered(n int) string { return "$" + strconv.Itoa(n) }

// Store implements every catalog.Catalog method; a store embeds it.
type Store struct {
	w, r    *sql.DB
	d       Dialect
	release func() error

	closeOnce sync.Once
	closeErr  error
}

// New returns a Store that runs its writes (statements and transactions)
// on w and its reads on r, which may be w. The store must make w's
// transactions meet d.LockRow's contract. The first Close calls release,
// which closes w, r and whatever else the store opened.
func New(w, r *sql.DB, d Dialect, release func() error) *Store {
	return &Store{w: w, r: r, d: d, release: release}
}

// Close releases the store. It is idempotent: later calls return the
// first one's error.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.release() })
	return s.closeErr
}

// exec runs a statement on the writer and returns how many rows it
// changed. Errors say what was being done.
func (s *Store) exec(ctx context.Context, what, q string, args ...any) (int64, error) {
	res, err := s.w.ExecContext(ctx, s.d.bind(q), args...)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, s.d.Classify(err))
	}
	return n, nil
}

// changeOne runs a statement that changes the one row with an id:
// ErrNotFound if it changes none.
func (s *Store) changeOne(ctx context.Context, what, q string, args ...any) error {
	n, err := s.exec(ctx, what, q, args...)
	if err == nil && n == 0 {
		err = fmt.Errorf("%s: %w", what, catalog.ErrNotFound)
	}
	return err
}

// inTx runs fn in a transaction on the writer and commits if it returns nil.
func (s *Store) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// get reads the one row of q with scan: ErrNotFound if there is none.
// Errors say what was being done.
func get[T any](ctx context.Context, s *Store, what string, scan func(scanner) (T, error), q string, args ...any) (T, error) {
	t, err := scan(s.r.QueryRowContext(ctx, s.d.bind(q), args...))
	if err != nil {
		var zero T
		return zero, fmt.Errorf("%s: %w", what, notFound(err))
	}
	return t, nil
}

// list reads every row of q with scan. Errors say what was being done.
func list[T any](ctx context.Context, s *Store, what string, scan func(scanner) (T, error), q string, args ...any) ([]T, error) {
	rows, err := s.r.QueryContext(ctx, s.d.bind(q), args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	var ts []T
	for rows.Next() {
		t, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		ts = append(ts, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return ts, nil
}

// notFound turns sql.ErrNoRows into catalog.ErrNotFound.
func notFound(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return catalog.ErrNotFound
	}
	return err
}

// Keys.

func (s *Store) CreateKey(ctx context.Context, k catalog.Key) error {
	_, err := s.exec(ctx, "create key "+k.ID,
		`INSERT INTO keys (`+keyCols+`) VALUES (`+params(keyColumns)+`)`, s.keyArgs(k)...)
	return err
}

func (s *Store) KeyByHash(ctx context.Context, hash string) (catalog.Key, error) {
	return get(ctx, s, "get key by hash", scanKey, `SELECT `+keyCols+` FROM keys WHERE hash = ?`, hash)
}

func (s *Store) GetKey(ctx context.Context, id string) (catalog.Key, error) {
	return get(ctx, s, "get key "+id, scanKey, `SELECT `+keyCols+` FROM keys WHERE id = ?`, id)
}

func (s *Store) ListKeys(ctx context.Context) ([]catalog.Key, error) {
	return list(ctx, s, "list keys", scanKey, `SELECT `+keyCols+` FROM keys ORDER BY created_at, id`)
}

func (s *Store) RevokeKey(ctx context.Context, id string, at time.Time) error {
	return s.changeOne(ctx, "revoke key "+id,
		`UPDATE keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?`, s.timeArg(at), id)
}

func (s *Store) CountKeys(ctx context.Context) (int, error) {
	var n int
	if err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM keys`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count keys: %w", err)
	}
	return n, nil
}

// Sandboxes.

func (s *Store) ReserveSandbox(ctx context.Context, sb catalog.Sandbox, lim catalog.Limits) error {
	args, err := s.sandboxArgs(sb)
	if err != nil {
		return fmt.Errorf("reserve sandbox %s: %w", sb.ID, err)
	}
	err = s.withinQuota(ctx, sb.KeyID, catalog.UsageOf(sb), lim, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, s.d.bind(`INSERT INTO sandboxes (`+sandboxCols+`)
			VALUES (`+params(sandboxColumns)+`)`), args...); err != nil {
			return s.d.Classify(err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("reserve sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// withinQuota runs insert in a transaction if the key (which must exist,
// unrevoked) can take req more under lim, checked in the same transaction.
func (s *Store) withinQuota(ctx context.Context, keyID string, req catalog.Usage, lim catalog.Limits, insert func(*sql.Tx) error) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		revoked, err := s.lockKey(ctx, tx, keyID)
		if err != nil {
			return err
		}
		if err := s.checkQuota(ctx, tx, keyID, revoked, req, lim); err != nil {
			return err
		}
		return insert(tx)
	})
}

// lockKey locks the key's row (or the whole database) in tx, which
// serializes every reservation for the key until tx ends, so that a
// count of its usage cannot go stale before tx writes. It returns when
// the key was revoked (zero: it is not); ErrNotFound if there is none.
func (s *Store) lockKey(ctx context.Context, tx *sql.Tx, keyID string) (time.Time, error) {
	var revoked time.Time
	err := tx.QueryRowContext(ctx, s.d.bind(`SELECT revoked_at FROM keys WHERE id = ?`+s.d.LockRow), keyID).
		Scan(timeDest{&revoked})
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, fmt.Errorf("key %s: %w", keyID, catalog.ErrNotFound)
	}
	return revoked, err
}

// checkQuota returns nil if the key, whose row tx locked (lockKey), is
// not revoked and can take req more under lim.
func (s *Store) checkQuota(ctx context.Context, tx *sql.Tx, keyID string, revoked time.Time, req catalog.Usage, lim catalog.Limits) error {
	if !revoked.IsZero() {
		return fmt.Errorf("key %s is revoked: %w", keyID, catalog.ErrNotFound)
	}
	var used catalog.Usage
	var disk, paused, snaps, volumes int64
	if err := tx.QueryRowContext(ctx, s.d.bind(`SELECT count(*), coalesce(sum(memory_mib), 0), coalesce(sum(vcpus), 0),
		coalesce(sum(disk_mib), 0), coalesce(sum(paused_bytes), 0) FROM sandboxes
		WHERE key_id = ? AND state <> 'stopped'`), keyID).Scan(&used.Sandboxes, &used.MemoryMiB, &used.VCPUs, &disk, &paused); err != nil {
		return err
	}
	if err := tx.QueryRowContext(ctx, s.d.bind(`SELECT coalesce(sum(size_bytes), 0) FROM snapshots WHERE key_id = ?`), keyID).Scan(&snaps); err != nil {
		return err
	}
	if err := tx.QueryRowContext(ctx, s.d.bind(`SELECT count(*), coalesce(sum(size_mib), 0) FROM volumes WHERE key_id = ?`), keyID).
		Scan(&used.Volumes, &volumes); err != nil {
		return err
	}
	used.DiskMiB = int(disk) + catalog.MiBCeil(paused+snaps) + int(volumes)
	return catalog.CheckQuota(keyID, used, req, lim)
}

func (s *Store) GetSandbox(ctx context.Context, id string) (catalog.Sandbox, error) {
	return get(ctx, s, "get sandbox "+id, scanSandbox, `SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`, id)
}

func (s *Store) ListSandboxes(ctx context.Context, f catalog.SandboxFilter) ([]catalog.Sandbox, error) {
	var where []string
	var args []any
	if f.KeyID != "" {
		where, args = append(where, `key_id = ?`), append(args, f.KeyID)
	}
	if f.HostID != "" {
		where, args = append(where, `host_id = ?`), append(args, f.HostID)
	}
	if len(f.States) > 0 {
		where = append(where, `state IN (?`+strings.Repeat(`, ?`, len(f.States)-1)+`)`)
		for _, st := range f.States {
			args = append(args, st)
		}
	}
	if len(f.Metadata) > 0 {
		cond, mdArgs, err := s.d.MetadataMatch(f.Metadata)
		if err != nil {
			return nil, fmt.Errorf("list sandboxes: match metadata: %w", err)
		}
		where, args = append(where, cond), append(args, mdArgs...)
	}
	q := `SELECT ` + sandboxCols + ` FROM sandboxes`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, ` AND `)
	}
	return list(ctx, s, "list sandboxes", scanSandbox, q+` ORDER BY created_at, id`, args...)
}

func (s *Store) UpdateSandbox(ctx context.Context, id string, fn func(*catalog.Sandbox) error) (catalog.Sandbox, error) {
	sb, err := s.update(ctx, id, fn)
	if err != nil {
		return catalog.Sandbox{}, updateError(err, "update sandbox "+id)
	}
	return sb, nil
}

// fnError carries UpdateSandbox's fn error out unwrapped.
type fnError struct{ err error }

func (e fnError) Error() string { return e.err.Error() }

// updateError is the error of an update transaction that failed with
// err: its fn's own error unwrapped, or err saying what was being done.
func updateError(err error, what string) error {
	var fe fnError
	if errors.As(err, &fe) {
		return fe.err
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (s *Store) update(ctx context.Context, id string, fn func(*catalog.Sandbox) error) (catalog.Sandbox, error) {
	var sb catalog.Sandbox
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		sb, err = scanSandbox(tx.QueryRowContext(ctx, s.d.bind(`SELECT `+sandboxCols+` FROM sandboxes WHERE id = ?`+s.d.LockRow), id))
		if err != nil {
			return notFound(err)
		}
		if err := fn(&sb); err != nil {
			return fnError{err}
		}
		if sb.ID != id {
			return fmt.Errorf("fn changed the id to %q", sb.ID)
		}
		args, err := s.sandboxArgs(sb)
		if err != nil {
			return err
		}
		// args[0] is the id: it moves to the WHERE clause.
		if _, err := tx.ExecContext(ctx, s.d.bind(`UPDATE sandboxes SET `+sandboxSet+` WHERE id = ?`), append(args[1:], id)...); err != nil {
			return s.d.Classify(err)
		}
		return nil
	})
	if err != nil {
		return catalog.Sandbox{}, err
	}
	return normalize(sb), nil
}

func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	return s.changeOne(ctx, "delete sandbox "+id, `DELETE FROM sandboxes WHERE id = ?`, id)
}

func (s *Store) Due(ctx context.Context, now time.Time) ([]catalog.Sandbox, error) {
	return list(ctx, s, "list due sandboxes", scanSandbox, `SELECT `+sandboxCols+` FROM sandboxes
		WHERE state <> 'stopped' AND expires_at IS NOT NULL AND expires_at <= ?
		ORDER BY expires_at, id`, s.timeArg(now))
}

func (s *Store) PurgeStopped(ctx context.Context, before time.Time) (int, error) {
	n, err := s.exec(ctx, "purge stopped sandboxes", `DELETE FROM sandboxes
		WHERE state = 'stopped' AND stopped_at IS NOT NULL AND stopped_at < ?`, s.timeArg(before))
	return int(n), err
}

// Snapshots.

func (s *Store) CreateSnapshot(ctx context.Context, sn catalog.Snapshot, lim catalog.Limits) error {
	err := s.withinQuota(ctx, sn.KeyID, catalog.Usage{DiskMiB: catalog.MiBCeil(sn.SizeBytes)}, lim, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, s.d.bind(`INSERT INTO snapshots (`+snapshotCols+`) VALUES (`+params(snapshotColumns)+`)`),
			s.snapshotArgs(sn)...); err != nil {
			return s.d.Classify(err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("create snapshot %s: %w", sn.ID, err)
	}
	return nil
}

func (s *Store) GetSnapshot(ctx context.Context, id string) (catalog.Snapshot, error) {
	return get(ctx, s, "get snapshot "+id, scanSnapshot, `SELECT `+snapshotCols+` FROM snapshots WHERE id = ?`, id)
}

func (s *Store) ListSnapshots(ctx context.Context, keyID string) ([]catalog.Snapshot, error) {
	q, args := `SELECT `+snapshotCols+` FROM snapshots`, []any(nil)
	if keyID != "" {
		q, args = q+` WHERE key_id = ?`, append(args, keyID)
	}
	return list(ctx, s, "list snapshots", scanSnapshot, q+` ORDER BY created_at, id`, args...)
}

func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	return s.changeOne(ctx, "delete snapshot "+id, `DELETE FROM snapshots WHERE id = ?`, id)
}

// Hosts.

func (s *Store) PutHost(ctx context.Context, h catalog.Host) error {
	args, err := s.hostArgs(h)
	if err != nil {
		return fmt.Errorf("put host %s: %w", h.ID, err)
	}
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, s.d.bind(`DELETE FROM hosts WHERE id = ?`), h.ID); err != nil {
			return fmt.Errorf("put host %s: %w", h.ID, s.d.Classify(err))
		}
		if _, err := tx.ExecContext(ctx, s.d.bind(`INSERT INTO hosts (`+hostCols+`) VALUES (`+params(hostColumns)+`)`), args...); err != nil {
			return fmt.Errorf("put host %s: %w", h.ID, s.d.Classify(err))
		}
		return nil
	})
}

func (s *Store) GetHost(ctx context.Context, id string) (catalog.Host, error) {
	return get(ctx, s, "get host "+id, scanHost, `SELECT `+hostCols+` FROM hosts WHERE id = ?`, id)
}

func (s *Store) ListHosts(ctx context.Context) ([]catalog.Host, error) {
	return list(ctx, s, "list hosts", scanHost, `SELECT `+hostCols+` FROM hosts ORDER BY id`)
}

func (s *Store) UpdateHost(ctx context.Context, id string, fn func(*catalog.Host) error) (catalog.Host, error) {
	var h catalog.Host
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		h, err = scanHost(tx.QueryRowContext(ctx, s.d.bind(`SELECT `+hostCols+` FROM hosts WHERE id = ?`+s.d.LockRow), id))
		if err != nil {
			return notFound(err)
		}
		if err := fn(&h); err != nil {
			return fnError{err}
		}
		if h.ID != id {
			return fmt.Errorf("fn changed the id to %q", h.ID)
		}
		args, err := s.hostArgs(h)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, s.d.bind(`UPDATE hosts SET `+hostSet+` WHERE id = ?`), append(args[1:], id)...); err != nil {
			return s.d.Classify(err)
		}
		return nil
	})
	if err != nil {
		return catalog.Host{}, updateError(err, "update host "+id)
	}
	return normalizeHost(h), nil
}

func (s *Store) DeleteHost(ctx context.Context, id string) error {
	return s.changeOne(ctx, "delete host "+id, `DELETE FROM hosts WHERE id = ?`, id)
}
