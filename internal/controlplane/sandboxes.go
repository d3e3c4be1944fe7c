package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
)

// CreateRequest is what a create asks for (the REST API's create body and
// E2B's create, decoded).
type CreateRequest struct {
	Template   string
	SnapshotID string
	TTLSeconds *int // nil: the default TTL
	MemoryMiB  int
	VCPUs      int
	Metadata   map[string]string
	Env        map[string]string
	OnExpire   string // "kill" (or ""), "pause"
	// Network is the egress policy as JSON, decoded by network.ParsePolicy
	// (defaults, unknown fields, entries checked there); empty or null:
	// the default policy.
	Network json.RawMessage
	// Placement asks for a host (or spreading); zero: the scheduler
	// chooses. A sandbox that mounts volumes runs on their host.
	Placement scheduler.Placement
	// Volumes are key's volumes the sandbox mounts (at most
	// MaxVolumeMounts, all of one host).
	Volumes []VolumeMountRequest
	// Progress, if not nil, receives a line for each step of what the
	// create must do before the restore: fetch the template's set from the
	// object store, bake it (as a bake's progress).
	Progress func(string)
}

// TTL is the TTL a request asks for in seconds (nil: the default one), or
// an Invalid error if it is out of bounds.
func (p *Plane) TTL(seconds *int) (time.Duration, error) {
	if seconds == nil {
		return p.cfg.DefaultTTL, nil
	}
	// Compared in seconds: a number of seconds whose nanoseconds overflow
	// would wrap around into range.
	if *seconds < 1 || int64(*seconds) > int64(p.cfg.MaxTTL/time.Second) {
		return 0, Errorf(Invalid, "ttl_seconds must be between 1 and %d", int(p.cfg.MaxTTL.Seconds()))
	}
	return time.Duration(*seconds) * time.Second, nil
}

// ValidateLabels checks a map of labels (metadata, env) that may hold at
// most maxN entries: an Invalid error naming what if it is not valid.
func ValidateLabels(what string, m map[string]string, maxN int) error {
	if len(m) > maxN {
		return Errorf(Invalid, "%s has %d entries, at most %d allowed", what, len(m), maxN)
	}
	for k, v := range m {
		if k == "" || len(k) > 256 || len(v) > 4096 || strings.ContainsRune(k, 0) || strings.ContainsRune(v, 0) {
			return Errorf(Invalid, "%s entry %q is invalid (keys 1-256 bytes, values up to 4096, no NUL)", what, k)
		}
	}
	return nil
}

// Create validates req, reserves the sandbox against key's quota (state
// starting), restores it on the host and records it running; its TTL
// counts from then. A failed restore removes the reservation. A kill that
// arrives while it starts wins: the sandbox is stopped and the create fails
// with a conflict.
func (p *Plane) Create(ctx context.Context, key catalog.Key, req CreateRequest) (catalog.Sandbox, error) {
	sb, hreq, err := p.newSandbox(ctx, key, req)
	if err != nil {
		return catalog.Sandbox{}, err
	}
	return p.create(ctx, key, sb, hreq)
}

// newSandbox validates a create request and returns the record to
// reserve and the host's request.
func (p *Plane) newSandbox(ctx context.Context, key catalog.Key, req CreateRequest) (catalog.Sandbox, host.CreateRequest, error) {
	ttl, err := p.TTL(req.TTLSeconds)
	if err != nil {
		return catalog.Sandbox{}, host.CreateRequest{}, err
	}
	if err := ValidateLabels("metadata", req.Metadata, 64); err != nil {
		return catalog.Sandbox{}, host.CreateRequest{}, err
	}
	if err := ValidateLabels("env", req.Env, 256); err != nil {
		return catalog.Sandbox{}, host.CreateRequest{}, err
	}
	for k := range req.Env {
		if strings.ContainsRune(k, '=') {
			return catalog.Sandbox{}, host.CreateRequest{}, Errorf(Invalid, "env name %q must not contain '='", k)
		}
	}
	switch req.OnExpire {
	case "", "kill":
		req.OnExpire = "kill"
	case "pause":
	default:
		return catalog.Sandbox{}, host.CreateRequest{}, Errorf(Invalid, "on_expire must be \"kill\" or \"pause\"")
	}
	policy := netpolicy.Default()
	if len(req.Network) > 0 && string(req.Network) != "null" {
		var err error
		if policy, err = netpolicy.Parse(req.Network); err != nil {
			return catalog.Sandbox{}, host.CreateRequest{}, err
		}
	}
	mounts, hmounts, home, err := p.resolveMounts(ctx, key.ID, req.Volumes, req.Placement)
	if err != nil {
		return catalog.Sandbox{}, host.CreateRequest{}, err
	}
	// place places the sandbox: on its volumes' host if it mounts any.
	place := func(r scheduler.Request) (host.Host, string, error) {
		if home != "" {
			return p.placeOnHome(ctx, r, home)
		}
		return p.placeOne(ctx, r)
	}
	var tp templates.Params
	var h host.Host
	var hostID string
	diskMiB := 0
	if req.SnapshotID != "" {
		sn, err := p.OwnedSnapshot(ctx, key.ID, req.SnapshotID)
		if err != nil {
			return catalog.Sandbox{}, host.CreateRequest{}, err
		}
		if (req.Template != "" && req.Template != sn.Template && req.Template+":" != strings.SplitAfter(sn.Template, ":")[0]) || (req.MemoryMiB != 0 && req.MemoryMiB != sn.MemoryMiB) || (req.VCPUs != 0 && req.VCPUs != sn.VCPUs) {
			return catalog.Sandbox{}, host.CreateRequest{}, Errorf(Invalid, "a sandbox created from a snapshot has the snapshot's template (%s), memory (%d MiB) and vcpus (%d)", sn.Template, sn.MemoryMiB, sn.VCPUs)
		}
		tp = templates.Params{Name: sn.Template, MemoryMiB: sn.MemoryMiB, VCPUs: sn.VCPUs}
		// A snapshot restores on its host unless asked otherwise (another
		// host fetches it from the object store).
		if h, hostID, err = place(scheduler.Request{Template: tp.Name, MemoryMiB: tp.MemoryMiB, VCPUs: tp.VCPUs,
			ParentHost: sn.HostID, Placement: req.Placement}); err != nil {
			return catalog.Sandbox{}, host.CreateRequest{}, err
		}
		if hostID != sn.HostID {
			if err := p.snapshotInStore(ctx, sn, hostID); err != nil {
				return catalog.Sandbox{}, host.CreateRequest{}, err
			}
		}
		if t, _, err := h.Templates().Lookup(ctx, tp); err == nil && t != nil {
			diskMiB = t.DiskMiB
		}
	} else {
		dh, _, err := p.anyHost(ctx)
		if err != nil {
			return catalog.Sandbox{}, host.CreateRequest{}, err
		}
		tp = dh.TemplateParams(req.Template, req.MemoryMiB, req.VCPUs)
		// A user template is created from one version, which the sandbox
		// records ("NAME:N"): a rebuild does not change what it runs.
		resolve := p.ResolveTemplate
		if p.cfg.ResolveTemplate != nil {
			resolve = p.cfg.ResolveTemplate
		}
		ref, err := resolve(ctx, key, tp.Name)
		if err != nil {
			return catalog.Sandbox{}, host.CreateRequest{}, err
		}
		tp.Name = ref
		if err := tp.Validate(); err != nil {
			return catalog.Sandbox{}, host.CreateRequest{}, Errorf(Invalid, "%v", strings.TrimPrefix(err.Error(), "invalid template parameters: "))
		}
		if h, hostID, err = place(scheduler.Request{Template: tp.Name, MemoryMiB: tp.MemoryMiB, VCPUs: tp.VCPUs,
			Placement: req.Placement}); err != nil {
			return catalog.Sandbox{}, host.CreateRequest{}, err
		}
		t, reason, err := h.Templates().Lookup(ctx, tp)
		if _, v, _ := templates.SplitRef(tp.Name); v > 0 && errors.Is(err, templates.ErrNotFound) {
			// A version of a user template that the registry knows
			// (ResolveTemplate) and this host of a fleet has not fetched
			// yet: its create fetches it from the object store.
			t, reason, err = nil, "not on this host yet", nil
		}
		if errors.Is(err, templates.ErrNotFound) && !key.Admin {
			// The store's message lists every template, others' too.
			return catalog.Sandbox{}, host.CreateRequest{}, Errorf(NotFound, "template %q not found", tp.Name)
		}
		if err != nil {
			return catalog.Sandbox{}, host.CreateRequest{}, err
		}
		if t == nil && !key.Admin && !allowedShape(tp) {
			// Creating with a shape never baked bakes it: a new template
			// on disk. Keys other than admin ones get a bounded set.
			return catalog.Sandbox{}, host.CreateRequest{}, Errorf(Invalid, "template %s has never been baked with %d MiB and %d vCPUs (%s); "+
				"without an admin key, memory_mib and vcpus must be powers of two (e.g. 512, 1024, 2048 MiB and 1, 2, 4 vCPUs)",
				tp.Name, tp.MemoryMiB, tp.VCPUs, reason)
		}
		if t != nil {
			diskMiB = t.DiskMiB
		}
	}
	now := p.now()
	sb := catalog.Sandbox{
		ID: host.NewID(), KeyID: key.ID, Template: tp.Name, HostID: hostID, State: catalog.StateStarting,
		MemoryMiB: tp.MemoryMiB, VCPUs: tp.VCPUs, DiskMiB: diskMiB, Metadata: req.Metadata, Env: req.Env,
		Network:    toCatalogNetwork(policy),
		TTLSeconds: int(ttl.Seconds()), OnExpire: req.OnExpire, SnapshotID: req.SnapshotID,
		Volumes:   mounts,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(ttl),
	}
	hreq := host.CreateRequest{Template: tp.Name, MemoryMiB: tp.MemoryMiB, VCPUs: tp.VCPUs, Env: req.Env, SnapshotID: req.SnapshotID,
		Network: policy, Progress: req.Progress, Volumes: hmounts}
	return sb, hreq, nil
}

// allowedShape reports whether a key without admin rights may bake p's
// shape by creating a sandbox with it: powers of two only, so that the
// templates any key can make are few.
func allowedShape(p templates.Params) bool {
	pow2 := func(n int) bool { return n > 0 && n&(n-1) == 0 }
	return pow2(p.MemoryMiB) && pow2(p.VCPUs)
}

// SetTTL sets sandbox id's TTL, counted from now (from its resume if it
// is paused); a stopped or stopping sandbox's is a conflict.
func (p *Plane) SetTTL(ctx context.Context, id string, ttl time.Duration) (catalog.Sandbox, error) {
	return p.cat.UpdateSandbox(ctx, id, func(x *catalog.Sandbox) error {
		switch x.State {
		case catalog.StateStopped, catalog.StateStopping:
			return Errorf(Conflict, "sandbox %s is %s", x.ID, x.State)
		}
		now := p.now()
		x.TTLSeconds = int(ttl.Seconds())
		// A paused sandbox does not expire: its new TTL counts from its
		// resume (so does a pausing one's; a resuming one's from now).
		if x.State == catalog.StatePaused || x.State == catalog.StatePausing {
			x.ExpiresAt = time.Time{}
		} else {
			x.ExpiresAt = now.Add(ttl)
		}
		x.UpdatedAt = now
		return nil
	})
}

func toCatalogNetwork(p netpolicy.Policy) catalog.Network {
	return catalog.Network{Internet: p.Internet, AllowOut: p.AllowOut, DenyOut: p.DenyOut}
}

// SetNetwork gives sandbox sb the egress policy np: on its host, then in
// its record. A running sandbox's rules change at once; a paused one's at
// its resume; a stopped or stopping one's is a conflict.
func (p *Plane) SetNetwork(ctx context.Context, sb catalog.Sandbox, np netpolicy.Policy) (catalog.Sandbox, error) {
	if err := np.Validate(); err != nil {
		return sb, err
	}
	np = np.Canonical()
	switch sb.State {
	case catalog.StateStopped, catalog.StateStopping:
		return sb, Errorf(Conflict, "sandbox %s is %s", sb.ID, sb.State)
	}
	// The host first: if it cannot apply the policy, the record keeps
	// the old one, which is what the sandbox still has.
	h, err := p.on(sb.HostID)
	if err != nil {
		return sb, err
	}
	if err := h.SetNetwork(ctx, sb.ID, np); err != nil {
		return sb, err
	}
	return p.cat.UpdateSandbox(context.WithoutCancel(ctx), sb.ID, func(x *catalog.Sandbox) error {
		x.Network = toCatalogNetwork(np)
		x.UpdatedAt = p.now()
		return nil
	})
}

// snapshotInStore returns once snapshot sn, about to be restored on host
// to (not its own), is durable in the object store, where to fetches it:
// a snapshot is uploaded in the background after it is taken, and a
// create that came before the upload ended would not find it. If the
// snapshot's host is lost, or no longer holds it, to tries the store as
// it is (404 if the store lacks it too).
func (p *Plane) snapshotInStore(ctx context.Context, sn catalog.Snapshot, to string) error {
	src, err := p.on(sn.HostID)
	if errors.Is(err, ErrHostLost) {
		p.log.Info("restore a snapshot whose host is lost", "snapshot_id", sn.ID, "host_id", sn.HostID, "to", to)
		return nil
	}
	if err != nil {
		return err
	}
	tr, _ := src.(host.Transferer)
	t0 := p.now()
	if _, err := p.awaitStore(ctx, src, tr, sn.HostID, sn.ID); err != nil {
		var e *Error
		switch {
		case errors.Is(err, host.ErrNotFound):
			p.log.Info("restore a snapshot its host no longer holds", "snapshot_id", sn.ID, "host_id", sn.HostID, "to", to)
			return nil
		case errors.As(err, &e) && e.Kind == Invalid:
			return &Error{Kind: Invalid, Err: err, Msg: fmt.Sprintf("snapshot %s is on host %s, which has no object store: "+
				"restore it there (no placement), or give the hosts a shared store (panda agent --store)", sn.ID, sn.HostID)}
		}
		return fmt.Errorf("restore snapshot %s on host %s: %w", sn.ID, to, err)
	}
	p.log.Info("snapshot durable for a restore on another host", "snapshot_id", sn.ID, "host_id", sn.HostID, "to", to,
		"waited_ms", p.now().Sub(t0).Milliseconds())
	return nil
}

// placeOne places one sandbox: its host's client and id.
func (p *Plane) placeOne(ctx context.Context, req scheduler.Request) (host.Host, string, error) {
	cs, err := p.place(ctx, req)
	if err != nil {
		return nil, "", err
	}
	h, err := p.on(cs[0].Host)
	if err != nil {
		return nil, "", err
	}
	p.log.Info("placed sandbox", "host_id", cs[0].Host, "reason", cs[0].Reason, "template", req.Template)
	return h, cs[0].Host, nil
}

// Sandbox is key keyID's sandbox id: a NotFound error, the same whether it
// does not exist or is another key's (one key never learns of another's
// sandboxes), or a catalog error.
func (p *Plane) Sandbox(ctx context.Context, keyID, id string) (catalog.Sandbox, error) {
	if !host.ValidID(id) {
		return catalog.Sandbox{}, Errorf(NotFound, "sandbox %q not found", id)
	}
	sb, err := p.cat.GetSandbox(ctx, id)
	if errors.Is(err, catalog.ErrNotFound) || (err == nil && sb.KeyID != keyID) {
		return catalog.Sandbox{}, Errorf(NotFound, "sandbox %s not found", id)
	}
	if err != nil {
		return catalog.Sandbox{}, fmt.Errorf("get sandbox: %w", err)
	}
	return sb, nil
}

// OwnedSnapshot is key keyID's snapshot id, as Sandbox.
func (p *Plane) OwnedSnapshot(ctx context.Context, keyID, id string) (catalog.Snapshot, error) {
	if !host.ValidID(id) {
		return catalog.Snapshot{}, Errorf(NotFound, "snapshot %q not found", id)
	}
	sn, err := p.cat.GetSnapshot(ctx, id)
	if errors.Is(err, catalog.ErrNotFound) || (err == nil && sn.KeyID != keyID) {
		return catalog.Snapshot{}, Errorf(NotFound, "snapshot %s not found", id)
	}
	if err != nil {
		return catalog.Snapshot{}, fmt.Errorf("get snapshot: %w", err)
	}
	return sn, nil
}
