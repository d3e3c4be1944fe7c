package pandastack

import (
	"context"
	"net/http"
	"time"
)

// Host is a machine that runs sandboxes.
type Host struct {
	ID                 string `json:"id"`
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
	SandboxesPSSMiB     float64   `json:"sandboxes_pss_mib,omitempty"`
	SandboxesPrivateMiB float64   `json:"sandboxes_private_mib,omitempty"`
	LastSeenAt          time.Time `json:"last_seen_at,omitzero"`
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
