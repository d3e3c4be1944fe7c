package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pandastack/pandastack/internal/catalog"
	"github.com/pandastack/pandastack/internal/failpoint"
	"github.com/pandastack/pandastack/internal/host"
)

// MaxForkCount bounds the children of one fork.
const MaxForkCount = 64

// Forked is the outcome of a fork.
type Forked struct {
	// Children has one entry per child asked for, in order.
	Children []ForkChild
	// ParentPausedMS is how long the parent's vCPUs were stopped;
	// DirtyBytes how much of its RAM the capture copied.
	ParentPausedMS float64
	DirtyBytes     int64
}

// ForkChild is one child of a fork: its record (running), or why it
// failed.
type ForkChild struct {
	Sandbox *catalog.Sandbox
	Err     *Error
}

// Fork forks running sandbox parent into count children of key's and
// waits for them. The fork runs detached from ctx: children a caller never
// hears of still end up recorded (running, or gone if they failed). A
// child over quota is reported in its slot and not attempted; if no child
// fits, the quota error is returned.
func (p *Plane) Fork(ctx context.Context, key catalog.Key, parent catalog.Sandbox, count int) (Forked, error) {
	if count < 1 || count > MaxForkCount {
		return Forked{}, Errorf(Invalid, "count must be between 1 and %d", MaxForkCount)
	}
	o, err := p.fork(key, parent, count)
	if err != nil {
		return Forked{}, err
	}
	_, val, err := o.wait(ctx)
	if err != nil {
		return Forked{}, err
	}
	return val.(Forked), nil
}

// fork reserves count children of parent against the key's quota and
// forks them, detached from the request.
func (p *Plane) fork(key catalog.Key, parent catalog.Sandbox, count int) (*op, error) {
	return p.detach(parent.ID, "fork", func(ctx context.Context) (catalog.Sandbox, any, error) {
		t0 := time.Now()
		out := make([]ForkChild, count)
		var ids []string
		slot := map[string]int{}
		now := p.now()
		ttl := p.ttlOf(parent)
		var quotaErr error
		for i := 0; i < count; i++ {
			child := catalog.Sandbox{
				ID: host.NewID(), KeyID: key.ID, Template: parent.Template, HostID: parent.HostID, State: catalog.StateStarting,
				MemoryMiB: parent.MemoryMiB, VCPUs: parent.VCPUs, DiskMiB: parent.DiskMiB, Metadata: parent.Metadata, Env: parent.Env,
				// The host gives a child its parent's egress policy.
				Network:    parent.Network,
				TTLSeconds: int(ttl.Seconds()), OnExpire: parent.OnExpire, ParentID: parent.ID,
				CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(ttl),
			}
			p.setBusy(child.ID, true) // before the record exists: Resync leaves it alone
			if err := p.reserve(ctx, key, child); err != nil {
				p.setBusy(child.ID, false)
				quotaErr = err
				out[i].Err = Classify(err)
				continue
			}
			slot[child.ID] = i
			ids = append(ids, child.ID)
		}
		defer func() {
			for _, id := range ids {
				p.setBusy(id, false)
			}
		}()
		if len(ids) == 0 {
			return catalog.Sandbox{}, nil, quotaErr
		}
		res, err := p.host.Fork(ctx, parent.ID, ids)
		if err != nil {
			for _, id := range ids {
				p.cat.DeleteSandbox(context.WithoutCancel(ctx), id)
			}
			return catalog.Sandbox{}, nil, err
		}
		for j, id := range ids { // children come back in request order
			i := slot[id]
			c := res.Children[j]
			if c.Err != nil {
				p.cat.DeleteSandbox(context.WithoutCancel(ctx), id)
				out[i].Err = Classify(c.Err)
				if out[i].Err.Kind == Internal {
					p.log.Error("fork child failed", "parent_id", parent.ID, "sandbox_id", id, "err", c.Err)
				}
				continue
			}
			sb, err := p.started(ctx, id)
			if err != nil {
				out[i].Err = Classify(err)
				continue
			}
			out[i].Sandbox = &sb
		}
		p.metrics.forks.Inc()
		p.metrics.forkPauseSeconds.Observe(res.Capture.Paused.Seconds())
		p.log.Info("sandbox forked", "sandbox_id", parent.ID, "children", len(ids), "paused_ms", res.Capture.PausedMS,
			"dirty_mib", res.Capture.DirtyBytes>>20, "dur_ms", time.Since(t0).Milliseconds())
		return parent, Forked{Children: out, ParentPausedMS: res.Capture.PausedMS, DirtyBytes: res.Capture.DirtyBytes}, nil
	})
}

// Limits are key's quota limits: its own, else the configured defaults.
func (p *Plane) Limits(key catalog.Key) catalog.Limits {
	pick := func(own, def int) int {
		if own != 0 {
			return own
		}
		return def
	}
	return catalog.Limits{
		Sandboxes: pick(key.MaxSandboxes, p.cfg.MaxSandboxesPerKey),
		MemoryMiB: pick(key.MaxMemoryMiB, p.cfg.MaxMemoryMiBPerKey),
		VCPUs:     pick(key.MaxVCPUs, p.cfg.MaxVCPUsPerKey),
		DiskMiB:   pick(key.MaxDiskMiB, p.cfg.MaxDiskMiBPerKey),
	}
}

// reserve records a new sandbox against the key's quota.
func (p *Plane) reserve(ctx context.Context, key catalog.Key, sb catalog.Sandbox) error {
	if err := p.cat.ReserveSandbox(ctx, sb, p.Limits(key)); err != nil {
		return fmt.Errorf("reserve sandbox: %w", err)
	}
	return nil
}

// Snapshot takes a snapshot named name of running sandbox sb for key and
// waits for it. It runs detached from ctx: once the host has it on stable
// storage it is recorded for the key (a crash in between is repaired by
// Resync).
func (p *Plane) Snapshot(ctx context.Context, key catalog.Key, sb catalog.Sandbox, name string) (catalog.Snapshot, error) {
	o, err := p.detach(sb.ID, "snapshot", func(ctx context.Context) (catalog.Sandbox, any, error) {
		id := host.NewID()
		si, err := p.host.Snapshot(ctx, sb.ID, id)
		if err != nil {
			return sb, nil, err
		}
		failpoint.Hit("api-snapshot-taken")
		sn := catalog.Snapshot{
			ID: id, KeyID: key.ID, SandboxID: sb.ID, Name: name, HostID: sb.HostID,
			Template: sb.Template, MemoryMiB: si.Spec.MemoryMiB, VCPUs: si.Spec.VCPUs, SizeBytes: si.SizeBytes,
			CreatedAt: si.CreatedAt,
		}
		if err := p.cat.CreateSnapshot(ctx, sn, p.Limits(key)); err != nil {
			if derr := p.host.DeleteSnapshot(context.WithoutCancel(ctx), id); derr != nil {
				p.log.Error("delete unrecorded snapshot", "snapshot_id", id, "err", derr)
			}
			return sb, nil, err
		}
		p.metrics.snapshots.Inc()
		return sb, sn, nil
	})
	if err != nil {
		return catalog.Snapshot{}, err
	}
	_, val, err := o.wait(ctx)
	if err != nil {
		return catalog.Snapshot{}, err
	}
	return val.(catalog.Snapshot), nil
}

// DeleteSnapshot deletes snapshot id from its host, then its record.
func (p *Plane) DeleteSnapshot(ctx context.Context, id string) error {
	if err := p.host.DeleteSnapshot(ctx, id); err != nil && !errors.Is(err, host.ErrNotFound) {
		return err
	}
	// Not found: a reconciliation finished this delete meanwhile.
	if err := p.cat.DeleteSnapshot(ctx, id); err != nil && !errors.Is(err, catalog.ErrNotFound) {
		return err
	}
	return nil
}

// SnapshotStorage is where the host keeps its snapshots, by ID: each one's
// host.SnapshotInfo with Stored and StoreError (local, uploading to the
// object store, durable there). Nil if the host cannot list its snapshots
// or cannot be reached now (the snapshots themselves are the catalog's;
// only their storage state is unknown then).
func (p *Plane) SnapshotStorage(ctx context.Context) map[string]host.SnapshotInfo {
	sl, ok := p.host.(host.SnapshotLister)
	if !ok {
		return nil
	}
	list, err := sl.Snapshots(ctx)
	if err != nil {
		p.log.Warn("list the host's snapshots", "err", err)
		return nil
	}
	out := make(map[string]host.SnapshotInfo, len(list))
	for _, si := range list {
		out[si.ID] = si
	}
	return out
}
