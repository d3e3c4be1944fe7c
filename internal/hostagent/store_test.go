package hostagent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/internal/storesync"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/manifest"
	"github.com/pandastack/pandastack/internal/storage/objstore"
	"github.com/pandastack/pandastack/internal/testing/s3test"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// snapOn snapshots sandbox id on a and returns the snapshot's ID.
func snapOn(t *testing.T, a *Agent, id string) SnapshotInfo {
	t.Helper()
	si, err := a.Snapshot(ctxT(t), id, host.NewID())
	if err != nil {
		t.Fatalf("snapshot %s: %v", id, err)
	}
	if si.Stored != host.StoredUploading {
		t.Errorf("new snapshot %s: stored %q, want %q", si.ID, si.Stored, host.StoredUploading)
	}
	return si
}

// durableSnapOn is snapOn, returning once the snapshot is durable in the
// object store.
func durableSnapOn(t *testing.T, a *Agent, id string) SnapshotInfo {
	t.Helper()
	snap := snapOn(t, a, id)
	testkit.WaitForf(t, time.Minute, func() string { return "snapshot durable: " + stored(a, snap.ID).Stored },
		func() bool { return stored(a, snap.ID).Stored == host.StoredDurable })
	return snap
}

func createFrom(t *testing.T, a *Agent, snapID string) (Info, error) {
	t.Helper()
	info, err := a.Create(ctxT(t), CreateRequest{SnapshotID: snapID})
	if err == nil {
		t.Cleanup(func() { a.Kill(context.Background(), info.ID) })
	}
	return info, err
}

func stored(a *Agent, id string) SnapshotInfo {
	si, err := a.GetSnapshot(id)
	if err != nil {
		return SnapshotInfo{SnapshotInfo: host.SnapshotInfo{ID: id, StoreError: "GetSnapshot: " + err.Error()}}
	}
	return si
}

// TestSnapshotsDurableInTheStore: with an object store (a real S3 server),
// every snapshot is uploaded in the background and becomes durable; a
// snapshot whose files the host lost is downloaded again by the next
// create from it; a store that is down leaves snapshots usable locally,
// shows the error, fails only restores that need it (ErrUnavailable) and
// loses nothing; an upload the store's outage or an agent restart
// interrupted completes later; deleting a snapshot removes its manifest,
// and garbage collection its chunks.
func TestSnapshotsDurableInTheStore(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	s3 := s3test.Start(t)
	objs := s3.Open("agent")
	cs, err := chunkstore.New(objs, chunkstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, open := restartableWith(t, func(c *Config) { c.Store = cs; c.StoreRetry = 100 * time.Millisecond })
	a := open()
	a.Recover(ctxT(t))
	src, err := a.Create(ctxT(t), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	shOn(t, a, src.ID, "echo durable > /root/d.txt")

	// Taken, uploaded, durable.
	t0 := time.Now()
	s1 := snapOn(t, a, src.ID)
	testkit.WaitForf(t, time.Minute, func() string { return "snapshot 1 durable: " + stored(a, s1.ID).Stored },
		func() bool { return stored(a, s1.ID).Stored == host.StoredDurable })
	rec, _ := a.sync.Record(s1.ID)
	t.Logf("snapshot of a %d MiB tiny sandbox durable in %v: %d chunks, %d uploaded (%d MiB), %d zero, %d shared",
		s1.Spec.MemoryMiB, time.Since(t0).Round(time.Millisecond), rec.Upload.ChunksTotal, rec.Upload.ChunksUploaded,
		rec.Upload.BytesUploaded>>20, rec.Upload.ZeroChunks, rec.Upload.ChunksShared)
	if _, err := cs.Manifest(ctxT(t), "snapshots/"+s1.ID); err != nil {
		t.Fatalf("manifest of a durable snapshot: %v", err)
	}

	// The host loses the snapshot's files: it is still listed, and a
	// create from it downloads it.
	local := filepath.Join(a.StoreDir(), "snapshots", s1.ID)
	if err := os.RemoveAll(local); err != nil {
		t.Fatal(err)
	}
	if si := stored(a, s1.ID); si.Stored != host.StoredDurable || si.SandboxID != src.ID {
		t.Errorf("snapshot whose files are lost: %+v", si)
	}
	listed := false
	for _, si := range a.Snapshots() {
		listed = listed || si.ID == s1.ID
	}
	if !listed {
		t.Errorf("Snapshots() lacks %s, whose files are lost", s1.ID)
	}
	t1 := time.Now()
	c1, err := createFrom(t, a, s1.ID)
	if err != nil {
		t.Fatalf("create from a snapshot the host lost: %v", err)
	}
	t.Logf("create from the snapshot, downloaded from the store first: %v", time.Since(t1).Round(time.Millisecond))
	if got := shOn(t, a, c1.ID, "cat /root/d.txt"); got != "durable\n" {
		t.Errorf("restored from the store: d.txt is %q", got)
	}
	if _, err := os.Stat(filepath.Join(local, manifest.Name)); err != nil {
		t.Errorf("fetched snapshot directory: %v", err)
	}

	// Lost again, and the store down: the create fails as unavailable
	// and loses nothing.
	if err := os.RemoveAll(local); err != nil {
		t.Fatal(err)
	}
	s3.Stop()
	if _, err := createFrom(t, a, s1.ID); !errors.Is(err, host.ErrUnavailable) {
		t.Fatalf("create from a lost snapshot with the store down: %v, want ErrUnavailable", err)
	}
	if _, err := os.Stat(local + storesync.FetchSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed fetch left %s: %v", local+storesync.FetchSuffix, err)
	}
	if si := stored(a, s1.ID); si.Stored != host.StoredDurable {
		t.Errorf("after a failed fetch: %+v", si)
	}

	// A snapshot taken while the store is down serves locally; its state
	// says why it is not durable.
	shOn(t, a, src.ID, "echo second > /root/d.txt")
	s2 := snapOn(t, a, src.ID)
	testkit.WaitForf(t, time.Minute, func() string { return "an upload error: " + stored(a, s2.ID).StoreError },
		func() bool { return stored(a, s2.ID).StoreError != "" })
	if si := stored(a, s2.ID); si.Stored != host.StoredUploading || si.StoreError != "the object store is unavailable" {
		t.Errorf("snapshot taken with the store down: stored %q, error %q", si.Stored, si.StoreError)
	}
	c2, err := createFrom(t, a, s2.ID)
	if err != nil {
		t.Fatalf("create from a snapshot not durable yet: %v", err)
	}
	if got := shOn(t, a, c2.ID, "cat /root/d.txt"); got != "second\n" {
		t.Errorf("restored from the local copy: d.txt is %q", got)
	}

	// The store comes back: the upload completes, and the lost snapshot
	// can be restored again.
	s3.Restart()
	testkit.WaitForf(t, time.Minute, func() string { return "snapshot 2 durable: " + stored(a, s2.ID).Stored },
		func() bool { return stored(a, s2.ID).Stored == host.StoredDurable })
	if si := stored(a, s2.ID); si.StoreError != "" {
		t.Errorf("durable snapshot keeps the error %q", si.StoreError)
	}
	rec2, _ := a.sync.Record(s2.ID)
	t.Logf("a second snapshot of the same sandbox: %d chunks, %d uploaded (%d MiB), %d already in the store",
		rec2.Upload.ChunksTotal, rec2.Upload.ChunksUploaded, rec2.Upload.BytesUploaded>>20, rec2.Upload.ChunksShared)
	if rec2.Upload.ChunksShared == 0 {
		t.Errorf("a second snapshot of the same sandbox shares no chunk with the first: %+v", rec2.Upload)
	}
	if _, err := createFrom(t, a, s1.ID); err != nil {
		t.Fatalf("create from a lost snapshot once the store is back: %v", err)
	}

	// An upload an agent restart interrupts completes after the restart.
	s3.Stop()
	s3snap := snapOn(t, a, src.ID)
	testkit.WaitForf(t, time.Minute, func() string { return "an upload error: " + stored(a, s3snap.ID).StoreError },
		func() bool { return stored(a, s3snap.ID).StoreError != "" })
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	s3.Restart()
	a = open()
	a.Recover(ctxT(t))
	testkit.WaitForf(t, time.Minute, func() string { return "snapshot 3 durable after a restart: " + stored(a, s3snap.ID).Stored },
		func() bool { return stored(a, s3snap.ID).Stored == host.StoredDurable })

	// Deletes remove the manifests, then the chunks no manifest uses.
	for _, id := range []string{s1.ID, s2.ID, s3snap.ID} {
		if err := a.DeleteSnapshot(id); err != nil {
			t.Fatalf("delete snapshot %s: %v", id, err)
		}
		if _, err := a.GetSnapshot(id); !errors.Is(err, ErrNotFound) {
			t.Errorf("deleted snapshot %s: %v, want ErrNotFound", id, err)
		}
		testkit.WaitForf(t, time.Minute, func() string { return "manifest of " + id + " gone from the store" }, func() bool {
			_, err := cs.Manifest(context.Background(), "snapshots/"+id)
			return errors.Is(err, objstore.ErrNotFound)
		})
	}
	// What is left is the template's set (templates.go), which stays.
	names, err := cs.Names(ctxT(t))
	if err != nil || len(names) != 1 || !strings.HasPrefix(names[0], "templates/") {
		t.Fatalf("sets left in the store: %q, %v; want the template's only", names, err)
	}
	tmplSet, err := cs.Manifest(ctxT(t), names[0])
	if err != nil {
		t.Fatal(err)
	}
	keep := hashesOf(tmplSet)
	testkit.WaitForf(t, time.Minute, func() string { return "no chunks left in the store but the template's" }, func() bool {
		for in, err := range objs.List(context.Background(), "chunks/") {
			if err != nil || !keep[strings.TrimPrefix(in.Key, "chunks/")] {
				return false
			}
		}
		return true
	})
	if recs, _ := filepath.Glob(filepath.Join(a.StoreDir(), storesync.StoredDir, "*.json")); len(recs) != 0 {
		t.Errorf("%d records left in %s after deleting every snapshot", len(recs), storesync.StoredDir)
	}
	if n := len(a.Snapshots()); n != 0 {
		t.Errorf("%d snapshots left after deleting all", n)
	}
}

// TestGarbageCollectionPutOff: a snapshot deleted while another host's
// upload holds its lease keeps its chunks until that upload ends, and
// then loses them although this host uploads nothing more: the put-off
// collection is tried again.
func TestGarbageCollectionPutOff(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	s3 := s3test.Start(t)
	objs := s3.Open("gc")
	open, cs := storeHost(t, objs)
	a, src := sourceSandbox(t, open)
	shOn(t, a, src.ID, "head -c 4194304 /dev/urandom > /dev/shm/own") // chunks of its own
	snap := durableSnapOn(t, a, src.ID)
	idle := func() bool { // no upload or delete of this host runs
		return a.sync.Idle()
	}
	testkit.WaitForf(t, time.Minute, func() string { return "this host's store jobs ended" }, idle)
	m, err := cs.Manifest(ctxT(t), storesync.SnapshotSet(snap.ID))
	if err != nil {
		t.Fatal(err)
	}

	// Another host's upload, held in the middle.
	gated := &gatedStore{Store: objs, entered: make(chan struct{}, 1)}
	other, err := chunkstore.New(gated, chunkstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(f, []byte("another host's set"), 0o600); err != nil {
		t.Fatal(err)
	}
	gate := gated.close()
	uploaded := make(chan error, 1)
	go func() {
		_, _, err := other.Upload(context.Background(), "other", map[string]string{"f": f}, nil)
		uploaded <- err
	}()
	select {
	case <-gated.entered:
	case <-time.After(time.Minute):
		t.Fatal("the other host's upload stored no chunk")
	}

	if err := a.DeleteSnapshot(snap.ID); err != nil {
		t.Fatal(err)
	}
	testkit.WaitForf(t, time.Minute, func() string { return "manifest gone from the store" }, func() bool { return !hasManifest(cs, m.Name) })
	only := unreferenced(t, cs, m)
	testkit.WaitForf(t, time.Minute, func() string { return "a garbage collection put off" }, func() bool {
		return a.sync.LastError(storesync.GCKey) != nil
	})
	for _, h := range only {
		if ok, err := objstore.Exists(ctxT(t), objs, "chunks/"+h); err != nil || !ok {
			t.Fatalf("chunk %s collected while an upload held its lease: %v, %v", h, ok, err)
		}
	}
	close(gate)
	if err := <-uploaded; err != nil {
		t.Fatal(err)
	}
	waitCollected(t, cs, objs, m)
	testkit.WaitForf(t, time.Minute, func() string { return "the collection's job ended" }, idle)
}
