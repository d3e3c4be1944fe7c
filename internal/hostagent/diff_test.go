package hostagent

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/internal/storesync"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/objstore"
	"github.com/pandastack/pandastack/internal/testing/s3test"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// notIn sums the bytes of m's chunks whose hash the set base does not
// hold: every occurrence (what a download seeded by base fetches) and
// each distinct chunk once (what an upload after base's sends).
func notIn(m, base *chunkstore.Manifest) (occurrences, distinct int64) {
	have := map[string]bool{}
	for _, f := range base.Files {
		for _, h := range f.Chunks {
			have[h] = true
		}
	}
	seen := map[string]bool{}
	for _, f := range m.Files {
		for i, h := range f.Chunks {
			if h == "" || have[h] {
				continue
			}
			n := min(m.ChunkSize, f.Size-int64(i)*m.ChunkSize)
			occurrences += n
			if !seen[h] {
				distinct += n
				seen[h] = true
			}
		}
	}
	return occurrences, distinct
}

// wantFetched is what a download of m fetches when the chunks whose
// hashes are in have are local: each other chunk whole, or for a delta its
// patch and (unless local) its base.
func wantFetched(t *testing.T, objs objstore.Store, m *chunkstore.Manifest, have map[string]bool) int64 {
	t.Helper()
	var n int64
	for _, f := range m.Files {
		for i, h := range f.Chunks {
			size := min(m.ChunkSize, f.Size-int64(i)*m.ChunkSize)
			d, delta := f.Deltas[i]
			switch {
			case h == "" || have[h]:
			case delta:
				in, err := objs.Stat(ctxT(t), "chunks/"+d.Patch)
				if err != nil {
					t.Fatal(err)
				}
				n += in.Size
				if d.Base != "" && !have[d.Base] {
					n += size
				}
			default:
				n += size
			}
		}
	}
	return n
}

func hashesOf(m *chunkstore.Manifest) map[string]bool {
	out := map[string]bool{}
	for _, f := range m.Files {
		for _, h := range f.Chunks {
			out[h] = true
		}
	}
	return out
}

// TestMovesOnlyTheDiff: hosts sharing an object store (a real S3 server)
// share their templates through it: A bakes and uploads the template, B
// fetches it instead of baking. A snapshot of a sandbox on A then uploads
// only what its template lacks (chunks that differ from the template's in
// a few pages as patches of those pages), and a create from it on B
// (which holds the template) fetches only that, taking the rest from its
// own copy of the template (reflinked); the same for a paused sandbox
// resumed on B. C, without the template, fetches the whole set and restores the
// same sandbox. A host that baked its own copy of the template adopts the
// store's when it starts. Memory-held state and files are checked each
// time.
func TestMovesOnlyTheDiff(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	s3 := s3test.Start(t)
	objs := s3.Open("fleet")
	openA, csA := storeHost(t, s3.Open("fleet"))
	openB, _ := storeHost(t, s3.Open("fleet"))
	openC, _ := storeHost(t, s3.Open("fleet"))
	a, b, c := openA(), openB(), openC()
	for _, h := range []*Agent{a, b, c} {
		h.Recover(ctxT(t))
	}

	src, err := a.Create(ctxT(t), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Kill(context.Background(), src.ID) })
	key := src.Template
	testkit.WaitForf(t, time.Minute, func() string { return "template " + key + " in the store" }, func() bool { return hasManifest(csA, storesync.TemplateSet(key)) })
	tmplSet, err := csA.Manifest(ctxT(t), storesync.TemplateSet(key))
	if err != nil {
		t.Fatal(err)
	}
	tA, ok := a.templates.ByKey(key)
	if !ok {
		t.Fatalf("A's template %s not found", key)
	}
	// The index is saved once the upload's manifest is written: just after.
	testkit.WaitForf(t, time.Minute, func() string { return "a chunk index of A's template " + key }, func() bool {
		return a.templates.HasChunkIndex(tA, csA.ChunkSize())
	})

	// B fetches the template rather than baking it: the same bytes.
	t0 := time.Now()
	tB, err := b.templates.Get(ctxT(t), b.TemplateParams("", 0, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("template %s fetched by B from the store in %v (%d MiB of chunks)", key, time.Since(t0).Round(time.Millisecond), storedBytes(tmplSet)>>20)
	if tB.BootID != tA.BootID {
		t.Fatalf("B's template %s is boot %s, A's %s: B baked its own", key, tB.BootID, tA.BootID)
	}
	if !b.templates.HasChunkIndex(tB, csA.ChunkSize()) {
		t.Errorf("B's fetched template has no chunk index")
	}

	shOn(t, a, src.ID, "echo on-a > /root/f.txt")
	sum, keeper, secret := memState(t, a, src.ID)

	// A snapshot on A: only what the template lacks is uploaded.
	snap := durableSnapOn(t, a, src.ID)
	snapSet, err := csA.Manifest(ctxT(t), storesync.SnapshotSet(snap.ID))
	if err != nil {
		t.Fatal(err)
	}
	occ, distinct := notIn(snapSet, tmplSet)
	si := stored(a, snap.ID)
	rec, _ := a.sync.Record(snap.ID)
	t.Logf("snapshot: %.1f MiB dirty, set of %d MiB of chunks, %.1f MiB in %d chunks not the template's; uploaded %.1f MiB (%d chunks whole, %d as patches)",
		mib(snap.Capture.DirtyBytes), storedBytes(snapSet)>>20, mib(occ), rec.Upload.ChunksUploaded+rec.Upload.ChunksDelta, mib(si.UploadedBytes),
		rec.Upload.ChunksUploaded, rec.Upload.ChunksDelta)
	if rec.Upload.ChunksUnread == 0 {
		t.Errorf("the snapshot's upload read every chunk, none found to be the template's own blocks: %+v", rec.Upload)
	}
	if si.UploadedBytes <= 0 || si.UploadedBytes >= distinct || rec.Upload.ChunksDelta == 0 {
		t.Errorf("snapshot upload sent %d bytes (%d patches), want less than the %d of the chunks the template lacks", si.UploadedBytes, rec.Upload.ChunksDelta, distinct)
	}
	if occ*2 > storedBytes(snapSet) {
		t.Errorf("%d of the snapshot's %d bytes of chunks are not its template's: the test's sandbox changed too much to show anything", occ, storedBytes(snapSet))
	}

	// B has the template: it fetches only the chunks the template lacks.
	t0 = time.Now()
	child, err := createFrom(t, b, snap.ID)
	if err != nil {
		t.Fatalf("create on B from A's snapshot: %v", err)
	}
	t.Logf("create on B from A's snapshot (lookup, seeded download, restore): %v, fetched %.1f MiB", time.Since(t0).Round(time.Millisecond), mib(child.FetchedBytes))
	if want := wantFetched(t, objs, snapSet, hashesOf(tmplSet)); child.FetchedBytes != want || want >= occ {
		t.Errorf("create on B fetched %d bytes, want %d (patches and the chunks its template lacks; less than %d)", child.FetchedBytes, want, occ)
	}
	if si := stored(b, snap.ID); si.FetchedBytes != child.FetchedBytes {
		t.Errorf("B's snapshot says it fetched %d bytes, the create %d", si.FetchedBytes, child.FetchedBytes)
	}
	if r, _ := b.sync.Record(snap.ID); r.Fetch == nil || r.Fetch.ChunksCloned == 0 {
		t.Errorf("B's download reflinked no chunk from its template: %+v", r.Fetch)
	}
	if got := shOn(t, b, child.ID, "cat /root/f.txt"); got != "on-a\n" {
		t.Errorf("sandbox on B from A's snapshot: f.txt %q", got)
	}
	checkMemState(t, "sandbox on B from A's snapshot", b, child.ID, sum, keeper, secret)
	// A second create on B needs nothing from the store.
	again, err := createFrom(t, b, snap.ID)
	if err != nil {
		t.Fatal(err)
	}
	if again.FetchedBytes != 0 {
		t.Errorf("second create on B fetched %d bytes, want 0", again.FetchedBytes)
	}
	b.Kill(ctxT(t), again.ID)

	// C lacks the template: it fetches the whole set, and gets the same
	// sandbox.
	cChild, err := createFrom(t, c, snap.ID)
	if err != nil {
		t.Fatalf("create on C (no template) from A's snapshot: %v", err)
	}
	if want := wantFetched(t, objs, snapSet, nil); cChild.FetchedBytes != want {
		t.Errorf("create on C fetched %d bytes, want %d (all of it)", cChild.FetchedBytes, want)
	}
	t.Logf("create on C (no template) fetched %.1f MiB", mib(cChild.FetchedBytes))
	checkMemState(t, "sandbox on C from A's snapshot", c, cChild.ID, sum, keeper, secret)
	c.Kill(ctxT(t), cChild.ID)
	// The create needed no template (it fetched all of the set); C then
	// fetches the template in the background, for its own captures of
	// the sandbox to be diffed against it.
	testkit.WaitForf(t, time.Minute, func() string { return "C fetching template " + key }, func() bool {
		_, ok := c.templates.ByKey(key)
		return ok
	})

	// Paused on A, resumed on B: the same.
	shOn(t, a, src.ID, "echo paused-on-a >> /root/f.txt")
	if _, err := a.Pause(ctxT(t), src.ID); err != nil {
		t.Fatal(err)
	}
	testkit.WaitForf(t, time.Minute, func() string { return "paused sandbox durable: " + infoOf(a, src.ID).Stored },
		func() bool { return infoOf(a, src.ID).Stored == host.StoredDurable })
	pausedSet, err := csA.Manifest(ctxT(t), storesync.PausedSet(src.ID))
	if err != nil {
		t.Fatal(err)
	}
	pOcc, _ := notIn(pausedSet, tmplSet)
	up := infoOf(a, src.ID).UploadedBytes
	t.Logf("paused: set of %d MiB of chunks, %.1f MiB not in the template; uploaded %.1f MiB (the snapshot's chunks and patches were there)",
		storedBytes(pausedSet)>>20, mib(pOcc), mib(up))
	if up <= 0 || up >= pOcc {
		t.Errorf("pause upload sent %d bytes, want less than the %d its template lacks", up, pOcc)
	}
	wantResume := wantFetched(t, objs, pausedSet, hashesOf(tmplSet)) // before the resume deletes the set
	t0 = time.Now()
	in, err := b.Resume(ctxT(t), src.ID)
	if err != nil {
		t.Fatalf("resume on B: %v", err)
	}
	t.Cleanup(func() { b.Kill(context.Background(), src.ID) })
	t.Logf("resume on B of the sandbox paused on A: %v, fetched %.1f MiB", time.Since(t0).Round(time.Millisecond), mib(in.FetchedBytes))
	if in.FetchedBytes != wantResume {
		t.Errorf("resume on B fetched %d bytes, want %d", in.FetchedBytes, wantResume)
	}
	if got := shOn(t, b, src.ID, "cat /root/f.txt"); got != "on-a\npaused-on-a\n" {
		t.Errorf("resumed on B: f.txt %q", got)
	}
	checkMemState(t, "resumed on B", b, src.ID, sum, keeper, secret)

	// D baked its own copy of the template, without the store; started
	// with the store, it adopts the store's copy.
	dirD, openD := restartable(t)
	d := openD()
	tD, err := d.templates.Get(ctxT(t), d.TemplateParams("", 0, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	if tD.BootID == tA.BootID {
		t.Fatal("two bakes of a template have the same boot id")
	}
	d.Close()
	csD, err := chunkstore.New(s3.Open("fleet"), chunkstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	d = openSecondWith(t, dirD, func(c *Config) { c.Store = csD; c.StoreRetry = 100 * time.Millisecond })
	t.Cleanup(func() { d.Close() })
	d.Recover(ctxT(t))
	bootOf := func() string {
		t, ok := d.templates.ByKey(key)
		if !ok {
			return ""
		}
		return t.BootID
	}
	testkit.WaitForf(t, time.Minute, func() string { return "D adopts the store's template: boot " + bootOf() }, func() bool { return bootOf() == tA.BootID })
	if set, err := csA.Manifest(ctxT(t), storesync.TemplateSet(key)); err != nil || string(set.Meta) != string(tmplSet.Meta) {
		t.Errorf("the store's template changed when D started: %v", err)
	}
	// The adoption ends by removing the copy it replaced, just after the
	// new one became visible: it leaves nothing once done.
	left := func() []string {
		m, _ := filepath.Glob(filepath.Join(d.StoreDir(), "templates", ".*"))
		return m
	}
	testkit.WaitForf(t, time.Minute, func() string { return fmt.Sprintf("D's adoption to leave nothing; left %v", left()) }, func() bool { return len(left()) == 0 })
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }
