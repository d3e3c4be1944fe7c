package pandastack

import (
	"context"
	"net/http"
	"time"
)

// Host is a machine that runs sandboxes.
type Host struct {
	ID                 string    `json:"id"`
	Address            string    `json:"address,omitempty"`
	State              string    `json:"state"` // e.g. ready, draining, unreachable
	Sandboxes          int       `json:"sandboxes"`
	MemoryMiB          int       `json:"memory_mib,omitempty"`           // guest memory it offers
	MemoryAllocatedMiB int       `json:"memory_allocated_mib,omitempty"` // given to its sandboxes
	VCPUs              int       `json:"vcpus,omitempty"`
	LastSeenAt         time.Time `json:"last_seen_at,omitzero"`
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
