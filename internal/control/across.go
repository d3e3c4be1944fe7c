package control

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/catalog"
	"github.com/pandastack/pandastack/internal/host"
	"github.com/pandastack/pandastack/internal/network"
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
// gives (not the parent's), from one capture of the parent that travels
// through the object store the hosts share: a snapshot on the parent's
// host, uploaded there, restored by each child's host. A child that fails
// is reported to fail; an error fails them all. It returns the capture
// (its SizeBytes: the parent's own blocks, what its host uploads at most;
// its UploadedBytes: what the upload really sent, chunks the store held
// already, its template's among them, not sent again) and the bytes the
// children's hosts fetched from the store (chunks their copy of the
// template did not hold). The capture is deleted afterwards, from every
// host.
func (p *Plane) forkAcross(ctx context.Context, key catalog.Key, parent catalog.Sandbox, ids []string, hostOf func(string) string, fail func(id string, err error)) (si host.SnapshotInfo, fetched int64, err error) {
	src, err := p.on(parent.HostID)
	if err != nil {
		return host.SnapshotInfo{}, 0, err
	}
	sl, ok := src.(host.SnapshotLister)
	if !ok {
		return host.SnapshotInfo{}, 0, Errorf(NotImplemented, "host %s cannot hand a capture over to another host", parent.HostID)
	}
	snapID := host.NewID()
	t0 := time.Now()
	// A capture only for this fork: unsealed, gone if its host restarts
	// (host.Transferer); a host without that takes a durable snapshot.
	tr, _ := src.(host.Transferer)
	if tr != nil {
		si, err = tr.SnapshotTransient(ctx, parent.ID, snapID)
	} else {
		si, err = src.Snapshot(ctx, parent.ID, snapID)
	}
	if err != nil {
		return si, 0, err
	}
	tSnap := time.Since(t0)
	defer func() {
		if err := src.DeleteSnapshot(context.WithoutCancel(ctx), snapID); err != nil && !errors.Is(err, host.ErrNotFound) {
			p.log.Warn("delete the capture of a cross-host fork", "snapshot_id", snapID, "host_id", parent.HostID, "err", err)
		}
	}()
	durable, err := p.awaitDurable(ctx, sl, tr, parent.HostID, snapID)
	if err != nil {
		return si, 0, err
	}
	si.UploadedBytes = durable.UploadedBytes
	tDurable := time.Since(t0)
	defer func() {
		p.log.Info("cross-host fork", "sandbox_id", parent.ID, "snapshot_id", snapID, "transient", si.Transient,
			"snapshot_ms", tSnap.Milliseconds(), "upload_wait_ms", (tDurable - tSnap).Milliseconds(),
			"restore_ms", (time.Since(t0) - tDurable).Milliseconds(), "dur_ms", time.Since(t0).Milliseconds(),
			"uploaded_bytes", si.UploadedBytes, "fetched_bytes", fetched)
	}()
	pol := PolicyOf(parent.Network)
	var wg sync.WaitGroup
	var mu sync.Mutex
	// Each target host keeps the capture it fetched as a snapshot of its
	// own: it goes once the children are made (they keep what they use).
	targets := map[string]bool{}
	for _, id := range ids {
		targets[hostOf(id)] = true
	}
	defer func() {
		for hid := range targets {
			h, err := p.on(hid)
			if err == nil {
				err = h.DeleteSnapshot(context.WithoutCancel(ctx), snapID)
			}
			if err != nil && !errors.Is(err, host.ErrNotFound) {
				p.log.Warn("delete the fetched capture of a cross-host fork", "snapshot_id", snapID, "host_id", hid, "err", err)
			}
		}
	}()
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := p.on(hostOf(id))
			var in host.Info
			if err == nil {
				in, err = h.Create(ctx, host.CreateRequest{ID: id, Owner: key.ID, SnapshotID: snapID, Template: parent.Template,
					MemoryMiB: parent.MemoryMiB, VCPUs: parent.VCPUs, Env: parent.Env, Network: pol})
			}
			mu.Lock()
			fetched += in.FetchedBytes
			mu.Unlock()
			if err != nil {
				fail(id, err)
			}
		}()
	}
	wg.Wait()
	return si, fetched, nil
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
func PolicyOf(n catalog.Network) network.Policy {
	p := network.Policy{Internet: n.Internet, AllowOut: n.AllowOut, DenyOut: n.DenyOut}
	if p.AllowOut == nil {
		p.AllowOut = []string{}
	}
	if p.DenyOut == nil {
		p.DenyOut = []string{}
	}
	return p
}
