package controlplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// acrossTimeout bounds how long a cross-host fork or move waits for a
// capture to become durable in the object store; storeDownAfter is how
// long it waits once the upload has failed (the store is likely down:
// the caller gets a 503 to retry rather than a long wait).
const (
	acrossTimeout  = 5 * time.Minute
	storeDownAfter = 5 * time.Second // Config.StoreDownAfter's default
)

// storeDown is the error of a wait for a capture whose uploads fail.
func storeDown(storeErr string) error {
	return Errorf(Unavailable, "the object store cannot take the capture now (%s): retry when it is back", storeErr)
}

// forkAcross restores children ids of parent, each on the host hostOf
// gives (not the parent's), from one capture of the parent: a transient
// snapshot on the parent's host that goes to each child's host straight
// from there (host.DirectTransferer: a pack of what differs from the
// template both hold), or, where that cannot be done (an older agent, a
// host without the template, a stream that broke), through the object
// store the hosts share: uploaded by the parent's host, fetched by the
// child's. A child that fails is reported to fail; an error fails them
// all. It returns the capture (its SizeBytes: the parent's own blocks;
// its UploadedBytes: what the upload to the store really sent, if one
// was needed) and what moved to the children's hosts: fetched from the
// store, and sent directly. The capture is deleted afterwards, from
// every host.
func (p *Plane) forkAcross(ctx context.Context, key catalog.Key, parent catalog.Sandbox, ids []string, hostOf func(string) string, fail func(id string, err error)) (si host.SnapshotInfo, moved acrossBytes, err error) {
	src, err := p.on(parent.HostID)
	if err != nil {
		return host.SnapshotInfo{}, moved, err
	}
	snapID := host.NewID()
	t0 := time.Now()
	// A capture only for this fork: unsealed, gone if its host restarts,
	// sent to the store only if someone waits for it (host.Transferer);
	// a host without that takes a durable snapshot.
	tr, _ := src.(host.Transferer)
	if tr != nil {
		si, err = tr.SnapshotTransient(ctx, parent.ID, snapID)
	} else {
		si, err = src.Snapshot(ctx, parent.ID, snapID)
	}
	if err != nil {
		return si, moved, err
	}
	tSnap := time.Since(t0)
	// Each target host keeps the capture it received or fetched as a
	// snapshot of its own. Once the children are made (they keep what
	// they use) every copy goes, after the answer: removing a capture's
	// files (a reflinked memory image) takes tens of milliseconds a host.
	targets := map[string]bool{}
	var targetOrder []string
	for _, id := range ids {
		if hid := hostOf(id); !targets[hid] {
			targets[hid] = true
			targetOrder = append(targetOrder, hid)
		}
	}
	defer p.background(func() { p.dropCapture(context.WithoutCancel(ctx), src, parent.HostID, snapID, targetOrder) })
	pol := PolicyOf(parent.Network)
	reqOf := func(id string) host.CreateRequest {
		return host.CreateRequest{ID: id, Owner: key.ID, SnapshotID: snapID, Template: parent.Template,
			MemoryMiB: parent.MemoryMiB, VCPUs: parent.VCPUs, Env: parent.Env, Network: pol}
	}
	// The first child of each host is made as its pack arrives (where
	// the host can: host.PackCreator), the others from what it received.
	first := map[string]host.CreateRequest{}
	for _, id := range ids {
		if _, ok := first[hostOf(id)]; !ok {
			first[hostOf(id)] = reqOf(id)
		}
	}
	viaStore, made := p.sendDirect(ctx, src, parent.HostID, snapID, targetOrder, first, &moved)
	for id, err := range made {
		if err != nil {
			fail(id, err)
		}
	}
	tSent := time.Since(t0)
	if len(viaStore) > 0 {
		durable, err := p.awaitStore(ctx, src, tr, parent.HostID, snapID)
		if err != nil && len(viaStore) == len(targetOrder) {
			return si, moved, err
		}
		if err != nil {
			// Only the children of the hosts the capture could not reach
			// fail; the others have it.
			lacking := map[string]bool{}
			for _, hid := range viaStore {
				lacking[hid] = true
			}
			var rest []string
			for _, id := range ids {
				if lacking[hostOf(id)] {
					fail(id, err)
				} else {
					rest = append(rest, id)
				}
			}
			ids = rest
		}
		si.UploadedBytes = durable.UploadedBytes
	}
	tReady := time.Since(t0)
	path := "direct"
	switch {
	case len(viaStore) == len(targetOrder):
		path = "store"
	case len(viaStore) > 0:
		path = "direct+store"
	}
	defer func() {
		p.log.Info("cross-host fork", "sandbox_id", parent.ID, "snapshot_id", snapID, "transient", si.Transient, "path", path,
			"snapshot_ms", tSnap.Milliseconds(), "direct_ms", (tSent - tSnap).Milliseconds(), "upload_wait_ms", (tReady - tSent).Milliseconds(),
			"restore_ms", (time.Since(t0) - tReady).Milliseconds(), "dur_ms", time.Since(t0).Milliseconds(), "made_with_pack", len(made), "pulled_bytes", moved.pulled,
			"direct_bytes", moved.direct, "uploaded_bytes", si.UploadedBytes, "fetched_bytes", moved.fetched)
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, id := range ids {
		if _, ok := made[id]; ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := p.on(hostOf(id))
			var in host.Info
			if err == nil {
				in, err = h.Create(ctx, reqOf(id))
			}
			mu.Lock()
			moved.fetched += in.FetchedBytes
			mu.Unlock()
			if err != nil {
				fail(id, err)
			}
		}()
	}
	wg.Wait()
	return si, moved, nil
}

// dropCapture deletes a cross-host fork's capture snapID from its host
// src (srcID) and from the targets that received or fetched it; a host
// that never had it is fine.
func (p *Plane) dropCapture(ctx context.Context, src host.Host, srcID, snapID string, targets []string) {
	if err := src.DeleteSnapshot(ctx, snapID); err != nil && !errors.Is(err, host.ErrNotFound) {
		p.log.Warn("delete the capture of a cross-host fork", "snapshot_id", snapID, "host_id", srcID, "err", err)
	}
	for _, hid := range targets {
		h, err := p.on(hid)
		if err == nil {
			err = h.DeleteSnapshot(ctx, snapID)
		}
		if err != nil && !errors.Is(err, host.ErrNotFound) {
			p.log.Warn("delete the received capture of a cross-host fork", "snapshot_id", snapID, "host_id", hid, "err", err)
		}
	}
}

// acrossBytes is what a cross-host fork moved to the children's hosts:
// sent straight from the parent's host (packs; pulled: those the
// children's hosts fetched from there themselves, not through this
// process), and fetched from the object store.
type acrossBytes struct {
	direct, pulled, fetched int64
}

// sendDirect sends snapshot snapID of host srcID (src) straight to each
// host of targets, all at once, one stream from the source per target,
// and returns the targets it could not send it to (the caller goes
// through the object store for those): the source or the target cannot
// do it (an older agent), the target lacks the capture's template (or
// holds another bake of it), or the stream broke. A target that can
// (host.PackCreator) makes the child first[target] from the pack as it
// arrives: made holds those children's ids, each with its create's error
// (nil: made). It adds the bytes sent to moved.direct.
func (p *Plane) sendDirect(ctx context.Context, src host.Host, srcID, snapID string, targets []string, first map[string]host.CreateRequest,
	moved *acrossBytes) (viaStore []string, made map[string]error) {
	made = map[string]error{}
	dsrc, ok := src.(host.DirectTransferer)
	if !ok {
		return targets, made
	}
	ctx, cancel := context.WithTimeout(ctx, acrossTimeout)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, hid := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, ok := first[hid]
			var n int64
			var cerr error
			var err error
			pulled := false
			if ok {
				n, ok, pulled, cerr, err = p.sendCreate(ctx, dsrc, hid, req)
			} else {
				n, err = p.sendTo(ctx, dsrc, hid, snapID)
			}
			mu.Lock()
			defer mu.Unlock()
			if ok {
				made[req.ID] = cerr
			}
			if err != nil {
				p.log.Warn("direct transfer of a cross-host fork's capture failed: through the object store", "snapshot_id", snapID,
					"from_host", srcID, "host_id", hid, "err", err)
				viaStore = append(viaStore, hid)
				return
			}
			moved.direct += n
			if pulled {
				moved.pulled += n
			}
		}()
	}
	wg.Wait()
	return viaStore, made
}

// sendCreate streams the pack of snapshot req.SnapshotID from dsrc to
// host hid and creates req from it there at once, where hid can
// (host.PackCreator; else as sendTo, and tried is false): hid fetches
// the pack from dsrc itself where both can (host.PackPuller,
// host.PackSourcer: pulled), else this process relays it. It returns
// the bytes of the pack; tried, whether the child was created or failed
// on its own (the pack was received: cerr is the create's error); err,
// why the pack was not received (tried is then false: the caller sends
// it another way, and the child is still to be made).
func (p *Plane) sendCreate(ctx context.Context, dsrc host.DirectTransferer, hid string, req host.CreateRequest) (n int64, tried, pulled bool, cerr, err error) {
	h, err := p.on(hid)
	if err != nil {
		return 0, false, false, nil, err
	}
	pc, ok := h.(host.PackCreator)
	if !ok {
		n, err = p.sendTo(ctx, dsrc, hid, req.SnapshotID)
		return n, false, false, nil, err
	}
	if n, tried, cerr, err := p.pullCreate(ctx, dsrc, h, hid, req); tried || ctx.Err() != nil {
		return n, tried, tried, cerr, err
	}
	rc, err := dsrc.SnapshotPack(ctx, req.SnapshotID)
	if err != nil {
		return 0, false, false, nil, fmt.Errorf("open the capture's pack: %w", err)
	}
	defer rc.Close()
	_, si, err := pc.ReceiveAndCreate(ctx, req, rc)
	if si.ID == "" {
		if errors.Is(err, errors.ErrUnsupported) {
			// An older agent, refused before the pack was read: the
			// pack as before.
			rc.Close()
			n, err = p.sendTo(ctx, dsrc, hid, req.SnapshotID)
			return n, false, false, nil, err
		}
		return 0, false, false, nil, fmt.Errorf("receive the capture's pack: %w", err)
	}
	return si.FetchedBytes, true, false, err, nil
}

// packTicketTTL is how long the child's host of a cross-host fork may
// start fetching the capture's pack from the parent's host.
const packTicketTTL = 2 * time.Minute

// pullCreate has host hid (h) fetch the pack of snapshot req.SnapshotID
// straight from dsrc and create req from it, where both can: the pack
// then crosses the network once, host to host. Its results are
// sendCreate's; a pull that was not tried or did not receive the pack
// (the hosts cannot reach each other, an older agent) is not tried, and
// the caller relays the pack.
func (p *Plane) pullCreate(ctx context.Context, dsrc host.DirectTransferer, h host.Host, hid string, req host.CreateRequest) (n int64, tried bool, cerr, err error) {
	ps, sourcer := dsrc.(host.PackSourcer)
	pp, puller := h.(host.PackPuller)
	if !sourcer || !puller {
		return 0, false, nil, nil
	}
	from, ok := ps.PackSource(req.SnapshotID, packTicketTTL)
	if !ok {
		return 0, false, nil, nil
	}
	_, si, err := pp.PullAndCreate(ctx, req, from)
	if si.ID == "" {
		if ctx.Err() == nil && !errors.Is(err, errors.ErrUnsupported) {
			p.log.Warn("the host of a cross-host fork's child could not fetch the capture from the parent's host: relaying it",
				"snapshot_id", req.SnapshotID, "host_id", hid, "from", from.URL, "err", err)
		}
		return 0, false, nil, err
	}
	return si.FetchedBytes, true, err, nil
}

// sendTo streams snapshot snapID from dsrc to host hid and returns the
// bytes of the pack.
func (p *Plane) sendTo(ctx context.Context, dsrc host.DirectTransferer, hid, snapID string) (int64, error) {
	h, err := p.on(hid)
	if err != nil {
		return 0, err
	}
	dst, ok := h.(host.DirectTransferer)
	if !ok {
		return 0, fmt.Errorf("host %s cannot receive a capture directly: %w", hid, errors.ErrUnsupported)
	}
	rc, err := dsrc.SnapshotPack(ctx, snapID)
	if err != nil {
		return 0, fmt.Errorf("open the capture's pack: %w", err)
	}
	defer rc.Close()
	si, err := dst.ReceiveSnapshot(ctx, snapID, rc)
	if err != nil {
		return 0, fmt.Errorf("receive the capture's pack: %w", err)
	}
	return si.FetchedBytes, nil
}

// awaitStore waits until snapshot id of host src (hostID) is durable in
// the object store (awaitDurable).
func (p *Plane) awaitStore(ctx context.Context, src host.Host, tr host.Transferer, hostID, id string) (host.SnapshotInfo, error) {
	sl, ok := src.(host.SnapshotLister)
	if !ok {
		return host.SnapshotInfo{}, Errorf(NotImplemented, "host %s cannot hand a capture over to another host", hostID)
	}
	return p.awaitDurable(ctx, sl, tr, hostID, id)
}

// awaitDurable waits until host hostID's snapshot id is durable in the
// object store and returns it as the host then describes it: through tr
// (the host waits, and answers as soon as the upload ends) if the host
// has it, else, or if tr is an older remote agent's, by listing the
// host's snapshots every 50 ms. A capture whose upload has been failing
// for Config.StoreDownAfter is a 503 (storeDown).
func (p *Plane) awaitDurable(ctx context.Context, sl host.SnapshotLister, tr host.Transferer, hostID, id string) (host.SnapshotInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, acrossTimeout)
	defer cancel()
	t0 := time.Now()
	var last string
	for tr != nil {
		si, err := tr.AwaitStored(ctx, id, p.storeDownAfter())
		if errors.Is(err, errors.ErrUnsupported) {
			break
		}
		if err != nil {
			if ctx.Err() != nil && last != "" {
				return host.SnapshotInfo{}, storeDown(last)
			}
			if ctx.Err() != nil {
				return host.SnapshotInfo{}, fmt.Errorf("wait for the capture to reach the object store: %w", ctx.Err())
			}
			return host.SnapshotInfo{}, err
		}
		if done, err := durableOrNot(si, hostID); done || err != nil {
			return si, err
		}
		last = si.StoreError
		if last != "" && time.Since(t0) >= p.storeDownAfter() {
			return host.SnapshotInfo{}, storeDown(last)
		}
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		list, err := sl.Snapshots(ctx)
		if err != nil {
			return host.SnapshotInfo{}, err
		}
		for _, si := range list {
			if si.ID != id {
				continue
			}
			if done, err := durableOrNot(si, hostID); done || err != nil {
				return si, err
			}
			last = si.StoreError
		}
		if last != "" && time.Since(t0) > p.storeDownAfter() {
			return host.SnapshotInfo{}, storeDown(last)
		}
		select {
		case <-ctx.Done():
			if last != "" {
				return host.SnapshotInfo{}, storeDown(last)
			}
			return host.SnapshotInfo{}, fmt.Errorf("wait for the capture to reach the object store: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// durableOrNot says whether host hostID's capture si is durable in the
// object store (done), or an error if it never will be (the host has no
// store); neither while it is uploading.
func durableOrNot(si host.SnapshotInfo, hostID string) (done bool, err error) {
	switch si.Stored {
	case host.StoredDurable:
		return true, nil
	case host.StoredLocal, "":
		return false, Errorf(Invalid, "host %s has no object store: a sandbox can move to another host only when the hosts share one (panda agent --store)", hostID)
	}
	return false, nil
}

// PolicyOf is the egress policy a record holds.
func PolicyOf(n catalog.Network) netpolicy.Policy {
	p := netpolicy.Policy{Internet: n.Internet, AllowOut: n.AllowOut, DenyOut: n.DenyOut}
	if p.AllowOut == nil {
		p.AllowOut = []string{}
	}
	if p.DenyOut == nil {
		p.DenyOut = []string{}
	}
	return p
}
