package controlplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
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
	// CrossHostCaptureBytes is the size of the parent's capture that went
	// to other hosts for children there (its own blocks); 0 when all are
	// on the parent's host.
	CrossHostCaptureBytes int64
	// CrossHostDirectBytes is what the parent's host sent straight to the
	// other hosts (packs: what differs from the template they hold, one
	// per host). CrossHostUploadedBytes is what it sent to the object
	// store for hosts it could not send to directly (the capture's chunks
	// the store did not hold: not those of its template),
	// CrossHostFetchedBytes what those hosts read from the store (the
	// chunks their copy of the template did not hold). Their sum is the
	// bytes the fork moved.
	CrossHostDirectBytes   int64
	CrossHostUploadedBytes int64
	CrossHostFetchedBytes  int64
	// CrossHostPulledBytes is the part of CrossHostDirectBytes that the
	// other hosts fetched from the parent's host themselves; the rest
	// went through this process (hosts that cannot reach each other, an
	// older agent).
	CrossHostPulledBytes int64
}

// ForkChild is one child of a fork: its record (running), or why it
// failed.
type ForkChild struct {
	Sandbox *catalog.Sandbox
	Err     *Error
}

// Fork forks running sandbox parent into count children of key's and
// waits for them. Children go to the parent's host unless pl asks
// otherwise (a host, or spread over hosts): children on another host are
// restored from a capture of the parent that goes there straight from the
// parent's host, or through the object store the hosts share where it
// cannot (forkAcross). The fork runs detached from ctx: children a
// caller never hears of still end up recorded (running, or gone if they
// failed). A child over quota is reported in its slot and not attempted;
// if no child fits, the quota error is returned.
//
// A parent that mounts volumes has its children on its own host, where
// the volumes are. volumeMode says what they mount: VolumeShare (or ""),
// the parent's volumes; VolumeBranch, each its own branch of each of them
// (a new volume of key's, named "<volume>-<child id>", cloned while the
// parent is stopped for the capture), reserved against key's quota before
// the fork: a fork whose branches do not fit fails.
func (p *Plane) Fork(ctx context.Context, key catalog.Key, parent catalog.Sandbox, count int, pl scheduler.Placement, volumeMode string) (Forked, error) {
	if count < 1 || count > MaxForkCount {
		return Forked{}, Errorf(Invalid, "count must be between 1 and %d", MaxForkCount)
	}
	switch volumeMode {
	case "":
		volumeMode = VolumeShare
	case VolumeShare, VolumeBranch:
	default:
		return Forked{}, Errorf(Invalid, "volume_mode must be %q or %q", VolumeShare, VolumeBranch)
	}
	req := scheduler.Request{Template: parent.Template, MemoryMiB: parent.MemoryMiB, VCPUs: parent.VCPUs,
		Count: count, ParentHost: parent.HostID, Placement: pl}
	if len(parent.Volumes) > 0 {
		if err := forkPlacement(parent, pl); err != nil {
			return Forked{}, err
		}
		req.Placement = scheduler.Placement{Host: parent.HostID}
	}
	choices, err := p.place(ctx, req)
	if err != nil {
		return Forked{}, err
	}
	for i, c := range choices {
		p.log.Info("placed fork child", "parent_id", parent.ID, "child", i, "host_id", c.Host, "reason", c.Reason)
	}
	o, err := p.fork(key, parent, choices, volumeMode == VolumeBranch && len(parent.Volumes) > 0)
	if err != nil {
		return Forked{}, err
	}
	_, val, err := o.wait(ctx)
	if err != nil {
		return Forked{}, err
	}
	return val.(Forked), nil
}

// forkPlacement checks that placement pl keeps the children of parent,
// which mounts volumes, on its host (or parent itself, for a resume).
func forkPlacement(parent catalog.Sandbox, pl scheduler.Placement) error {
	switch {
	case pl.Spread:
		return Errorf(Invalid, "sandbox %s mounts volumes: its children run on its host, placement spread does not apply", parent.ID)
	case pl.Host != "" && pl.Host != parent.HostID:
		return Errorf(Conflict, "sandbox %s mounts volumes of host %s: its children run there, not on %s", parent.ID, parent.HostID, pl.Host)
	}
	return nil
}

// fork reserves one child of parent per choice against the key's quota
// (with its branches of the parent's volumes if branch) and forks them
// on the chosen hosts, detached from the request.
func (p *Plane) fork(key catalog.Key, parent catalog.Sandbox, choices []scheduler.Choice, branch bool) (*op, error) {
	return p.detach(parent.ID, "fork", func(ctx context.Context) (catalog.Sandbox, any, error) {
		t0 := time.Now()
		b, quotaErr := p.reserveChildren(ctx, key, parent, choices)
		defer b.unbusy(p)
		if len(b.slot) == 0 {
			return catalog.Sandbox{}, nil, quotaErr
		}
		if branch {
			if err := p.reserveBranches(ctx, key, b); err != nil {
				p.dropChildren(ctx, b, b.byHost[parent.HostID], err)
				return catalog.Sandbox{}, nil, err
			}
		}
		res, forkErr := p.forkLocal(ctx, b)
		local := len(b.byHost[parent.HostID])
		var moved, uploaded int64
		var across acrossBytes
		if local < len(b.slot) {
			var si host.SnapshotInfo
			var err error
			si, across, err = p.forkRemote(ctx, key, b)
			moved, uploaded = si.SizeBytes, si.UploadedBytes
			if local == 0 {
				res.Capture = si.Capture
			}
			if err != nil && forkErr == nil {
				forkErr = err
			}
		}
		p.collectChildren(ctx, b)
		ok := false
		for _, c := range b.out {
			ok = ok || c.Sandbox != nil
		}
		if !ok && forkErr != nil && quotaErr == nil {
			return catalog.Sandbox{}, nil, forkErr
		}
		p.metrics.forks.Inc()
		p.metrics.forkPauseSeconds.Observe(res.Capture.Paused.Seconds())
		p.log.Info("sandbox forked", "sandbox_id", parent.ID, "children", len(b.slot), "other_hosts", len(b.slot)-local,
			"paused_ms", res.Capture.PausedMS, "dirty_mib", res.Capture.DirtyBytes>>20, "capture_mib", moved>>20,
			"direct_bytes", across.direct, "uploaded_bytes", uploaded, "fetched_bytes", across.fetched, "dur_ms", time.Since(t0).Milliseconds())
		return parent, Forked{Children: b.out, ParentPausedMS: res.Capture.PausedMS, DirtyBytes: res.Capture.DirtyBytes,
			CrossHostCaptureBytes: moved, CrossHostDirectBytes: across.direct, CrossHostUploadedBytes: uploaded, CrossHostFetchedBytes: across.fetched, CrossHostPulledBytes: across.pulled}, nil
	})
}

// forkBatch is the children of one fork: the answer, one slot per
// child asked for, and the children reserved, by host.
type forkBatch struct {
	parent  catalog.Sandbox
	choices []scheduler.Choice
	out     []ForkChild         // in request order
	slot    map[string]int      // index in out of each reserved child
	byHost  map[string][]string // reserved child ids by host, in request order
	hosts   []string            // the hosts of byHost, in request order
	// branches are the volumes each child's branch of its parent's
	// (reserveBranches); nil: children mount their parent's.
	branches map[string][]host.VolumeBranch
}

// reserveChildren makes one child record of parent per choice (busy, so
// that Resync leaves it alone) and reserves it against key's quota. A
// child over quota gets its error in its slot and is not reserved;
// quotaErr is the last such error. The caller unbusies the batch.
func (p *Plane) reserveChildren(ctx context.Context, key catalog.Key, parent catalog.Sandbox, choices []scheduler.Choice) (b *forkBatch, quotaErr error) {
	b = &forkBatch{parent: parent, choices: choices, out: make([]ForkChild, len(choices)), slot: map[string]int{}, byHost: map[string][]string{}}
	now := p.now()
	ttl := p.ttlOf(parent)
	for i, c := range choices {
		child := catalog.Sandbox{
			ID: host.NewID(), KeyID: key.ID, Template: parent.Template, HostID: c.Host, State: catalog.StateStarting,
			MemoryMiB: parent.MemoryMiB, VCPUs: parent.VCPUs, DiskMiB: parent.DiskMiB, Metadata: parent.Metadata, Env: parent.Env,
			// The host gives a child its parent's egress policy.
			Network: parent.Network,
			// Children mount their parent's volumes (until
			// reserveBranches gives them their own).
			Volumes:    parent.Volumes,
			TTLSeconds: int(ttl.Seconds()), OnExpire: parent.OnExpire, ParentID: parent.ID,
			CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(ttl),
		}
		p.setBusy(child.ID, true) // before the record exists: Resync leaves it alone
		if err := p.reserve(ctx, key, child); err != nil {
			p.setBusy(child.ID, false)
			quotaErr = err
			b.out[i].Err = Classify(err)
			continue
		}
		b.slot[child.ID] = i
		if b.byHost[c.Host] == nil {
			b.hosts = append(b.hosts, c.Host)
		}
		b.byHost[c.Host] = append(b.byHost[c.Host], child.ID)
	}
	return b, quotaErr
}

// unbusy ends the busy mark of every child reserved.
func (b *forkBatch) unbusy(p *Plane) {
	for _, ids := range b.byHost {
		for _, id := range ids {
			p.setBusy(id, false)
		}
	}
}

// dropChildren deletes the records of children ids, which failed with
// err, and their branches of volumes, and puts the error in their slots.
func (p *Plane) dropChildren(ctx context.Context, b *forkBatch, ids []string, err error) {
	for _, id := range ids {
		p.cat.DeleteSandbox(context.WithoutCancel(ctx), id)
		b.out[b.slot[id]].Err = Classify(err)
		p.dropBranches(ctx, b, id)
	}
}

// reserveBranches records, for each child of b (all on the parent's
// host), a branch of each volume the parent mounts, all at once against
// key's quota, and makes each child's record mount its branches.
func (p *Plane) reserveBranches(ctx context.Context, key catalog.Key, b *forkBatch) error {
	var vs []catalog.Volume
	branches := map[string][]host.VolumeBranch{}
	mounts := map[string][]catalog.VolumeMount{}
	now := p.now()
	for _, id := range b.byHost[b.parent.HostID] {
		for _, m := range b.parent.Volumes {
			src, err := p.cat.GetVolume(ctx, m.VolumeID)
			if errors.Is(err, catalog.ErrNotFound) {
				return Errorf(Conflict, "the volume sandbox %s mounts at %s was deleted: there is nothing to branch", b.parent.ID, m.Path)
			}
			if err != nil {
				return fmt.Errorf("branch volume %s: %w", m.VolumeID, err)
			}
			v := catalog.Volume{ID: newVolumeID(), KeyID: key.ID, Name: branchName(src.Name, id), HostID: src.HostID,
				SizeMiB: src.SizeMiB, ParentID: src.ID, CreatedAt: now}
			vs = append(vs, v)
			branches[id] = append(branches[id], host.VolumeBranch{From: src.ID, To: v.ID})
			mounts[id] = append(mounts[id], catalog.VolumeMount{VolumeID: v.ID, Path: m.Path, ReadOnly: m.ReadOnly})
		}
	}
	if err := p.reserveVolumes(ctx, key, vs); err != nil {
		return err
	}
	b.branches = branches
	for id, ms := range mounts {
		if _, err := p.cat.UpdateSandbox(ctx, id, func(x *catalog.Sandbox) error { x.Volumes = ms; return nil }); err != nil {
			return fmt.Errorf("record the branches of child %s: %w", id, err)
		}
	}
	return nil
}

// dropBranches deletes the branches of volumes of child id, which did
// not start: on the host (if it made them) and their records.
func (p *Plane) dropBranches(ctx context.Context, b *forkBatch, id string) {
	ctx = context.WithoutCancel(ctx)
	for _, br := range b.branches[id] {
		if hv, err := p.volumesOf(b.parent.HostID); err == nil {
			if err := hv.DeleteVolume(ctx, br.To, true); err != nil && !errors.Is(err, host.ErrNotFound) {
				p.log.Warn("delete branch of a child that did not start", "volume_id", br.To, "sandbox_id", id, "err", err)
			}
		}
		p.dropVolumeRecord(ctx, br.To)
	}
	delete(b.branches, id)
}

// forkLocal forks the children on the parent's own host, if any, and
// drops those that failed (all of them if the fork failed: its error is
// returned).
func (p *Plane) forkLocal(ctx context.Context, b *forkBatch) (host.ForkResult, error) {
	local := b.byHost[b.parent.HostID]
	if len(local) == 0 {
		return host.ForkResult{}, nil
	}
	res, err := p.forkOnHost(ctx, b, local)
	if err != nil {
		p.dropChildren(ctx, b, local, err)
		return res, err
	}
	for j, id := range local { // children come back in request order
		if c := res.Children[j]; c.Err != nil {
			p.dropChildren(ctx, b, []string{id}, c.Err)
			if b.out[b.slot[id]].Err.Kind == Internal {
				p.log.Error("fork child failed", "parent_id", b.parent.ID, "sandbox_id", id, "err", c.Err)
			}
		}
	}
	return res, nil
}

// forkRemote forks the children on other hosts than the parent's from one
// capture of the parent (forkAcross), and drops those that failed (all of
// them if the capture failed: its error is returned).
func (p *Plane) forkRemote(ctx context.Context, key catalog.Key, b *forkBatch) (host.SnapshotInfo, acrossBytes, error) {
	var remote []string
	for _, hid := range b.hosts {
		if hid != b.parent.HostID {
			remote = append(remote, b.byHost[hid]...)
		}
	}
	var mu sync.Mutex
	si, across, err := p.forkAcross(ctx, key, b.parent, remote, func(id string) string { return b.choices[b.slot[id]].Host },
		func(id string, err error) {
			mu.Lock()
			defer mu.Unlock()
			p.dropChildren(ctx, b, []string{id}, err)
		})
	if err != nil {
		p.dropChildren(ctx, b, remote, err)
	}
	return si, across, err
}

// collectChildren waits for each child not dropped to run on its host and
// puts its record, or why it did not start, in its slot.
func (p *Plane) collectChildren(ctx context.Context, b *forkBatch) {
	for _, hid := range b.hosts {
		h, err := p.on(hid)
		for _, id := range b.byHost[hid] {
			if b.out[b.slot[id]].Err != nil {
				continue
			}
			if err != nil {
				b.out[b.slot[id]].Err = Classify(err)
				continue
			}
			sb, err := p.started(ctx, h, id)
			if err != nil {
				b.out[b.slot[id]].Err = Classify(err)
				continue
			}
			b.out[b.slot[id]].Sandbox = &sb
		}
	}
}

// forkOnHost forks children ids of b's parent on the parent's own host,
// each with its branches of volumes if b has them.
func (p *Plane) forkOnHost(ctx context.Context, b *forkBatch, ids []string) (host.ForkResult, error) {
	h, err := p.on(b.parent.HostID)
	if err != nil {
		return host.ForkResult{}, err
	}
	if b.branches == nil {
		return h.Fork(ctx, b.parent.ID, ids)
	}
	vf, ok := h.(host.VolumeForker)
	if !ok {
		return host.ForkResult{}, Errorf(NotImplemented, "host %s cannot branch volumes (its agent is older than this server)", b.parent.HostID)
	}
	specs := make([]host.ForkSpec, len(ids))
	for i, id := range ids {
		specs[i] = host.ForkSpec{ID: id, Branches: b.branches[id]}
		for _, br := range b.branches[id] {
			for _, m := range b.parent.Volumes {
				if m.VolumeID == br.From {
					specs[i].Volumes = append(specs[i].Volumes, host.VolumeMount{Volume: br.To, Path: m.Path, ReadOnly: m.ReadOnly})
				}
			}
		}
	}
	return vf.ForkWithVolumes(ctx, b.parent.ID, specs)
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
		Volumes:   p.cfg.MaxVolumesPerKey,
	}
}

// reserve records a new sandbox against the key's quota, its host
// claimed while it does (claimHost: it cannot be forgotten meanwhile).
func (p *Plane) reserve(ctx context.Context, key catalog.Key, sb catalog.Sandbox) error {
	release, err := p.claimHost(sb.HostID)
	if err != nil {
		return err
	}
	defer release()
	if err := p.cat.ReserveSandbox(ctx, sb, p.Limits(key)); err != nil {
		return fmt.Errorf("reserve sandbox: %w", err)
	}
	return nil
}
