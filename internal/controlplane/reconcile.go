package controlplane

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// Reconcile makes the catalog and the host agree after a restart of the
// all-in-one server: see Resync; adopted are the sandboxes the host kept
// (agent.Recovered without an error).
func (p *Plane) Reconcile(ctx context.Context, adopted []string) error {
	h, err := p.on(p.cfg.HostID)
	if err != nil {
		return err
	}
	return p.Resync(ctx, func(ctx context.Context) ([]host.Info, error) {
		var live []host.Info
		for _, id := range adopted {
			if info, err := h.Get(ctx, id); err == nil {
				live = append(live, info)
			}
		}
		return live, nil
	})
}

// errChanged aborts a catalog update whose record changed since Resync
// read it.
var errChanged = errors.New("changed meanwhile")

// Resync makes the catalog agree with what the host lists (list: the
// host's sandboxes), after a restart or when the server reconnects to a
// remote host that it may have missed events from. The host is the truth
// about what exists and in which settled state:
//
//   - a live record whose sandbox the host does not have is stopped
//     (vmm_exited, or host_restarted if it was still starting);
//   - a record the host has running or paused takes that state: a pause
//     or resume that a crash interrupted ends as the host finished or
//     rolled it back (a resume rolled back says so in last_error);
//   - a record stopping is finished (the host's sandbox is killed);
//   - a sandbox the host has that the catalog does not list as live is
//     killed (a create that never finished);
//   - a snapshot the host completed that the catalog never recorded (a
//     crash between the two) is recorded for the key that owns its
//     sandbox.
//
// It is safe while requests are served: the catalog is read before the
// host is listed, sandboxes being created or operated on (busy) are left
// alone, and a record that changed since it was read is not touched.
func (p *Plane) Resync(ctx context.Context, list func(context.Context) ([]host.Info, error)) error {
	return p.ResyncHost(ctx, p.cfg.HostID, list)
}

// ResyncHost is Resync for the sandboxes of host hostID, of a fleet.
func (p *Plane) ResyncHost(ctx context.Context, hostID string, list func(context.Context) ([]host.Info, error)) error {
	h, err := p.on(hostID)
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	live, err := p.cat.ListSandboxes(ctx, catalog.SandboxFilter{HostID: hostID, States: LiveStates})
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	infos, err := list(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: list host sandboxes: %w", err)
	}
	alive := map[string]lifecycle.State{}
	unsettled := false
	for _, info := range infos {
		alive[info.ID] = info.State
		// An operation an earlier server started (a snapshot, a fork) may
		// still finish on the host: what it makes (a snapshot to record)
		// appears after this resync, so the TTL loop resyncs again.
		unsettled = unsettled || (info.Busy && !p.isBusy(info.ID))
	}
	defer func() {
		p.mu.Lock()
		delete(p.resyncAgain, hostID)
		if unsettled {
			p.resyncAgain[hostID] = list
		}
		p.mu.Unlock()
	}()
	known := map[string]bool{}
	for _, sb := range live {
		known[sb.ID] = true
		if p.isBusy(sb.ID) {
			continue
		}
		st, ok := alive[sb.ID]
		update, inFlight := p.resyncUpdate(ctx, h, sb, st, ok)
		if inFlight {
			unsettled = true
		}
		if update == nil {
			continue
		}
		if err := p.updateUnchanged(ctx, sb, update); err != nil {
			return fmt.Errorf("reconcile %s: %w", sb.ID, err)
		}
	}
	p.killStrangers(ctx, h, hostID, alive, known)
	p.resyncSnapshots(ctx, hostID, h)
	return nil
}

// resyncUpdate decides what live record sb must become given the host's
// sandbox of its id (onHost: the host has one, in state st), as Resync
// lists, and kills the host's sandbox where the record ends. It returns
// the update to make, nil for none; inFlight when an operation is still
// running on the host that no request of this server waits for (an
// earlier server started it): the TTL loop resyncs again until it ends.
func (p *Plane) resyncUpdate(ctx context.Context, h host.Host, sb catalog.Sandbox, st lifecycle.State, onHost bool) (update func(x *catalog.Sandbox) error, inFlight bool) {
	settled := onHost && (st == lifecycle.Running || st == lifecycle.Paused)
	switch {
	case onHost && !settled:
		return nil, true
	case sb.State == catalog.StateStopping:
		if onHost {
			h.Kill(ctx, sb.ID)
		}
		reason := sb.StopReason // recorded as the stop began
		if reason == "" {
			reason = "killed"
		}
		return p.stoppedBy(reason), false
	case settled && sb.State == string(st):
		return nil, false
	case settled && sb.State != catalog.StateStarting:
		p.log.Info("sandbox state from its host", "sandbox_id", sb.ID, "state", st, "recorded", sb.State)
		return p.settledAs(st), false
	default:
		if onHost {
			h.Kill(ctx, sb.ID) // a create that never finished
		}
		reason := "vmm_exited"
		if sb.State == catalog.StateStarting {
			reason = "host_restarted"
		}
		return p.stoppedBy(reason), false
	}
}

// settledAs is the update of a record to the settled state st its host
// has: a pause or resume that a crash interrupted ends as the host
// finished or rolled it back (a resume rolled back says so in
// last_error); a paused sandbox does not expire, a running one does.
func (p *Plane) settledAs(st lifecycle.State) func(x *catalog.Sandbox) error {
	return func(x *catalog.Sandbox) error {
		if x.State == catalog.StateResuming && st == lifecycle.Paused {
			x.LastError = "resume failed: interrupted by a restart; resume it again"
		}
		if x.State == catalog.StatePausing && st == lifecycle.Running {
			x.LastError = "pause failed: interrupted by a restart; the sandbox runs on"
		}
		x.State = string(st)
		if st == lifecycle.Paused {
			x.ExpiresAt = time.Time{}
		} else if x.ExpiresAt.IsZero() {
			x.ExpiresAt = p.now().Add(p.ttlOf(*x))
		}
		if st == lifecycle.Running {
			x.PausedBytes = 0
		}
		return nil
	}
}

// updateUnchanged applies update to record sb unless the record changed
// since sb was read or is gone: then it does nothing.
func (p *Plane) updateUnchanged(ctx context.Context, sb catalog.Sandbox, update func(x *catalog.Sandbox) error) error {
	_, err := p.cat.UpdateSandbox(ctx, sb.ID, func(x *catalog.Sandbox) error {
		if x.State != sb.State || !x.UpdatedAt.Equal(sb.UpdatedAt) {
			return errChanged
		}
		if err := update(x); err != nil {
			return err
		}
		x.UpdatedAt = p.now()
		return nil
	})
	if errors.Is(err, errChanged) || errors.Is(err, catalog.ErrNotFound) {
		return nil
	}
	return err
}

// killStrangers kills each sandbox host h (hostID) has (alive) that the
// catalog does not list live there (known: the live records read), unless
// it is busy or its record appeared since the catalog was read.
func (p *Plane) killStrangers(ctx context.Context, h host.Host, hostID string, alive map[string]lifecycle.State, known map[string]bool) {
	for id := range alive {
		if known[id] || p.isBusy(id) {
			continue
		}
		// Created since the catalog was read? (Not a sandbox that moved
		// to another host while this one was away: its copy here is
		// stale, and killing it leaves the new host's alone.)
		if sb, err := p.cat.GetSandbox(ctx, id); err == nil && sb.State != catalog.StateStopped && sb.HostID == hostID {
			continue
		}
		p.log.Warn("killing a sandbox the catalog does not place on this host (a create that never finished, or a copy of one that moved)", "sandbox_id", id, "host_id", hostID)
		h.Kill(ctx, id)
	}
}

func (p *Plane) stoppedBy(reason string) func(x *catalog.Sandbox) error {
	return func(x *catalog.Sandbox) error {
		x.State, x.StopReason, x.StoppedAt, x.PausedBytes = catalog.StateStopped, reason, p.now(), 0
		return nil
	}
}

// resyncSnapshots records the host's snapshots the catalog does not know,
// for the key that owns the sandbox they were taken from (a crash between
// the host's snapshot and its record), and forgets the records of
// snapshots the host no longer has (a crash between the host's delete and
// the record's).
func (p *Plane) resyncSnapshots(ctx context.Context, hostID string, h host.Host) {
	sl, ok := h.(host.SnapshotLister)
	if !ok {
		return
	}
	// Records first: a snapshot is on its host before it is recorded, so
	// one recorded after this list is not mistaken for one deleted.
	recs, err := p.cat.ListSnapshots(ctx, "")
	if err != nil {
		p.log.Warn("reconcile snapshots: list records", "err", err)
		return
	}
	snaps, err := sl.Snapshots(ctx)
	if err != nil {
		p.log.Warn("reconcile snapshots: list host snapshots", "err", err)
		return
	}
	have := map[string]bool{}
	for _, si := range snaps {
		have[si.ID] = true
	}
	for _, sn := range recs {
		if sn.HostID != hostID || have[sn.ID] {
			continue
		}
		if err := p.cat.DeleteSnapshot(ctx, sn.ID); err != nil && !errors.Is(err, catalog.ErrNotFound) {
			p.log.Warn("forget a snapshot its host no longer has", "snapshot_id", sn.ID, "err", err)
			continue
		}
		p.log.Info("forgot a snapshot whose delete a restart interrupted", "snapshot_id", sn.ID, "key_id", sn.KeyID)
	}
	for _, si := range snaps {
		if si.SandboxID == "" {
			continue // unreadable metadata: nothing to record it with
		}
		if si.Transient {
			continue // a cross-host fork's capture, no one's snapshot: its host deletes it
		}
		if _, err := p.cat.GetSnapshot(ctx, si.ID); !errors.Is(err, catalog.ErrNotFound) {
			continue
		}
		if p.isBusy(si.SandboxID) {
			continue // a snapshot of this server's own in flight: its request records it
		}
		from, err := p.cat.GetSandbox(ctx, si.SandboxID)
		if err != nil {
			p.log.Warn("snapshot on the host has no known owner; leaving it", "snapshot_id", si.ID, "sandbox_id", si.SandboxID)
			continue
		}
		sn := catalog.Snapshot{ID: si.ID, KeyID: from.KeyID, SandboxID: si.SandboxID, HostID: from.HostID,
			Template: from.Template, MemoryMiB: si.Spec.MemoryMiB, VCPUs: si.Spec.VCPUs, SizeBytes: si.SizeBytes, CreatedAt: si.CreatedAt}
		if err := p.cat.CreateSnapshot(ctx, sn, catalog.Limits{}); err != nil && !errors.Is(err, catalog.ErrConflict) {
			p.log.Warn("record snapshot found on the host", "snapshot_id", si.ID, "err", err)
			continue
		}
		p.log.Info("recorded a snapshot a restart left unrecorded", "snapshot_id", si.ID, "key_id", from.KeyID)
	}
}

// resyncRetry is how often the TTL loop resyncs records that the last
// Resync left unsettled.
const resyncRetry = time.Second
