package pandastack

import (
	"context"
	"net/http"
	"time"

	"github.com/pandastack/pandastack/sdk/go/internal/wire"
)

// APIKey describes an API key, without its secret.
type APIKey struct {
	ID           string    `json:"id"`
	Name         string    `json:"name"`
	Admin        bool      `json:"admin"`
	Prefix       string    `json:"prefix,omitempty"` // first characters of the secret
	MaxSandboxes int       `json:"max_sandboxes,omitempty"`
	MaxMemoryMiB int       `json:"max_memory_mib,omitempty"`
	MaxVCPUs     int       `json:"max_vcpus,omitempty"`
	MaxDiskMiB   int       `json:"max_disk_mib,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	// Revoked: the key was revoked (ListKeys lists revoked keys too).
	Revoked bool `json:"revoked,omitempty"`
}

// KeyWithSecret is a new key with its secret, which the server shows only
// once.
type KeyWithSecret struct {
	APIKey
	Key string `json:"key"`
}

// Quotas limit what a key may hold at once. Zero means the server's default.
type Quotas struct {
	MaxSandboxes int // concurrent sandboxes
	MaxMemoryMiB int // total guest memory
	MaxVCPUs     int // total vCPUs
	MaxDiskMiB   int // disk: sandbox disks, paused sandboxes and snapshots
}

// CreateKey creates an API key. Admin keys only.
func (c *Client) CreateKey(ctx context.Context, name string, admin bool, q Quotas) (KeyWithSecret, error) {
	in := wire.CreateKeyJSONRequestBody{
		Name: name, Admin: optional(admin), MaxSandboxes: optional(q.MaxSandboxes),
		MaxMemoryMib: optional(q.MaxMemoryMiB), MaxVcpus: optional(q.MaxVCPUs), MaxDiskMib: optional(q.MaxDiskMiB),
	}
	var k KeyWithSecret
	err := c.doJSON(ctx, http.MethodPost, path("keys"), nil, in, &k)
	return k, err
}

// ListKeys lists the API keys. Admin keys only.
func (c *Client) ListKeys(ctx context.Context) ([]APIKey, error) {
	var out struct {
		Keys []APIKey `json:"keys"`
	}
	if err := c.doJSON(ctx, http.MethodGet, path("keys"), nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Keys, nil
}

// PurgeResult is what PurgeKey removed.
type PurgeResult struct {
	KeyID            string   `json:"key_id"`
	BuildsCanceled   int      `json:"builds_canceled"`
	SandboxesStopped int      `json:"sandboxes_stopped"`
	SnapshotsDeleted int      `json:"snapshots_deleted"`
	VolumesDeleted   int      `json:"volumes_deleted"`
	TemplatesDeleted []string `json:"templates_deleted"`
	// Failed are what it could not remove; purging again retries them.
	Failed []PurgeFailure `json:"failed"`
}

// PurgeFailure is something PurgeKey could not remove, and why.
type PurgeFailure struct {
	What  string `json:"what"`
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// PurgeKey deletes what the revoked key id left: its snapshots (from the
// hosts' disks and the object store) and its templates, every version;
// it cancels its builds still running and stops its sandboxes still
// live. Nothing of another key's is touched; purging twice is harmless.
// A key that is not revoked is refused (409). Admin keys only.
func (c *Client) PurgeKey(ctx context.Context, id string) (PurgeResult, error) {
	if err := checkID("key", id); err != nil {
		return PurgeResult{}, err
	}
	var out PurgeResult
	err := c.doJSON(ctx, http.MethodPost, path("keys", id, "purge"), nil, nil, &out)
	return out, err
}

// RevokeKey revokes the key id, kills its sandboxes and cancels its
// template builds; PurgeKey deletes its snapshots and templates. Admin
// keys only.
func (c *Client) RevokeKey(ctx context.Context, id string) error {
	if err := checkID("key", id); err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, path("keys", id), nil, nil, nil)
}
