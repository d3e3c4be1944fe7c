package hostagent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/hostagent/internal/storesync"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/objstore"
	"github.com/pandastack/pandastack/internal/testing/s3test"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// storeHost returns an opener of agents on a data directory of their own
// (a host) whose object store is objs, and that store's chunkstore as the
// host sees it.
func storeHost(t *testing.T, objs objstore.Store) (open func() *Agent, cs *chunkstore.Store) {
	t.Helper()
	cs, err := chunkstore.New(objs, chunkstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, open = restartableWith(t, func(c *Config) { c.Store = cs; c.StoreRetry = 100 * time.Millisecond })
	return open, cs
}

// sourceSandbox opens an agent with open, recovers it and creates a
// sandbox there, killed when the test ends.
func sourceSandbox(t *testing.T, open func() *Agent) (*Agent, Info) {
	t.Helper()
	a := open()
	a.Recover(ctxT(t))
	src, err := a.Create(ctxT(t), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Kill(context.Background(), src.ID) })
	return a, src
}

// memState puts state in sandbox id that lives only in its memory: a 4
// MiB file of random bytes in /dev/shm (its MD5 returned) and a process
// holding a random secret (startKeeperOn; its pid and secret returned).
func memState(t *testing.T, a *Agent, id string) (sum, keeper, secret string) {
	t.Helper()
	sum = shOn(t, a, id, "head -c 4194304 /dev/urandom > /dev/shm/blob && md5sum /dev/shm/blob")
	keeper = startKeeperOn(t, a, id)
	return sum, keeper, askKeeperOn(t, a, id, keeper)
}

// startKeeperOn starts a process in sandbox id of a that holds a random
// secret in memory only and writes it to /root/secret.out when it gets
// SIGUSR1. It returns the process's pid once the process has set its
// trap: a signal before that would end it.
func startKeeperOn(t *testing.T, a *Agent, id string) string {
	t.Helper()
	return strings.TrimSpace(shOn(t, a, id, `secret=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n'); rm -f /root/keeper.ready; `+
		`(trap 'echo $secret > /root/secret.out' USR1; : > /root/keeper.ready; while :; do sleep 0.05; done) >/dev/null 2>&1 & `+
		`pid=$!; i=0; while [ ! -e /root/keeper.ready ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; [ -e /root/keeper.ready ] && echo $pid`))
}

func askKeeperOn(t *testing.T, a *Agent, id, pid string) string {
	t.Helper()
	return strings.TrimSpace(shOn(t, a, id, "rm -f /root/secret.out; kill -USR1 "+pid+
		"; i=0; while [ ! -s /root/secret.out ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; cat /root/secret.out"))
}

// checkMemState checks what memState put in a sandbox: on b, sandbox id.
func checkMemState(t *testing.T, what string, b *Agent, id, sum, keeper, secret string) {
	t.Helper()
	if got := shOn(t, b, id, "md5sum /dev/shm/blob"); got != sum {
		t.Errorf("%s: /dev/shm/blob is %q, want %q", what, got, sum)
	}
	if got := askKeeperOn(t, b, id, keeper); got != secret {
		t.Errorf("%s: the process holding a secret in memory answered %q, want %q", what, got, secret)
	}
}

func infoOf(a *Agent, id string) Info {
	in, err := a.Get(id)
	if err != nil {
		return Info{ID: id, StoreError: "Get: " + err.Error()}
	}
	return in
}

func hasManifest(cs *chunkstore.Store, name string) bool {
	_, err := cs.Manifest(context.Background(), name)
	return err == nil
}

// unreferenced returns the objects under chunks/ that m needs (its
// chunks, its deltas' bases and patches) and no manifest in the store
// references now.
func unreferenced(t *testing.T, cs *chunkstore.Store, m *chunkstore.Manifest) []string {
	t.Helper()
	ctx := ctxT(t)
	used := map[string]bool{}
	names, err := cs.Names(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		om, err := cs.Manifest(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		om.Objects(func(h string) { used[h] = true })
	}
	var out []string
	m.Objects(func(h string) {
		if !used[h] {
			out = append(out, h)
		}
	})
	return out
}

// waitCollected waits until m's set is gone from the store and garbage
// collection has removed the chunks only it referenced.
func waitCollected(t *testing.T, cs *chunkstore.Store, objs objstore.Store, m *chunkstore.Manifest) {
	t.Helper()
	testkit.WaitForf(t, time.Minute, func() string { return "manifest " + m.Name + " gone from the store" }, func() bool { return !hasManifest(cs, m.Name) })
	only := unreferenced(t, cs, m)
	if len(only) == 0 {
		t.Errorf("%s had no chunk of its own: the test proves nothing about garbage collection", m.Name)
	}
	testkit.WaitForf(t, time.Minute, func() string { return "garbage collection of the chunks of " + m.Name }, func() bool {
		for _, h := range only {
			if ok, err := objstore.Exists(context.Background(), objs, "chunks/"+h); err != nil || ok {
				return false
			}
		}
		return true
	})
}

// TestSandboxesMoveBetweenHosts: two hosts with data directories of their
// own share one object store (a real S3 server). A snapshot taken on A is
// restored on B, which never saw it; a sandbox paused on A becomes
// durable and is resumed on B, its files and the state held only in its
// memory intact, and its capture then leaves the store; a stale copy of a
// paused sandbox killed on A never deletes a later pause made on B; and a
// paused sandbox whose host is gone is killed through another host.
func TestSandboxesMoveBetweenHosts(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	s3 := s3test.Start(t)
	objs := s3.Open("fleet")
	openA, csA := storeHost(t, s3.Open("fleet"))
	openB, csB := storeHost(t, s3.Open("fleet"))
	a, b := openA(), openB()
	a.Recover(ctxT(t))
	b.Recover(ctxT(t))

	src, err := a.Create(ctxT(t), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Kill(context.Background(), src.ID) })
	shOn(t, a, src.ID, "echo on-a > /root/f.txt")
	sum, keeper, secret := memState(t, a, src.ID)

	// (a) A snapshot on A, created from on B.
	snap := durableSnapOn(t, a, src.ID)
	if _, err := b.GetSnapshot(snap.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("B knows snapshot %s before any create from it: %v", snap.ID, err)
	}
	t0 := time.Now()
	child, err := createFrom(t, b, snap.ID)
	if err != nil {
		t.Fatalf("create on B from a snapshot taken on A: %v", err)
	}
	t.Logf("create on B from a snapshot B never saw (lookup, download, restore): %v", time.Since(t0).Round(time.Millisecond))
	if got := shOn(t, b, child.ID, "cat /root/f.txt; hostname"); got != "on-a\n"+child.ID+"\n" {
		t.Errorf("sandbox on B from A's snapshot: %q", got)
	}
	checkMemState(t, "sandbox on B from A's snapshot", b, child.ID, sum, keeper, secret)
	if si := stored(b, snap.ID); si.Stored != host.StoredDurable || si.SandboxID != src.ID || si.Spec.MemoryMiB != snap.Spec.MemoryMiB {
		t.Errorf("B's view of the adopted snapshot: %+v", si)
	}
	if _, err := createFrom(t, b, host.NewID()); !errors.Is(err, ErrNotFound) {
		t.Errorf("create on B from a snapshot no one has: %v, want ErrNotFound", err)
	}
	b.Kill(ctxT(t), child.ID)

	// A snapshot uploaded before manifests carried metadata: B reads it
	// from the set's snapshot.json.
	old := durableSnapOn(t, a, src.ID)
	stripMeta(t, objs, "manifests/snapshots/"+old.ID+".json")
	child, err = createFrom(t, b, old.ID)
	if err != nil {
		t.Fatalf("create on B from a snapshot without metadata in its manifest: %v", err)
	}
	if si := stored(b, old.ID); si.SandboxID != src.ID || si.Stored != host.StoredDurable {
		t.Errorf("B's view of a snapshot without metadata in its manifest: %+v", si)
	}
	checkMemState(t, "sandbox on B from a snapshot without metadata in its manifest", b, child.ID, sum, keeper, secret)
	b.Kill(ctxT(t), child.ID)

	// (b) Paused on A, durable, resumed on B.
	shOn(t, a, src.ID, "echo paused-on-a >> /root/f.txt")
	t0 = time.Now()
	if _, err := a.Pause(ctxT(t), src.ID); err != nil {
		t.Fatal(err)
	}
	if in := infoOf(a, src.ID); in.State != StatePaused || (in.Stored != host.StoredUploading && in.Stored != host.StoredDurable) {
		t.Errorf("just paused: %+v", in)
	}
	testkit.WaitForf(t, time.Minute, func() string { return "paused sandbox durable: " + infoOf(a, src.ID).Stored },
		func() bool { return infoOf(a, src.ID).Stored == host.StoredDurable })
	pidA := pauseIDOf(t, a, src.ID)
	rec, _ := a.sync.PausedRecord(src.ID, pidA)
	t.Logf("paused %d MiB sandbox durable %v after Pause began: %d chunks, %d uploaded (%d MiB), %d zero, %d shared",
		src.MemoryMiB, time.Since(t0).Round(time.Millisecond), rec.Upload.ChunksTotal, rec.Upload.ChunksUploaded,
		rec.Upload.BytesUploaded>>20, rec.Upload.ZeroChunks, rec.Upload.ChunksShared)

	// A new egress policy for the paused sandbox: the copy in the store
	// is uploaded again to carry it (its chunks are there already).
	policy := netpolicy.Policy{AllowOut: []string{"192.0.2.0/24"}}
	if err := a.SetNetwork(ctxT(t), src.ID, policy); err != nil {
		t.Fatal(err)
	}
	testkit.WaitForf(t, time.Minute, func() string { return "paused sandbox durable again: " + infoOf(a, src.ID).Stored },
		func() bool { return infoOf(a, src.ID).Stored == host.StoredDurable })
	pausedSet, err := csA.Manifest(ctxT(t), "paused/"+src.ID)
	if err != nil {
		t.Fatalf("manifest of a durable paused sandbox: %v", err)
	}

	// The store down: B cannot resume it, says so, and keeps nothing.
	s3.Stop()
	if _, err := b.Resume(ctxT(t), src.ID); !errors.Is(err, host.ErrUnavailable) {
		t.Errorf("resume on B with the store down: %v, want ErrUnavailable", err)
	}
	if _, err := b.Get(src.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("B after a failed resume from the store: %v, want ErrNotFound", err)
	}
	s3.Restart()

	t0 = time.Now()
	in, err := b.Resume(ctxT(t), src.ID)
	if err != nil {
		t.Fatalf("resume on B of a sandbox paused on A: %v", err)
	}
	t.Logf("resume on B of a sandbox paused on A (lookup, download of %d MiB of %d, restore): %v",
		in.FetchedBytes>>20, storedBytes(pausedSet)>>20, time.Since(t0).Round(time.Millisecond))
	if in.State != StateRunning || in.ID != src.ID || in.Stored != "" || !in.CreatedAt.Equal(src.CreatedAt) {
		t.Errorf("resumed on B: %+v (created on A at %v)", in, src.CreatedAt)
	}
	t.Cleanup(func() { b.Kill(context.Background(), src.ID) })
	if got := shOn(t, b, src.ID, "cat /root/f.txt; hostname"); got != "on-a\npaused-on-a\n"+src.ID+"\n" {
		t.Errorf("resumed on B: %q", got)
	}
	checkMemState(t, "resumed on B", b, src.ID, sum, keeper, secret)
	if s, err := b.get(src.ID); err != nil || !slices.Equal(s.rec.Network.AllowOut, policy.AllowOut) || s.rec.Network.Internet {
		t.Errorf("resumed on B with network policy %+v, want %+v", s.rec.Network, policy)
	}
	if _, err := b.Resume(ctxT(t), host.NewID()); !errors.Is(err, ErrNotFound) {
		t.Errorf("resume on B of a sandbox no one has: %v, want ErrNotFound", err)
	}
	waitCollected(t, csB, objs, pausedSet)

	// A still holds its stale copy. B pauses the sandbox again; A's kill
	// of its stale copy must not delete B's capture.
	shOn(t, b, src.ID, "echo paused-on-b >> /root/f.txt")
	if _, err := b.Pause(ctxT(t), src.ID); err != nil {
		t.Fatal(err)
	}
	testkit.WaitForf(t, time.Minute, func() string { return "paused on B durable: " + infoOf(b, src.ID).Stored },
		func() bool { return infoOf(b, src.ID).Stored == host.StoredDurable })
	if in := infoOf(a, src.ID); in.State != StatePaused {
		t.Fatalf("A's stale copy: %+v", in)
	}
	// A refuses to resume its stale copy (the sandbox would run twice),
	// and a new policy for it does not bring it back into the store.
	if _, err := a.Resume(ctxT(t), src.ID); !errors.Is(err, ErrConflict) {
		t.Errorf("resume on A of its stale copy: %v, want ErrConflict", err)
	}
	if err := a.SetNetwork(ctxT(t), src.ID, netpolicy.Policy{}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitForf(t, time.Minute, func() string { return "A's upload of its stale copy given up: " + infoOf(a, src.ID).StoreError },
		func() bool {
			return strings.Contains(infoOf(a, src.ID).StoreError, "resumed or killed on another host")
		})
	if m, err := csA.Manifest(ctxT(t), "paused/"+src.ID); err != nil || storedBytes(m) == 0 {
		t.Fatalf("B's capture after A's stale upload: %v", err)
	} else if !strings.Contains(string(m.Meta), pauseIDOf(t, b, src.ID)) {
		t.Errorf("the store's paused/%s is no longer B's capture %s: %s", src.ID, pauseIDOf(t, b, src.ID), m.Meta)
	}
	if err := a.Kill(ctxT(t), src.ID); err != nil {
		t.Fatalf("kill of A's stale copy: %v", err)
	}
	testkit.WaitForf(t, time.Minute, func() string { return "A's tombstone of its capture gone" }, func() bool {
		_, ok := a.sync.PausedRecord(src.ID, pidA)
		return !ok
	})
	if m, err := csA.Manifest(ctxT(t), "paused/"+src.ID); err != nil {
		t.Fatalf("B's capture after A killed its stale copy: %v", err)
	} else {
		pausedSet = m
	}

	// B is lost (its agent stops; the paused sandbox stays on its disk):
	// a kill through A removes the capture from the store.
	b.Close()
	if err := a.Kill(ctxT(t), src.ID); err != nil {
		t.Fatalf("kill through A of a sandbox paused only in the store: %v", err)
	}
	waitCollected(t, csA, objs, pausedSet)
	if err := a.Kill(ctxT(t), src.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("second kill: %v, want ErrNotFound", err)
	}
}

// storedBytes is how much of m's files the store holds (its chunks that
// are not zeros): what a download fetches.
func storedBytes(m *chunkstore.Manifest) int64 {
	var n int64
	for _, f := range m.Files {
		for i, h := range f.Chunks {
			if h != "" {
				n += min(m.ChunkSize, f.Size-int64(i)*m.ChunkSize)
			}
		}
	}
	return n
}

// stripMeta rewrites the manifest at key without its meta, as manifests
// were written before they carried one.
func stripMeta(t *testing.T, objs objstore.Store, key string) {
	t.Helper()
	rc, err := objs.Get(ctxT(t), key)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	err = json.NewDecoder(rc).Decode(&m)
	rc.Close()
	if err != nil || m["meta"] == nil {
		t.Fatalf("manifest %s: %v, meta %s", key, err, m["meta"])
	}
	delete(m, "meta")
	b, _ := json.Marshal(m)
	if err := objs.Put(ctxT(t), key, bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
}

// pauseIDOf is the PauseID of sandbox id's capture on a.
func pauseIDOf(t *testing.T, a *Agent, id string) string {
	t.Helper()
	s, err := a.get(id)
	if err != nil {
		t.Fatal(err)
	}
	return s.pauseID()
}

// gatedStore is an object store whose chunk writes wait, once close is
// called, until the gate it returns is closed: an upload held in the
// middle.
type gatedStore struct {
	objstore.Store
	entered chan struct{} // receives when a write waits at the gate

	mu   sync.Mutex
	gate chan struct{}
}

func (g *gatedStore) close() chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.gate = make(chan struct{})
	return g.gate
}

func (g *gatedStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil && strings.HasPrefix(key, "chunks/") {
		select {
		case g.entered <- struct{}{}:
		default:
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.Store.Put(ctx, key, r, size)
}

// TestPausedSandboxesAndTheStoreDown: a resume right after a pause, while
// the upload runs, works and leaves nothing in the store; with the store
// down a pause shows why it is not durable, resumes locally all the same,
// and becomes durable once the store is back, across an agent restart; a
// kill of a durable paused sandbox removes its capture from the store.
func TestPausedSandboxesAndTheStoreDown(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	s3 := s3test.Start(t)
	objs := s3.Open("fleet")
	gated := &gatedStore{Store: objs, entered: make(chan struct{}, 1)}
	open, cs := storeHost(t, gated)
	a, sb := sourceSandbox(t, open)
	shOn(t, a, sb.ID, "echo kept > /root/p.txt")
	sum, keeper, secret := memState(t, a, sb.ID)
	noPausedState := func() bool {
		recs, _ := os.ReadDir(filepath.Join(a.StoreDir(), storesync.StoredDir, storesync.PausedRecordDir))
		return len(recs) == 0 && !hasManifest(cs, "paused/"+sb.ID)
	}

	// Resumed while its upload runs (held in the middle: its first chunk
	// waits at the gate).
	gate := gated.close()
	if _, err := a.Pause(ctxT(t), sb.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gated.entered:
	case <-time.After(time.Minute):
		t.Fatal("the upload of the paused sandbox stored no chunk")
	}
	if in := infoOf(a, sb.ID); in.Stored != host.StoredUploading {
		t.Errorf("paused, upload under way: stored %q", in.Stored)
	}
	if _, err := a.Resume(ctxT(t), sb.ID); err != nil {
		t.Fatalf("resume while the upload runs: %v", err)
	}
	close(gate)
	checkMemState(t, "resumed while its upload ran", a, sb.ID, sum, keeper, secret)
	testkit.WaitForf(t, time.Minute, func() string { return "no paused capture left in the store or its records" }, noPausedState)

	// The store down: the pause works, says why it is not durable, and
	// the sandbox resumes locally.
	s3.Stop()
	if _, err := a.Pause(ctxT(t), sb.ID); err != nil {
		t.Fatalf("pause with the store down: %v", err)
	}
	testkit.WaitForf(t, time.Minute, func() string { return "an upload error on Info: " + infoOf(a, sb.ID).StoreError },
		func() bool { return infoOf(a, sb.ID).StoreError != "" })
	if in := infoOf(a, sb.ID); in.Stored != host.StoredUploading || in.StoreError != "the object store is unavailable" {
		t.Errorf("paused with the store down: stored %q, error %q", in.Stored, in.StoreError)
	}
	if _, err := a.Resume(ctxT(t), sb.ID); err != nil {
		t.Fatalf("resume with the store down: %v", err)
	}
	checkMemState(t, "resumed with the store down", a, sb.ID, sum, keeper, secret)

	// Paused again with the store down, the agent restarts, the store
	// comes back: durable.
	shOn(t, a, sb.ID, "echo again >> /root/p.txt")
	if _, err := a.Pause(ctxT(t), sb.ID); err != nil {
		t.Fatal(err)
	}
	testkit.WaitForf(t, time.Minute, func() string { return "an upload error on Info: " + infoOf(a, sb.ID).StoreError },
		func() bool { return infoOf(a, sb.ID).StoreError != "" })
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	s3.Restart()
	a = open()
	a.Recover(ctxT(t))
	t0 := time.Now()
	testkit.WaitForf(t, time.Minute, func() string { return "paused sandbox durable after a restart: " + infoOf(a, sb.ID).Stored },
		func() bool { return infoOf(a, sb.ID).Stored == host.StoredDurable })
	rec, _ := a.sync.PausedRecord(sb.ID, pauseIDOf(t, a, sb.ID))
	t.Logf("paused %d MiB sandbox durable %v after the agent's restart: %d chunks, %d uploaded (%d MiB), %d zero, %d shared",
		sb.MemoryMiB, time.Since(t0).Round(time.Millisecond), rec.Upload.ChunksTotal, rec.Upload.ChunksUploaded,
		rec.Upload.BytesUploaded>>20, rec.Upload.ZeroChunks, rec.Upload.ChunksShared)
	if in := infoOf(a, sb.ID); in.StoreError != "" {
		t.Errorf("durable paused sandbox keeps the error %q", in.StoreError)
	}
	m, err := cs.Manifest(ctxT(t), "paused/"+sb.ID)
	if err != nil {
		t.Fatal(err)
	}

	// (d) Killed: its capture leaves the store, and its chunks with it.
	if err := a.Kill(ctxT(t), sb.ID); err != nil {
		t.Fatal(err)
	}
	waitCollected(t, cs, objs, m)
	testkit.WaitForf(t, time.Minute, func() string { return "no paused capture left in the store or its records" }, noPausedState)
}
