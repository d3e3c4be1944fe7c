package controlplane

import (
	"context"
	"slices"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// Registry is a Fleet that hosts join and leave (package fleet's
// Registry): a Plane over one answers for each of its hosts (Hosts) and
// removes them (ForgetHost).
type Registry interface {
	Fleet
	// Statuses describes every host, by id.
	Statuses() []HostStatus
	// Forget removes host id from the fleet and its record from the
	// catalog. Errors: catalog.ErrNotFound, and those Classify knows (a
	// host given by configuration cannot be forgotten).
	Forget(ctx context.Context, id string) error
	// Classify maps its errors to user-facing ones.
	Classify(err error) error
}

// HostView is a host as one key may see it (GET /v1/hosts): capacity and
// load for every key, of the sandboxes on it only the key's own (an admin
// key: all), of the templates it holds those the key may use
// (VisibleTemplates).
type HostView struct {
	ID    string
	State string // ready, draining, lost; "connecting": a host of a fleet not connected yet; "unreachable"
	Accel string
	// Sandboxes running on it, the memory they were given, and what they
	// take in the host's memory (proportional and private set sizes).
	Sandboxes             int
	MemoryAllocatedMiB    int
	SandboxesPSSBytes     int64
	SandboxesPrivateBytes int64
	VCPUs                 int
	MemoryMiB             int
	MemoryAvailableMiB    int
	// NetworkOff: the host runs without sandbox networking (--network
	// off); unknown (false) while a host of a fleet is not connected.
	NetworkOff bool
	// Templates whose memory image the host holds, by reference.
	Templates []string

	// Member: a host of a Registry; the fields below are its.
	Member       bool
	URL          string // admin keys only
	Draining     bool
	Static       bool
	DiskMiB      int64
	DiskFreeMiB  int64
	RegisteredAt time.Time
	HeartbeatAt  time.Time
}

// Hosts describes the hosts as key may see them: those of the Registry
// the plane drives, or its one host.
func (p *Plane) Hosts(ctx context.Context, key catalog.Key) ([]HostView, error) {
	visible, err := p.VisibleTemplates(ctx, key)
	if err != nil {
		return nil, err
	}
	if reg, ok := p.fleet.(Registry); ok {
		return p.members(ctx, reg, key, visible)
	}
	return p.singleHost(ctx, key, visible)
}

// members is Hosts of a fleet's registry. The sandboxes on each are
// those the catalog places there.
func (p *Plane) members(ctx context.Context, reg Registry, key catalog.Key, visible func(string) bool) ([]HostView, error) {
	f := catalog.SandboxFilter{States: []string{catalog.StateRunning}}
	if !key.Admin {
		f.KeyID = key.ID
	}
	running, err := p.cat.ListSandboxes(ctx, f)
	if err != nil {
		return nil, err
	}
	byHost := map[string][]catalog.Sandbox{}
	for _, sb := range running {
		byHost[sb.HostID] = append(byHost[sb.HostID], sb)
	}
	out := []HostView{}
	for _, st := range reg.Statuses() {
		rec := st.Record
		h := HostView{ID: rec.ID, State: rec.State, Accel: rec.Capacity.Accel, VCPUs: rec.Capacity.CPUs,
			MemoryMiB: int(rec.Capacity.MemoryMiB), NetworkOff: p.networkOff(rec.ID), Templates: []string{},
			Member: true, Draining: rec.Draining, Static: st.Static, DiskMiB: rec.Capacity.DiskMiB,
			RegisteredAt: rec.RegisteredAt, HeartbeatAt: rec.HeartbeatAt,
		}
		if key.Admin {
			h.URL = rec.URL
		}
		if st.Loaded {
			h.MemoryAvailableMiB, h.DiskFreeMiB = int(st.Load.FreeMemoryMiB), st.Load.DiskFreeMiB
			for _, t := range st.Load.Templates {
				if visible(t) {
					h.Templates = append(h.Templates, t)
				}
			}
		}
		c, cerr := reg.Host(rec.ID)
		if st.Static && cerr == nil {
			h.Accel = string(c.Accel())
			res := host.LocalResources()
			var err error
			if rr, ok := c.(host.ResourceReporter); ok {
				res, err = rr.Resources(ctx)
			}
			if err == nil {
				h.VCPUs, h.MemoryMiB, h.MemoryAvailableMiB = res.VCPUs, res.MemoryMiB, res.MemoryAvailableMiB
			}
		}
		if !st.Connected && rec.State != catalog.HostLost {
			h.State = "connecting"
		}
		for _, sb := range byHost[rec.ID] {
			h.Sandboxes++
			h.MemoryAllocatedMiB += sb.MemoryMiB
			if cerr == nil {
				if m, err := c.Memory(ctx, sb.ID); err == nil {
					h.SandboxesPSSBytes += m.PSSBytes
					h.SandboxesPrivateBytes += m.PrivateBytes
				}
			}
		}
		out = append(out, h)
	}
	return out, nil
}

// singleHost is Hosts of the plane's one host: an admin key sees the
// sandboxes the host runs, other keys their own in the catalog.
func (p *Plane) singleHost(ctx context.Context, key catalog.Key, visible func(string) bool) ([]HostView, error) {
	id := p.cfg.HostID
	c, err := p.fleet.Host(id)
	if err != nil {
		return nil, err
	}
	h := HostView{ID: id, State: "ready", Accel: string(c.Accel()), NetworkOff: p.networkOff(id), Templates: []string{}}
	res := host.LocalResources()
	if rr, ok := c.(host.ResourceReporter); ok {
		if res, err = rr.Resources(ctx); err != nil {
			h.State = "unreachable"
			p.log.Warn("host resources", "host_id", id, "err", err)
		}
	}
	h.VCPUs, h.MemoryMiB, h.MemoryAvailableMiB = res.VCPUs, res.MemoryMiB, res.MemoryAvailableMiB
	var running []string
	if key.Admin {
		infos, err := c.List(ctx)
		if err != nil {
			p.log.Warn("list sandboxes of host", "host_id", id, "err", err)
		}
		for _, info := range infos {
			if info.State == lifecycle.Running {
				running = append(running, info.ID)
				h.MemoryAllocatedMiB += info.MemoryMiB
			}
		}
	} else {
		own, err := p.cat.ListSandboxes(ctx, catalog.SandboxFilter{KeyID: key.ID, HostID: id, States: []string{catalog.StateRunning}})
		if err != nil {
			return nil, err
		}
		for _, sb := range own {
			running = append(running, sb.ID)
			h.MemoryAllocatedMiB += sb.MemoryMiB
		}
	}
	for _, sid := range running {
		h.Sandboxes++
		if m, err := c.Memory(ctx, sid); err == nil {
			h.SandboxesPSSBytes += m.PSSBytes
			h.SandboxesPrivateBytes += m.PrivateBytes
		}
	}
	if ts, err := c.Templates().List(ctx); err != nil {
		p.log.Warn("list templates of host", "host_id", id, "err", err)
	} else {
		for _, t := range ts {
			if visible(t.Name) && !slices.Contains(h.Templates, t.Name) {
				h.Templates = append(h.Templates, t.Name)
			}
		}
	}
	return []HostView{h}, nil
}

// networkOff reports whether host id runs without sandbox networking
// (false if it cannot be reached to ask).
func (p *Plane) networkOff(id string) bool {
	h, err := p.fleet.Host(id)
	if err != nil {
		return false
	}
	nr, ok := h.(host.NetworkReporter)
	return ok && nr.NetworkOff()
}
