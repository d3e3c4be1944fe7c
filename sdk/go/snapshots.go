package pandastack

import (
	"context"
	"net/http"
	"time"

	"github.com/pandastack/pandastack/sdk/go/internal/wire"
)

// Snapshot is a saved sandbox (memory and disk) that new sandboxes can be
// created from (CreateOptions.SnapshotID).
type Snapshot struct {
	ID        string    `json:"id"`
	Name      string    `json:"name,omitempty"`
	SandboxID string    `json:"sandbox_id,omitempty"` // the sandbox it was taken from
	Template  string    `json:"template,omitempty"`
	MemoryMiB int       `json:"memory_mib,omitempty"`
	VCPUs     int       `json:"vcpus,omitempty"`
	SizeBytes int64     `json:"size_bytes,omitempty"`
	CreatedAt time.Time `json:"created_at,omitzero"`
	// Stored is where the snapshot is kept: "local" (only on its host's
	// disk), "uploading" (being uploaded to the object store) or
	// "durable" (in the object store); "" when the server cannot tell.
	Stored string `json:"stored,omitempty"`
	// StoreError is why the last upload attempt failed, while uploading.
	StoreError string `json:"store_error,omitempty"`
}

// Snapshot saves the sandbox's memory and disk; the sandbox keeps running.
func (s *Sandbox) Snapshot(ctx context.Context, name string) (Snapshot, error) {
	if err := checkID("sandbox", s.ID); err != nil {
		return Snapshot{}, err
	}
	in := wire.CreateSnapshotJSONRequestBody{Name: optional(name)}
	var snap Snapshot
	err := s.c.doJSON(ctx, http.MethodPost, path("sandboxes", s.ID, "snapshots"), nil, in, &snap)
	return snap, err
}

// Snapshots lists this key's snapshots.
func (c *Client) Snapshots(ctx context.Context) ([]Snapshot, error) {
	var out struct {
		Snapshots []Snapshot `json:"snapshots"`
	}
	if err := c.doJSON(ctx, http.MethodGet, path("snapshots"), nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Snapshots, nil
}

// GetSnapshot returns the snapshot id.
func (c *Client) GetSnapshot(ctx context.Context, id string) (Snapshot, error) {
	if err := checkID("snapshot", id); err != nil {
		return Snapshot{}, err
	}
	var snap Snapshot
	err := c.doJSON(ctx, http.MethodGet, path("snapshots", id), nil, nil, &snap)
	return snap, err
}

// DeleteSnapshot deletes the snapshot id. Sandboxes created from it are
// not affected.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	if err := checkID("snapshot", id); err != nil {
		return err
	}
	return c.doJSON(ctx, http.MethodDelete, path("snapshots", id), nil, nil, nil)
}
