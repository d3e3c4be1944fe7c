package pandastack

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Host is a machine that runs sandboxes.
type Host struct {
	ID string `json:"id"`
	// Deprecated: no server sends an address, so Address is always
	// empty; URL is a fleet's host's address (admin keys only).
	Address            string `json:"address,omitempty"`
	State              string `json:"state"` // e.g. ready, draining, unreachable
	Sandboxes          int    `json:"sandboxes"`
	MemoryMiB          int    `json:"memory_mib,omitempty"`           // guest memory it offers
	MemoryAllocatedMiB int    `json:"memory_allocated_mib,omitempty"` // given to its sandboxes
	VCPUs              int    `json:"vcpus,omitempty"`
	Accel              string `json:"accel,omitempty"`                // kvm or tcg
	MemoryAvailableMiB int    `json:"memory_available_mib,omitempty"` // host RAM available
	// SandboxesPSSMiB is what the running sandboxes really cost the host:
	// the sum of their VMMs' proportional set sizes.
	SandboxesPSSMiB     float64 `json:"sandboxes_pss_mib,omitempty"`
	SandboxesPrivateMiB float64 `json:"sandboxes_private_mib,omitempty"`
	// NetworkOff: the host runs without sandbox networking (--network
	// off). Unknown (false) for a fleet's host that is not connected.
	NetworkOff bool `json:"network_off,omitempty"`
	// A fleet's hosts (panda server --fleet) also have these.
	URL          string    `json:"url,omitempty"` // admin keys only
	Draining     bool      `json:"draining,omitempty"`
	Static       bool      `json:"static,omitempty"`
	DiskMiB      int64     `json:"disk_mib,omitempty"`
	DiskFreeMiB  int64     `json:"disk_free_mib,omitempty"`
	Templates    []string  `json:"templates,omitempty"`
	RegisteredAt time.Time `json:"registered_at,omitzero"`
	HeartbeatAt  time.Time `json:"heartbeat_at,omitzero"`
}

// Migrated is one sandbox a drain with migration tried to move.
type Migrated struct {
	SandboxID string `json:"sandbox_id"`
	To        string `json:"to,omitempty"`
	Error     string `json:"error,omitempty"`
}

// DrainResult is the answer of DrainHost.
type DrainResult struct {
	ID       string     `json:"id"`
	State    string     `json:"state"`
	Draining bool       `json:"draining"`
	Migrated []Migrated `json:"migrated,omitempty"`
	Failed   []Migrated `json:"failed,omitempty"`
}

// DrainHost stops placements on host id (admin); with migrate, its
// running sandboxes move to other hosts through the object store.
func (c *Client) DrainHost(ctx context.Context, id string, migrate bool) (DrainResult, error) {
	var q url.Values
	if migrate {
		q = url.Values{"migrate": {"true"}}
	}
	var out DrainResult
	err := c.doJSON(ctx, http.MethodPost, path("hosts", id, "drain"), q, nil, &out)
	return out, err
}

// ActivateHost ends host id's drain (admin).
func (c *Client) ActivateHost(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodPost, path("hosts", id, "activate"), nil, nil, nil)
}

// ForgetHost removes host id from the fleet (admin); refused while it
// holds live sandboxes unless it is lost.
func (c *Client) ForgetHost(ctx context.Context, id string) error {
	return c.doJSON(ctx, http.MethodDelete, path("hosts", id), nil, nil, nil)
}

// Hosts lists the hosts of the deployment.
func (c *Client) Hosts(ctx context.Context) ([]Host, error) {
	var out struct {
		Hosts []Host `json:"hosts"`
	}
	if err := c.doJSON(ctx, http.MethodGet, path("hosts"), nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Hosts, nil
}
