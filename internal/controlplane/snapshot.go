package controlplane

import (
	"context"
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/pandastack/pandastack/internal/contract/failpoint"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// CheckSnapshotName refuses (Invalid) a snapshot name users may not
// give: more than 128 bytes, not UTF-8, or holding NUL ("" is no name).
func CheckSnapshotName(name string) error {
	if len(name) > 128 || strings.ContainsRune(name, 0) || !utf8.ValidString(name) {
		return Errorf(Invalid, "name must be at most 128 bytes of UTF-8, without NUL")
	}
	return nil
}

// Snapshot takes a snapshot named name (CheckSnapshotName) of running
// sandbox sb for key and waits for it. It runs detached from ctx: once
// the host has it on stable storage it is recorded for the key (a crash
// in between is repaired by Resync).
func (p *Plane) Snapshot(ctx context.Context, key catalog.Key, sb catalog.Sandbox, name string) (catalog.Snapshot, error) {
	if err := CheckSnapshotName(name); err != nil {
		return catalog.Snapshot{}, err
	}
	o, err := p.detach(sb.ID, "snapshot", func(ctx context.Context) (catalog.Sandbox, any, error) {
		id := host.NewID()
		h, err := p.on(sb.HostID)
		if err != nil {
			return sb, nil, err
		}
		si, err := h.Snapshot(ctx, sb.ID, id)
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
			if derr := h.DeleteSnapshot(context.WithoutCancel(ctx), id); derr != nil {
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
	sn, err := p.cat.GetSnapshot(ctx, id)
	if errors.Is(err, catalog.ErrNotFound) {
		return nil // a reconciliation finished this delete meanwhile
	}
	if err != nil {
		return err
	}
	h, err := p.on(sn.HostID)
	if err != nil {
		return err
	}
	if err := h.DeleteSnapshot(ctx, id); err != nil && !errors.Is(err, host.ErrNotFound) {
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
	var ids []string
	for _, hi := range p.fleet.Inventory(ctx) {
		ids = append(ids, hi.ID)
	}
	return p.snapshotStorage(ctx, ids)
}

// SnapshotStorageOf is SnapshotStorage asking only snapshot sn's host.
func (p *Plane) SnapshotStorageOf(ctx context.Context, sn catalog.Snapshot) map[string]host.SnapshotInfo {
	return p.snapshotStorage(ctx, []string{sn.HostID})
}

func (p *Plane) snapshotStorage(ctx context.Context, hostIDs []string) map[string]host.SnapshotInfo {
	out := map[string]host.SnapshotInfo{}
	for _, id := range hostIDs {
		h, err := p.fleet.Host(id)
		if err != nil {
			continue
		}
		sl, ok := h.(host.SnapshotLister)
		if !ok {
			continue
		}
		list, err := sl.Snapshots(ctx)
		if err != nil {
			p.log.Warn("list the host's snapshots", "host_id", id, "err", err)
			continue
		}
		for _, si := range list {
			if old, ok := out[si.ID]; !ok || old.Stored != host.StoredDurable {
				out[si.ID] = si
			}
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
