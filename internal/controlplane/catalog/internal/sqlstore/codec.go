package sqlstore

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// Columns of each table, in the order of the scan and args functions below.
var (
	keyColumns = []string{"id", "name", "hash", "prefix", "admin", "max_sandboxes", "max_memory_mib",
		"max_vcpus", "max_disk_mib", "created_at", "revoked_at"}
	sandboxColumns = []string{"id", "key_id", "template", "host_id", "state", "stop_reason", "last_error",
		"memory_mib", "vcpus", "disk_mib", "paused_bytes", "network",
		"metadata", "env", "ttl_seconds", "on_expire", "parent_id", "snapshot_id",
		"created_at", "updated_at", "expires_at", "stopped_at", "volumes"}
	snapshotColumns = []string{"id", "key_id", "sandbox_id", "name", "host_id", "template", "memory_mib", "vcpus",
		"size_bytes", "created_at"}

	keyCols      = strings.Join(keyColumns, ", ")
	sandboxCols  = strings.Join(sandboxColumns, ", ")
	snapshotCols = strings.Join(snapshotColumns, ", ")
	// sandboxSet sets every column but the id, in order.
	sandboxSet = strings.Join(sandboxColumns[1:], " = ?, ") + " = ?"
)

// params returns one "?" a column.
func params(cols []string) string {
	return "?" + strings.Repeat(", ?", len(cols)-1)
}

// TimeLayout is how times are stored as text (Dialect.TextTimes): UTC,
// microseconds, fixed width so that text order is time order.
const TimeLayout = "2006-01-02T15:04:05.000000Z"

type scanner interface{ Scan(dest ...any) error }

func scanKey(row scanner) (catalog.Key, error) {
	var k catalog.Key
	err := row.Scan(&k.ID, &k.Name, &k.Hash, &k.Prefix, &k.Admin, &k.MaxSandboxes, &k.MaxMemoryMiB,
		&k.MaxVCPUs, &k.MaxDiskMiB, timeDest{&k.CreatedAt}, timeDest{&k.RevokedAt})
	return k, err
}

func (s *Store) keyArgs(k catalog.Key) []any {
	return []any{k.ID, k.Name, k.Hash, k.Prefix, k.Admin, k.MaxSandboxes, k.MaxMemoryMiB,
		k.MaxVCPUs, k.MaxDiskMiB, s.timeArg(k.CreatedAt), s.timeArg(k.RevokedAt)}
}

func scanSandbox(row scanner) (catalog.Sandbox, error) {
	var sb catalog.Sandbox
	err := row.Scan(&sb.ID, &sb.KeyID, &sb.Template, &sb.HostID, &sb.State, &sb.StopReason, &sb.LastError,
		&sb.MemoryMiB, &sb.VCPUs, &sb.DiskMiB, &sb.PausedBytes, networkDest{&sb.Network},
		mapDest{&sb.Metadata}, mapDest{&sb.Env}, &sb.TTLSeconds, &sb.OnExpire, &sb.ParentID, &sb.SnapshotID,
		timeDest{&sb.CreatedAt}, timeDest{&sb.UpdatedAt}, timeDest{&sb.ExpiresAt}, timeDest{&sb.StoppedAt},
		mountsDest{&sb.Volumes})
	return sb, err
}

func (s *Store) sandboxArgs(sb catalog.Sandbox) ([]any, error) {
	md, err := encMap(sb.Metadata)
	if err != nil {
		return nil, fmt.Errorf("encode metadata: %w", err)
	}
	env, err := encMap(sb.Env)
	if err != nil {
		return nil, fmt.Errorf("encode env: %w", err)
	}
	network, err := encNetwork(sb.Network)
	if err != nil {
		return nil, fmt.Errorf("encode network: %w", err)
	}
	mounts, err := encMounts(sb.Volumes)
	if err != nil {
		return nil, fmt.Errorf("encode volumes: %w", err)
	}
	return []any{sb.ID, sb.KeyID, sb.Template, sb.HostID, sb.State, sb.StopReason, sb.LastError,
		sb.MemoryMiB, sb.VCPUs, sb.DiskMiB, sb.PausedBytes, network,
		md, env, sb.TTLSeconds, sb.OnExpire, sb.ParentID, sb.SnapshotID,
		s.timeArg(sb.CreatedAt), s.timeArg(sb.UpdatedAt), s.timeArg(sb.ExpiresAt), s.timeArg(sb.StoppedAt), mounts}, nil
}

func scanSnapshot(row scanner) (catalog.Snapshot, error) {
	var sn catalog.Snapshot
	err := row.Scan(&sn.ID, &sn.KeyID, &sn.SandboxID, &sn.Name, &sn.HostID, &sn.Template, &sn.MemoryMiB, &sn.VCPUs,
		&sn.SizeBytes, timeDest{&sn.CreatedAt})
	return sn, err
}

func (s *Store) snapshotArgs(sn catalog.Snapshot) []any {
	return []any{sn.ID, sn.KeyID, sn.SandboxID, sn.Name, sn.HostID, sn.Template, sn.MemoryMiB, sn.VCPUs,
		sn.SizeBytes, s.timeArg(sn.CreatedAt)}
}

// timeArg returns t as stored: NULL for the zero time, else UTC truncated
// to microseconds, as text or as a time.Time (Dialect.TextTimes).
func (s *Store) timeArg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	t = t.UTC().Truncate(time.Microsecond)
	if s.d.TextTimes {
		return t.Format(TimeLayout)
	}
	return t
}

// timeDest scans a stored time into *t: NULL is the zero time; text is in
// TimeLayout; a driver's time.Time comes back in UTC.
type timeDest struct{ t *time.Time }

func (d timeDest) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*d.t = time.Time{}
	case time.Time:
		*d.t = v.UTC()
	case string:
		t, err := time.Parse(TimeLayout, v)
		if err != nil {
			return fmt.Errorf("decode time: %w", err)
		}
		*d.t = t
	case []byte:
		return d.Scan(string(v))
	default:
		return fmt.Errorf("decode time: unexpected %T", src)
	}
	return nil
}

// mapDest scans a stored JSON object of strings into *m, never nil.
type mapDest struct{ m *map[string]string }

func (d mapDest) Scan(src any) error {
	var b []byte
	switch v := src.(type) {
	case string:
		b = []byte(v)
	case []byte:
		b = v
	default:
		return fmt.Errorf("decode map: unexpected %T", src)
	}
	m := map[string]string{}
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("decode map: %w", err)
	}
	*d.m = m
	return nil
}

// encMap returns m as stored: a JSON object, "{}" for a nil map.
func encMap(m map[string]string) (string, error) {
	if len(m) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(m)
	return string(b), err
}

// networkDest scans a stored network policy (a JSON object).
type networkDest struct{ n *catalog.Network }

func (d networkDest) Scan(src any) error {
	var b []byte
	switch v := src.(type) {
	case string:
		b = []byte(v)
	case []byte:
		b = v
	default:
		return fmt.Errorf("decode network: unexpected %T", src)
	}
	var n catalog.Network
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf("decode network: %w", err)
	}
	*d.n = normalizeNetwork(n)
	return nil
}

func encNetwork(n catalog.Network) (string, error) {
	b, err := json.Marshal(normalizeNetwork(n))
	return string(b), err
}

func normalizeNetwork(n catalog.Network) catalog.Network {
	if n.AllowOut == nil {
		n.AllowOut = []string{}
	}
	if n.DenyOut == nil {
		n.DenyOut = []string{}
	}
	return n
}

// mountsDest scans a sandbox's stored volume mounts (a JSON array) into
// *m: nil when there are none.
type mountsDest struct{ m *[]catalog.VolumeMount }

func (d mountsDest) Scan(src any) error {
	var b []byte
	switch v := src.(type) {
	case string:
		b = []byte(v)
	case []byte:
		b = v
	default:
		return fmt.Errorf("decode volumes: unexpected %T", src)
	}
	var m []catalog.VolumeMount
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("decode volumes: %w", err)
	}
	if len(m) == 0 {
		m = nil
	}
	*d.m = m
	return nil
}

// encMounts returns m as stored: a JSON array, "[]" for none.
func encMounts(m []catalog.VolumeMount) (string, error) {
	if len(m) == 0 {
		return "[]", nil
	}
	b, err := json.Marshal(m)
	return string(b), err
}

// normalize makes sb what reading it back would return.
func normalize(sb catalog.Sandbox) catalog.Sandbox {
	sb.Network = normalizeNetwork(sb.Network)
	if len(sb.Volumes) == 0 {
		sb.Volumes = nil
	}
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

var (
	hostColumns = []string{"id", "url", "token", "ca_cert", "state", "draining", "capacity", "registered_at", "heartbeat_at"}
	hostCols    = strings.Join(hostColumns, ", ")
	hostSet     = strings.Join(hostColumns[1:], " = ?, ") + " = ?"
)

func scanHost(row scanner) (catalog.Host, error) {
	var h catalog.Host
	var capacity string
	err := row.Scan(&h.ID, &h.URL, &h.Token, &h.CACert, &h.State, &h.Draining, &capacity,
		timeDest{&h.RegisteredAt}, timeDest{&h.HeartbeatAt})
	if err == nil {
		if jerr := json.Unmarshal([]byte(capacity), &h.Capacity); jerr != nil {
			err = fmt.Errorf("decode capacity: %w", jerr)
		}
	}
	return h, err
}

func (s *Store) hostArgs(h catalog.Host) ([]any, error) {
	capacity, err := json.Marshal(h.Capacity)
	if err != nil {
		return nil, fmt.Errorf("encode capacity: %w", err)
	}
	return []any{h.ID, h.URL, h.Token, h.CACert, h.State, h.Draining, string(capacity),
		s.timeArg(h.RegisteredAt), s.timeArg(h.HeartbeatAt)}, nil
}

// normalizeHost makes h what reading it back would return.
func normalizeHost(h catalog.Host) catalog.Host {
	for _, t := range []*time.Time{&h.RegisteredAt, &h.HeartbeatAt} {
		if !t.IsZero() {
			*t = t.UTC().Truncate(time.Microsecond)
		}
	}
	return h
}

var (
	volumeColumns = []string{"id", "key_id", "name", "host_id", "size_mib", "used_bytes", "parent_id", "created_at"}
	volumeCols    = strings.Join(volumeColumns, ", ")
	volumeSet     = strings.Join(volumeColumns[1:], " = ?, ") + " = ?"
)

func scanVolume(row scanner) (catalog.Volume, error) {
	var v catalog.Volume
	err := row.Scan(&v.ID, &v.KeyID, &v.Name, &v.HostID, &v.SizeMiB, &v.UsedBytes, &v.ParentID, timeDest{&v.CreatedAt})
	return v, err
}

func (s *Store) volumeArgs(v catalog.Volume) []any {
	return []any{v.ID, v.KeyID, v.Name, v.HostID, v.SizeMiB, v.UsedBytes, v.ParentID, s.timeArg(v.CreatedAt)}
}
