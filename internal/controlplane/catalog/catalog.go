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
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/pandastack/pandastack/internal/contract/errs"

	"github.com/pandastack/pandastack/internal/contract/lifecycle"
)

// Errors, each of a class of internal/contract/errs. Methods wrap them
// with detail; test with errors.Is.
var (
	// ErrNotFound: no key, sandbox, snapshot or volume with that id (or
	// hash, or name).
	ErrNotFound = errs.New(errs.NotFound, "not found")
	// ErrConflict: a key, sandbox, snapshot or volume with that id (or a
	// key with that hash, or a volume of the key with that name) already
	// exists.
	ErrConflict = errs.New(errs.Conflict, "already exists")
	// ErrQuota: ReserveSandbox (CreateSnapshot, CreateVolumes,
	// ResizeVolume) would take the key over one of its limits.
	// The error is a *QuotaError.
	ErrQuota = errs.New(errs.QuotaExceeded, "quota exceeded")
)

// Sandbox states (the lifecycle package's, as stored). A stopped sandbox
// is kept (for listing and its stop reason) until PurgeStopped removes it;
// it no longer counts against quotas and never leaves that state.
const (
	StateStarting = string(lifecycle.Starting)
	StateRunning  = string(lifecycle.Running)
	StatePausing  = string(lifecycle.Pausing)
	StatePaused   = string(lifecycle.Paused)
	StateResuming = string(lifecycle.Resuming)
	StateStopping = string(lifecycle.Stopping)
	StateStopped  = string(lifecycle.Stopped)
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
	MaxVCPUs     int // 0 = server default
	MaxDiskMiB   int // 0 = server default
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
	State      string // one of the State constants
	StopReason string // "killed", "expired", "vmm_exited", "host_restarted", ...
	// LastError is the user-facing message of the last operation that
	// failed and left the sandbox as it was (a resume that left it paused).
	LastError string
	MemoryMiB int
	VCPUs     int
	// DiskMiB is the size of the sandbox's disk (what it may fill);
	// PausedBytes what its pause capture holds on disk while it is paused.
	DiskMiB     int
	PausedBytes int64
	// Network is the sandbox's egress policy (see package network for its
	// meaning); stored as given.
	Network    Network
	Metadata   map[string]string
	Env        map[string]string
	TTLSeconds int
	OnExpire   string // "kill" or "pause"
	ParentID   string // the sandbox it was forked from, if any
	SnapshotID string // the snapshot it was restored from, if any
	// Volumes are the volumes it mounts, in the order asked; nil when
	// none (a Catalog returns nil, never an empty slice).
	Volumes   []VolumeMount
	CreatedAt time.Time
	UpdatedAt time.Time // zero = unset
	ExpiresAt time.Time // zero = never
	StoppedAt time.Time // zero = not stopped
}

// Network is a sandbox's egress policy as stored: whether it reaches the
// internet, and the CIDRs, addresses or domain names it may or may not
// reach beyond that. Lists are never nil when returned by a Catalog.
type Network struct {
	Internet bool     `json:"internet"`
	AllowOut []string `json:"allow_out"`
	DenyOut  []string `json:"deny_out"`
}

// VolumeMount is a volume a sandbox mounts: the volume's id, the absolute
// path in the guest, and whether the guest may only read it.
type VolumeMount struct {
	VolumeID string `json:"volume_id"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// Volume is a key's persistent directory tree that sandboxes mount. It
// lives on one host (its home, HostID), which stores its files; its size
// counts against its key's disk quota whether or not a sandbox mounts it.
type Volume struct {
	ID    string // "vol_" + 16 lowercase alnum (host.NewVolumeID)
	KeyID string // the key that owns it; must exist
	// Name is unique among the key's volumes ([a-z0-9][a-z0-9._-]{0,62},
	// checked by the control plane).
	Name   string
	HostID string
	// SizeMiB is its limit; UsedBytes what its files held when the
	// control plane last asked its host.
	SizeMiB   int
	UsedBytes int64
	// ParentID is the volume it was branched from (a fork's volume_mode
	// branch), "" if none; a volume whose parent is deleted keeps the id.
	ParentID  string
	CreatedAt time.Time
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

// Host states as stored. A host is ready when it registers; draining
// when an operator asks (no new placements); lost when it stopped
// heartbeating for longer than the control plane allows. A lost host that
// heartbeats again is ready again (or draining, if it was).
const (
	HostReady    = "ready"
	HostDraining = "draining"
	HostLost     = "lost"
)

// Host is a host agent registered with the control plane.
type Host struct {
	ID  string
	URL string // its host API, https://HOST:PORT
	// Token is the agent's own host API token: the control plane's
	// credential for it (a secret, as the catalog's other contents).
	Token    string
	CACert   string // PEM of the agent's CA, the only one trusted for it
	State    string // one of the Host* constants
	Draining bool   // drain asked: stays set while the host is lost
	Capacity HostCapacity
	// RegisteredAt is the first registration; HeartbeatAt the last
	// heartbeat (zero: none yet).
	RegisteredAt time.Time
	HeartbeatAt  time.Time
}

// HostCapacity is what a host offers, as it reported it at registration.
type HostCapacity struct {
	CPUs      int    `json:"cpus"`
	MemoryMiB int64  `json:"memory_mib"`
	DiskMiB   int64  `json:"disk_mib"`
	Accel     string `json:"accel"`
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
	// The key's usage (see Usage) is its sandboxes not in StateStopped
	// and its snapshots; with sb added, each must stay within lim.
	// Errors: ErrQuota (a *QuotaError), ErrConflict if the id is taken,
	// ErrNotFound if sb.KeyID is unknown or revoked.
	ReserveSandbox(ctx context.Context, sb Sandbox, lim Limits) error
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

	// CreateSnapshot stores a new snapshot if its key's disk usage stays
	// within lim.DiskMiB with it (checked and inserted atomically).
	// ErrQuota (a *QuotaError), ErrConflict if the id is taken,
	// ErrNotFound if s.KeyID is unknown.
	CreateSnapshot(ctx context.Context, s Snapshot, lim Limits) error
	// GetSnapshot returns the snapshot. ErrNotFound.
	GetSnapshot(ctx context.Context, id string) (Snapshot, error)
	// ListSnapshots returns the key's snapshots ("" = every key's), oldest
	// first (by CreatedAt, then ID).
	ListSnapshots(ctx context.Context, keyID string) ([]Snapshot, error)
	// DeleteSnapshot removes the snapshot's record. ErrNotFound.
	DeleteSnapshot(ctx context.Context, id string) error

	// CreateVolumes stores the new volumes vs, all of one key, if the key
	// stays within lim with all of them (lim.Volumes their number,
	// lim.DiskMiB their SizeMiB with the key's other disk usage), checked
	// and inserted atomically as ReserveSandbox does: all or none.
	// ErrQuota (a *QuotaError), ErrConflict if an id is taken or the key
	// has a volume of one of their names, ErrNotFound if the key is
	// unknown or revoked.
	CreateVolumes(ctx context.Context, vs []Volume, lim Limits) error
	// GetVolume returns the volume. ErrNotFound.
	GetVolume(ctx context.Context, id string) (Volume, error)
	// VolumeByName returns key keyID's volume of that name. ErrNotFound.
	VolumeByName(ctx context.Context, keyID, name string) (Volume, error)
	// ListVolumes returns the key's volumes ("" = every key's), oldest
	// first (by CreatedAt, then ID).
	ListVolumes(ctx context.Context, keyID string) ([]Volume, error)
	// UpdateVolume reads the volume, calls fn on it and writes the result
	// back in one transaction, as UpdateSandbox does. fn may not change
	// the id, the key or the name. If fn grows SizeMiB, the key's disk
	// quota is checked in the same transaction against lim (ErrQuota, a
	// *QuotaError, and nothing written); otherwise lim is not used.
	// ErrNotFound.
	UpdateVolume(ctx context.Context, id string, lim Limits, fn func(*Volume) error) (Volume, error)
	// DeleteVolume removes the volume's record. ErrNotFound.
	DeleteVolume(ctx context.Context, id string) error

	// PutHost stores h, replacing the host with its id if there is one.
	PutHost(ctx context.Context, h Host) error
	// GetHost returns the host. ErrNotFound.
	GetHost(ctx context.Context, id string) (Host, error)
	// ListHosts returns every host, by id.
	ListHosts(ctx context.Context) ([]Host, error)
	// UpdateHost reads the host, calls fn on it and writes the result back
	// in one transaction, as UpdateSandbox does. ErrNotFound.
	UpdateHost(ctx context.Context, id string, fn func(*Host) error) (Host, error)
	// DeleteHost removes the host's record. ErrNotFound.
	DeleteHost(ctx context.Context, id string) error

	// ReserveTemplateBuild adds build b to user template name, with the
	// template's next version number (b.Version is set to it), atomically:
	// the version numbers of a name are never given out twice, even after
	// its template was deleted. A name without a template (none yet, or
	// deleted) becomes b.Owner's if the key owns fewer than maxPerOwner
	// templates (<= 0: no bound; ErrQuota, not a *QuotaError, otherwise).
	// A name whose template has no version yet is refused (ErrConflict)
	// while another owner's build of it is running. A new template's
	// CreatedAt is b's. It returns the template as written.
	ReserveTemplateBuild(ctx context.Context, name string, b TemplateBuild, maxPerOwner int) (Template, error)
	// ImportTemplate stores t, a template whose versions were built before
	// the catalog kept the registry, if its name has no record at all
	// (not even a deleted template's): ErrConflict otherwise. t must have
	// a version, no build, and LastVersion at least its highest version.
	ImportTemplate(ctx context.Context, t Template) error
	// GetTemplate returns the user template (ErrNotFound if there is
	// none: never any, or deleted).
	GetTemplate(ctx context.Context, name string) (Template, error)
	// ListTemplates returns every user template, by name.
	ListTemplates(ctx context.Context) ([]Template, error)
	// ListTemplateRecords is ListTemplates with the records of deleted
	// templates too: empty, each with its name's last version number.
	ListTemplateRecords(ctx context.Context) ([]Template, error)
	// UpdateTemplate reads the template, calls fn on it and writes the
	// result back in one transaction, as UpdateSandbox does. A template
	// left with neither versions nor builds is deleted (its name keeps
	// only its last version number). fn may not change the name, the
	// owner or LastVersion. ErrNotFound.
	UpdateTemplate(ctx context.Context, name string, fn func(*Template) error) (Template, error)

	// Close releases the store. It is idempotent; other methods must not be
	// called after it.
	Close() error
}

// Template is a user template of a fleet's registry (panda server
// --fleet): who owns it, which of its versions every key may use, and its
// versions, whose images the hosts hold (and the object store a copy of
// each). A template exists while it has a version or a build.
type Template struct {
	Name string
	// Owner is the id of the key that built its first version.
	Owner string
	// Published are the versions every key may use, ascending: the
	// stores keep only those of Versions (a removed version is no longer
	// published). A template written before versions were published one
	// by one with its public flag set reads as its latest version
	// published; the next write keeps it so.
	Published []int
	// LastVersion is the highest version number given out: a build takes
	// the next one, and a number is never given out twice while the
	// template exists.
	LastVersion int
	// Versions are those built, oldest first.
	Versions []TemplateVersion
	// Builds are the builds queued or running, in the order started.
	Builds    []TemplateBuild
	CreatedAt time.Time
}

// TemplateVersion is one version of a user template: Info is the building
// host's description of it (JSON, package template's UserRootFS).
type TemplateVersion struct {
	Version int             `json:"version"`
	Info    json.RawMessage `json:"info"`
}

// TemplateBuild is a build of a user template queued or running on a host:
// when it succeeds, its version becomes one of the template's Versions.
type TemplateBuild struct {
	ID        string    `json:"id"`
	HostID    string    `json:"host_id"`
	Version   int       `json:"version"`
	Owner     string    `json:"owner"`
	CreatedAt time.Time `json:"created_at"`
}

// IsPublished reports whether version v is published.
func (t Template) IsPublished(v int) bool { return slices.Contains(t.Published, v) }

// Exists reports whether the template has a version or a build.
func (t Template) Exists() bool { return len(t.Versions) > 0 || len(t.Builds) > 0 }

// Latest returns the template's latest version (false: none yet).
func (t Template) Latest() (TemplateVersion, bool) {
	if len(t.Versions) == 0 {
		return TemplateVersion{}, false
	}
	return t.Versions[len(t.Versions)-1], true
}

// Limits bound what one key holds at once. A limit <= 0 is unlimited.
type Limits struct {
	Sandboxes int
	MemoryMiB int
	VCPUs     int
	// DiskMiB bounds the disk of the key's live sandboxes, their pause
	// captures, its snapshots and its volumes.
	DiskMiB int
	// Volumes bounds the number of the key's volumes.
	Volumes int
}

// Usage is what a key holds, or what it asks for: sandboxes not stopped
// (their number, memory, vCPUs, disk and pause captures), snapshots
// (their size, in DiskMiB) and volumes (their number, and their size in
// DiskMiB).
type Usage struct {
	Sandboxes int
	MemoryMiB int
	VCPUs     int
	DiskMiB   int
	Volumes   int
}

// UsageOf is what one live sandbox counts for.
func UsageOf(sb Sandbox) Usage {
	return Usage{Sandboxes: 1, MemoryMiB: sb.MemoryMiB, VCPUs: sb.VCPUs, DiskMiB: sb.DiskMiB + MiBCeil(sb.PausedBytes)}
}

// MiBCeil is n bytes in MiB, rounded up.
func MiBCeil(n int64) int { return int((n + 1<<20 - 1) >> 20) }

// QuotaError is the error ReserveSandbox and CreateSnapshot return when a
// key is at one of its limits. It matches ErrQuota with errors.Is.
type QuotaError struct {
	KeyID     string
	Limit     string // one of the Quota constants
	Used      int    // what the key already holds, in the limit's unit
	Requested int    // what it asked for
	Max       int    // the limit
}

// Limits named by QuotaError.Limit.
const (
	QuotaSandboxes = "sandboxes"
	QuotaMemory    = "memory"
	QuotaVCPUs     = "vcpus"
	QuotaDisk      = "disk"
	QuotaVolumes   = "volumes"
)

func (e *QuotaError) Error() string {
	switch e.Limit {
	case QuotaMemory:
		return fmt.Sprintf("memory quota exceeded: key %s uses %d MiB, %d MiB more would pass its limit of %d MiB",
			e.KeyID, e.Used, e.Requested, e.Max)
	case QuotaVCPUs:
		return fmt.Sprintf("vCPU quota exceeded: key %s uses %d vCPUs, %d more would pass its limit of %d",
			e.KeyID, e.Used, e.Requested, e.Max)
	case QuotaDisk:
		return fmt.Sprintf("disk quota exceeded: key %s holds %d MiB (sandbox disks, paused sandboxes, snapshots, volumes), %d MiB more would pass its limit of %d MiB",
			e.KeyID, e.Used, e.Requested, e.Max)
	case QuotaVolumes:
		return fmt.Sprintf("volume quota exceeded: key %s has %d of %d volumes, %d more would pass the limit",
			e.KeyID, e.Used, e.Max, e.Requested)
	}
	return fmt.Sprintf("sandbox quota exceeded: key %s has %d of %d sandboxes", e.KeyID, e.Used, e.Max)
}

// Unwrap makes a QuotaError match ErrQuota.
func (e *QuotaError) Unwrap() error { return ErrQuota }

// CheckQuota returns a *QuotaError if a key holding used cannot take req
// more under lim. Implementations call it inside their reserving
// transaction.
func CheckQuota(keyID string, used, req Usage, lim Limits) error {
	for _, c := range []struct {
		name           string
		used, req, max int
	}{
		{QuotaSandboxes, used.Sandboxes, req.Sandboxes, lim.Sandboxes},
		{QuotaMemory, used.MemoryMiB, req.MemoryMiB, lim.MemoryMiB},
		{QuotaVCPUs, used.VCPUs, req.VCPUs, lim.VCPUs},
		{QuotaDisk, used.DiskMiB, req.DiskMiB, lim.DiskMiB},
		{QuotaVolumes, used.Volumes, req.Volumes, lim.Volumes},
	} {
		if c.max > 0 && c.req > 0 && c.used+c.req > c.max {
			return &QuotaError{KeyID: keyID, Limit: c.name, Used: c.used, Requested: c.req, Max: c.max}
		}
	}
	return nil
}
