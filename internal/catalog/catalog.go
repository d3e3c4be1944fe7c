// Package catalog defines the control plane's durable state: API keys,
// sandboxes and snapshots, and the contract every store of them meets. The
// implementations live in subpackages (catalog/sqlite, the default, a file in
// the data directory; catalog/postgres, shared by several control-plane
// replicas); they import this package, never the reverse. catalog/catalogtest
// is the conformance suite both pass, and catalog/opencatalog picks one from
// a URL.
//
// A catalog has no clock: every time it stores or compares against is given
// by the caller. Times are kept in UTC with microsecond precision and come
// back in UTC; a zero time.Time means "unset" and is stored as NULL.
package catalog

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Error classes. Methods wrap them with detail; test with errors.Is.
var (
	// ErrNotFound: no key, sandbox or snapshot with that id (or hash).
	ErrNotFound = errors.New("not found")
	// ErrConflict: a key, sandbox or snapshot with that id (or a key with
	// that hash) already exists.
	ErrConflict = errors.New("already exists")
	// ErrQuota: ReserveSandbox would take the key over one of its limits.
	// The error is a *QuotaError.
	ErrQuota = errors.New("quota exceeded")
)

// Sandbox states. A stopped sandbox is kept (for listing and its stop
// reason) until PurgeStopped removes it; it no longer counts against quotas
// and never leaves that state.
const (
	StateStarting = "starting"
	StateRunning  = "running"
	StatePaused   = "paused"
	StateStopped  = "stopped"
)

// Key is an API key. The secret itself is never stored, only its hash.
type Key struct {
	ID           string // public id, e.g. "key_" + 12 lowercase alnum
	Name         string
	Hash         string // hex SHA-256 of the secret; unique
	Prefix       string // first characters of the secret, for display
	Admin        bool
	MaxSandboxes int // 0 = server default
	MaxMemoryMiB int // 0 = server default
	CreatedAt    time.Time
	RevokedAt    time.Time // zero = active
}

// Revoked reports whether the key has been revoked.
func (k Key) Revoked() bool { return !k.RevokedAt.IsZero() }

// Sandbox is one sandbox's record. Metadata and Env are never nil when
// returned by a Catalog (an empty map when there are none).
type Sandbox struct {
	ID         string
	KeyID      string // the key that created it; must exist
	Template   string
	HostID     string
	State      string // StateStarting, StateRunning, StatePaused, StateStopped
	StopReason string // "killed", "expired", "vmm_exited", "host_restarted", ...
	MemoryMiB  int
	VCPUs      int
	Metadata   map[string]string
	Env        map[string]string
	TTLSeconds int
	OnExpire   string // "kill" or "pause"
	ParentID   string // the sandbox it was forked from, if any
	SnapshotID string // the snapshot it was restored from, if any
	CreatedAt  time.Time
	UpdatedAt  time.Time // zero = unset
	ExpiresAt  time.Time // zero = never
	StoppedAt  time.Time // zero = not stopped
}

// Snapshot is a saved sandbox (memory and disk) that new sandboxes can
// start from.
type Snapshot struct {
	ID        string
	KeyID     string // the key that owns it; must exist
	SandboxID string // the sandbox it was taken from (which may be gone)
	Name      string
	HostID    string
	Template  string
	MemoryMiB int
	VCPUs     int
	SizeBytes int64
	CreatedAt time.Time
}

// SandboxFilter selects sandboxes in ListSandboxes. The zero value selects
// all of them.
type SandboxFilter struct {
	KeyID    string            // "" = any key
	States   []string          // empty = any state
	Metadata map[string]string // all pairs must be in the sandbox's metadata
	HostID   string            // "" = any host
}

// Catalog stores keys, sandboxes and snapshots. All methods are safe for
// concurrent use, including by several processes sharing one store where
// the implementation allows it (PostgreSQL). CreatedAt must be set on
// everything created. Strings must be valid UTF-8 without NUL bytes
// (PostgreSQL cannot store NUL in text).
type Catalog interface {
	// CreateKey stores a new key. ErrConflict if its id or hash is taken.
	CreateKey(ctx context.Context, k Key) error
	// KeyByHash returns the key with that hash, revoked or not (a revoked
	// key has RevokedAt set). ErrNotFound if there is none.
	KeyByHash(ctx context.Context, hash string) (Key, error)
	// GetKey returns the key with that id, revoked or not. ErrNotFound.
	GetKey(ctx context.Context, id string) (Key, error)
	// ListKeys returns every key, revoked included, oldest first (by
	// CreatedAt, then ID).
	ListKeys(ctx context.Context) ([]Key, error)
	// RevokeKey marks the key revoked at the given time. Revoking a revoked
	// key succeeds and keeps the first time. ErrNotFound. It does not touch
	// the key's sandboxes: stopping them is the caller's job.
	RevokeKey(ctx context.Context, id string, at time.Time) error
	// CountKeys returns the number of keys, revoked included.
	CountKeys(ctx context.Context) (int, error)

	// ReserveSandbox inserts sb if its key stays within its limits, checked
	// and inserted atomically (also across processes sharing the store).
	// The key's usage is its sandboxes not in StateStopped: their number
	// plus one must be <= maxCount, and their MemoryMiB summed plus
	// sb.MemoryMiB must be <= maxMemoryMiB. A limit <= 0 means unlimited.
	// Errors: ErrQuota (a *QuotaError), ErrConflict if the id is taken,
	// ErrNotFound if sb.KeyID is unknown or revoked.
	ReserveSandbox(ctx context.Context, sb Sandbox, maxCount, maxMemoryMiB int) error
	// GetSandbox returns the sandbox. ErrNotFound.
	GetSandbox(ctx context.Context, id string) (Sandbox, error)
	// ListSandboxes returns the sandboxes matching f, oldest first (by
	// CreatedAt, then ID).
	ListSandboxes(ctx context.Context, f SandboxFilter) ([]Sandbox, error)
	// UpdateSandbox reads the sandbox, calls fn on it and writes the result
	// back, all in one transaction: concurrent updates of one sandbox are
	// serialized and none is lost. If fn returns an error nothing is
	// written and UpdateSandbox returns that error unwrapped. fn may change
	// any field but ID; it must be quick and must not call the Catalog (it
	// runs while the store is locked). Quotas are not checked again.
	// Returns the sandbox as written. ErrNotFound.
	UpdateSandbox(ctx context.Context, id string, fn func(*Sandbox) error) (Sandbox, error)
	// DeleteSandbox removes the sandbox's record. ErrNotFound.
	DeleteSandbox(ctx context.Context, id string) error
	// Due returns the sandboxes not in StateStopped whose ExpiresAt is set
	// and <= now, soonest expiry first (then by ID).
	Due(ctx context.Context, now time.Time) ([]Sandbox, error)
	// PurgeStopped deletes the sandboxes in StateStopped whose StoppedAt is
	// set and before the given time, and returns how many it deleted.
	PurgeStopped(ctx context.Context, before time.Time) (int, error)

	// CreateSnapshot stores a new snapshot. ErrConflict if the id is taken,
	// ErrNotFound if s.KeyID is unknown.
	CreateSnapshot(ctx context.Context, s Snapshot) error
	// GetSnapshot returns the snapshot. ErrNotFound.
	GetSnapshot(ctx context.Context, id string) (Snapshot, error)
	// ListSnapshots returns the key's snapshots ("" = every key's), oldest
	// first (by CreatedAt, then ID).
	ListSnapshots(ctx context.Context, keyID string) ([]Snapshot, error)
	// DeleteSnapshot removes the snapshot's record. ErrNotFound.
	DeleteSnapshot(ctx context.Context, id string) error

	// Close releases the store. It is idempotent; other methods must not be
	// called after it.
	Close() error
}

// QuotaError is the error ReserveSandbox returns when a key is at one of
// its limits. It matches ErrQuota with errors.Is.
type QuotaError struct {
	KeyID     string
	Limit     string // QuotaSandboxes or QuotaMemory
	Used      int    // sandboxes, or MiB, the key already holds
	Requested int    // 1, or the new sandbox's MiB
	Max       int    // the limit
}

// Limits named by QuotaError.Limit.
const (
	QuotaSandboxes = "sandboxes"
	QuotaMemory    = "memory"
)

func (e *QuotaError) Error() string {
	if e.Limit == QuotaMemory {
		return fmt.Sprintf("memory quota exceeded: key %s uses %d MiB, %d MiB more would pass its limit of %d MiB",
			e.KeyID, e.Used, e.Requested, e.Max)
	}
	return fmt.Sprintf("sandbox quota exceeded: key %s has %d of %d sandboxes", e.KeyID, e.Used, e.Max)
}

// Unwrap makes a QuotaError match ErrQuota.
func (e *QuotaError) Unwrap() error { return ErrQuota }

// CheckQuota returns a *QuotaError if a key holding count sandboxes with
// memMiB of memory cannot take one more of reqMiB under the limits (<= 0:
// unlimited). Implementations call it inside their reserving transaction.
func CheckQuota(keyID string, count, memMiB, reqMiB, maxCount, maxMemoryMiB int) error {
	if maxCount > 0 && count+1 > maxCount {
		return &QuotaError{KeyID: keyID, Limit: QuotaSandboxes, Used: count, Requested: 1, Max: maxCount}
	}
	if maxMemoryMiB > 0 && memMiB+reqMiB > maxMemoryMiB {
		return &QuotaError{KeyID: keyID, Limit: QuotaMemory, Used: memMiB, Requested: reqMiB, Max: maxMemoryMiB}
	}
	return nil
}
