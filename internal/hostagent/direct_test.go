package hostagent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/internal/storesync"
	"github.com/pandastack/pandastack/internal/hostagent/template"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/testing/s3test"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// sharingHosts starts two hosts sharing an object store (A's chunk store
// csA) and a sandbox src on A; B holds A's bake of its template, taken
// from the store as hosts sharing a store do: the same bytes, the base a
// pack is diffed against.
func sharingHosts(t *testing.T) (a, b *Agent, csA *chunkstore.Store, src Info) {
	t.Helper()
	s3 := s3test.Start(t)
	openA, csA := storeHost(t, s3.Open("fleet"))
	openB, _ := storeHost(t, s3.Open("fleet"))
	a, src = sourceSandbox(t, openA)
	b = openB()
	b.Recover(ctxT(t))
	key := src.Template
	testkit.WaitForf(t, time.Minute, func() string { return "template " + key + " in the store" }, func() bool { return hasManifest(csA, storesync.TemplateSet(key)) })
	tA, _ := a.templates.ByKey(key)
	testkit.WaitForf(t, time.Minute, func() string { return "a chunk index of A's template " + key }, func() bool {
		return a.templates.HasChunkIndex(tA, csA.ChunkSize())
	})
	tB, err := b.templates.Get(ctxT(t), b.TemplateParams("", 0, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	if tB.BootID != tA.BootID {
		t.Fatalf("B's template %s is boot %s, A's %s: B baked its own", key, tB.BootID, tA.BootID)
	}
	return a, b, csA, src
}

// TestDirectTransfer: a transient capture goes from one host straight to
// another that holds the same template (SendSnapshot → ReceiveSnapshot),
// carrying about what the sandbox dirtied, never touching the object
// store; a sandbox created from it there has the parent's files and the
// state of its memory (a file in /dev/shm, a process holding a secret).
// A pack cut short is refused and leaves nothing, and a host without the
// template refuses the pack before writing anything.
func TestDirectTransfer(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	a, b, csA, src := sharingHosts(t)
	shOn(t, a, src.ID, "echo on-a > /root/f.txt")
	sum, keeper, secret := memState(t, a, src.ID)
	id := host.NewID()
	si, err := a.SnapshotTransient(ctxT(t), src.ID, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.DeleteSnapshot(id); b.DeleteSnapshot(id) })

	var pack bytes.Buffer
	t0 := time.Now()
	st, err := a.SendSnapshot(ctxT(t), id, nil, &pack)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pack of %.1f MiB in %v for %.1f MiB dirty (capture %.1f MiB): %+v", mib(st.Bytes), time.Since(t0).Round(time.Millisecond),
		mib(si.Capture.DirtyBytes), mib(si.SizeBytes), st)
	// Only what differs from the template: at least the 4 MiB of random
	// bytes in /dev/shm, at most the dirty pages and a few MiB of disk
	// blocks and device state; never the capture's template chunks.
	if st.Bytes < 4<<20 || st.Bytes > si.Capture.DirtyBytes+16<<20 || st.BaseChunks == 0 || st.PatchChunks == 0 {
		t.Errorf("pack of %d bytes (%d base chunks, %d patches) for %d dirty: want about the dirty pages, the template's chunks as references",
			st.Bytes, st.BaseChunks, st.PatchChunks, si.Capture.DirtyBytes)
	}

	// Cut short: refused, nothing kept.
	for _, n := range []int{100, pack.Len() / 2, pack.Len() - 1} {
		_, err := b.ReceiveSnapshot(ctxT(t), id, bytes.NewReader(pack.Bytes()[:n]))
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("pack cut to %d of %d bytes: %v, want ErrCorrupt", n, pack.Len(), err)
		}
		if _, err := b.GetSnapshot(id); !errors.Is(err, ErrNotFound) {
			t.Errorf("after a pack cut to %d bytes, B has the snapshot: %v", n, err)
		}
		if _, err := os.Stat(b.snapshotDir(id) + storesync.FetchSuffix); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after a pack cut to %d bytes, B keeps its partial files: %v", n, err)
		}
	}

	// A host without the template refuses it before writing anything.
	_, openC := restartable(t)
	c := openC()
	if _, err := c.ReceiveSnapshot(ctxT(t), id, bytes.NewReader(pack.Bytes())); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("host without the template: %v, want templates.ErrNotFound", err)
	}
	if _, err := os.Stat(c.snapshotDir(id) + storesync.FetchSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the host without the template wrote files: %v", err)
	}

	// Streamed as a fork does it: A writes as B reads.
	pr, pw := io.Pipe()
	go func() {
		_, err := a.SendSnapshot(ctxT(t), id, nil, pw)
		pw.CloseWithError(err)
	}()
	t0 = time.Now()
	got, err := b.ReceiveSnapshot(ctxT(t), id, pr)
	if err != nil {
		t.Fatalf("receive on B: %v", err)
	}
	t.Logf("sent and received in %v", time.Since(t0).Round(time.Millisecond))
	if got.FetchedBytes != st.Bytes || !got.Transient || got.SandboxID != src.ID {
		t.Errorf("B's snapshot %+v: want transient, of %s, %d bytes received", got, src.ID, st.Bytes)
	}
	child, err := createFrom(t, b, id)
	if err != nil {
		t.Fatalf("create on B from the received capture: %v", err)
	}
	if child.FetchedBytes != 0 {
		t.Errorf("create on B fetched %d bytes from the store, want 0", child.FetchedBytes)
	}
	if got := shOn(t, b, child.ID, "cat /root/f.txt"); got != "on-a\n" {
		t.Errorf("child on B reads %q, want %q", got, "on-a\n")
	}
	checkMemState(t, "child on B from the received capture", b, child.ID, sum, keeper, secret)

	// Nobody waited for the capture to be durable: it never went to the
	// store.
	job := a.sync.Job(storesync.SnapshotSet(id))
	if job != nil || hasManifest(csA, storesync.SnapshotSet(id)) {
		t.Errorf("the capture sent directly is being uploaded (%v) or is in the store", job != nil)
	}
}

// TestDirectTransferOtherBake: a host whose copy of the template is not
// the object store's (two hosts baked it at once, and this one's check
// after its upload came before the other's upload landed) refuses a pack
// from a host that holds the store's copy, then adopts the store's copy:
// the next pack comes in. B bakes its own copy before it has a store,
// and is not recovered with one (Recover would adopt the store's copy at
// once), which leaves it as that race does.
func TestDirectTransferOtherBake(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	a, src, b, _ := otherBakes(t)
	tA, _ := a.templates.ByKey(src.Template)
	// A pack from B, made against B's bake, which the store does not
	// hold: A keeps the store's copy and refuses it.
	onB, err := b.Create(ctxT(t), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Kill(context.Background(), onB.ID) })
	idB, packB := capturePack(t, b, a, onB.ID)
	if _, err := a.ReceiveSnapshot(ctxT(t), idB, bytes.NewReader(packB)); !errors.Is(err, templates.ErrNotFound) {
		t.Fatalf("pack made against a bake the store does not hold: %v, want templates.ErrNotFound", err)
	}
	if got, _ := a.templates.ByKey(src.Template); got == nil || got.BootID != tA.BootID {
		t.Errorf("A's copy after refusing B's pack: boot %q, want A's own bake %s, the store's", bootOf(got), tA.BootID)
	}
	// A pack from A, made against the store's copy: B adopts that copy
	// while the pack waits, and takes it.
	shOn(t, a, src.ID, "echo from-a > /root/f.txt")
	id, pack := capturePack(t, a, b, src.ID)
	packComesIn(t, b, id, pack, src.Template, tA.BootID, "from-a\n")
}

// TestDirectTransferFetchesTemplate: a host sent a pack of a capture whose
// template it lacks fetches that template from the store (never bakes
// it) while the pack waits, and takes the pack; a host whose store lacks
// the template refuses it at once.
func TestDirectTransferFetchesTemplate(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	s3 := s3test.Start(t)
	openA, csA := storeHost(t, s3.Open("fleet"))
	a, src := sourceSandbox(t, openA)
	tA, _ := a.templates.ByKey(src.Template)
	testkit.WaitForf(t, time.Minute, func() string { return "A's template in the store" }, func() bool {
		m, err := csA.Manifest(ctxT(t), storesync.TemplateSet(src.Template))
		return err == nil && m != nil
	})
	shOn(t, a, src.ID, "echo from-a > /root/f.txt")

	// Another fleet's host: its store has no such template.
	openC, _ := storeHost(t, s3.Open("elsewhere"))
	c := openC()
	c.Recover(ctxT(t))
	idC, packC := capturePack(t, a, c, src.ID)
	if _, err := c.ReceiveSnapshot(ctxT(t), idC, bytes.NewReader(packC)); !errors.Is(err, templates.ErrNotFound) {
		t.Fatalf("pack to a host whose store lacks its template: %v, want templates.ErrNotFound", err)
	}
	if _, ok := c.templates.ByKey(src.Template); ok {
		t.Errorf("a host whose store lacks %s holds it after refusing the pack (baked it?)", src.Template)
	}

	openB, _ := storeHost(t, s3.Open("fleet"))
	b := openB()
	b.Recover(ctxT(t))
	if _, ok := b.templates.ByKey(src.Template); ok {
		t.Fatalf("B holds %s before any pack", src.Template)
	}
	id, pack := capturePack(t, a, b, src.ID)
	packComesIn(t, b, id, pack, src.Template, tA.BootID, "from-a\n")
}

// packComesIn has b receive pack, of capture id of a sandbox made from
// the bake wantBoot of template key, and checks that b then holds that
// bake and that a child made there from the capture reads want in
// /root/f.txt.
func packComesIn(t *testing.T, b *Agent, id string, pack []byte, key, wantBoot, want string) {
	t.Helper()
	if _, err := b.ReceiveSnapshot(ctxT(t), id, bytes.NewReader(pack)); err != nil {
		t.Fatalf("receive the pack: %v", err)
	}
	if tB, ok := b.templates.ByKey(key); !ok || tB.BootID != wantBoot {
		t.Errorf("the host's copy of %s after the pack: boot %q, want the sender's %s", key, bootOf(tB), wantBoot)
	}
	child, err := createFrom(t, b, id)
	if err != nil {
		t.Fatal(err)
	}
	if got := shOn(t, b, child.ID, "cat /root/f.txt"); got != want {
		t.Errorf("child reads %q, want %q", got, want)
	}
}

// TestDirectTransferFromARestore: a host that restored a snapshot from the
// store without holding its template fetches the template, and a pack of
// a capture of that sandbox is diffed against it (only what the sandbox
// changed goes, not its whole memory image).
func TestDirectTransferFromARestore(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	s3 := s3test.Start(t)
	openA, _ := storeHost(t, s3.Open("fleet"))
	a, src := sourceSandbox(t, openA)
	tA, _ := a.templates.ByKey(src.Template)
	shOn(t, a, src.ID, "echo from-a > /root/f.txt")
	snap := durableSnapOn(t, a, src.ID)

	openB, _ := storeHost(t, s3.Open("fleet"))
	b := openB()
	b.Recover(ctxT(t))
	onB, err := createFrom(t, b, snap.ID)
	if err != nil {
		t.Fatalf("create on B, which lacks the template, from A's snapshot: %v", err)
	}
	t.Cleanup(func() { b.Kill(context.Background(), onB.ID) })
	shOn(t, b, onB.ID, "echo from-b >> /root/f.txt")
	id := host.NewID()
	if _, err := b.SnapshotTransient(ctxT(t), onB.ID, id); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.DeleteSnapshot(id); b.DeleteSnapshot(id) })
	var pack bytes.Buffer
	st, err := b.SendSnapshot(ctxT(t), id, nil, &pack)
	if err != nil {
		t.Fatal(err)
	}
	if tB, ok := b.templates.ByKey(src.Template); !ok || tB.BootID != tA.BootID {
		t.Errorf("B's copy of %s after restoring A's snapshot and sending a capture: boot %q, want A's %s, fetched", src.Template, bootOf(tB), tA.BootID)
	}
	if st.BaseChunks == 0 {
		t.Errorf("B's pack: %+v; want it diffed against the template (chunks sent as the template's)", st)
	}
	t.Logf("B's pack of its capture: %d bytes, %d chunks as the template's, %d patched, %d whole", st.Bytes, st.BaseChunks, st.PatchChunks, st.WholeChunks)
	packComesIn(t, a, id, pack.Bytes(), src.Template, tA.BootID, "from-a\nfrom-b\n")
}

// TestTemplateUploadedAtOnce: two hosts that baked a template at once
// both found none in the store and upload their own; the first upload
// to land is the fleet's copy, and the other host adopts it instead of
// replacing it (its manifest is put only where there is none).
func TestTemplateUploadedAtOnce(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	a, src, b, csB := otherBakes(t)
	tA, _ := a.templates.ByKey(src.Template)
	tB, _ := b.templates.ByKey(src.Template)
	// B checked the store before A's upload landed: it uploads its own.
	if err := b.sync.UploadTemplate(ctxT(t), tB, true); err != nil {
		t.Fatalf("B's upload of its own bake: %v", err)
	}
	m, err := csB.Manifest(ctxT(t), storesync.TemplateSet(src.Template))
	var meta templates.Meta
	if err != nil || json.Unmarshal(m.Meta, &meta) != nil || meta.BootID != tA.BootID {
		t.Errorf("the store's copy after B's upload: boot %q (%v), want A's %s, the first to land", meta.BootID, err, tA.BootID)
	}
	if got, ok := b.templates.ByKey(src.Template); !ok {
		t.Errorf("B has no copy of %s after its upload lost, want A's bake", src.Template)
	} else if got.BootID != tA.BootID {
		t.Errorf("B's copy after its upload lost: boot %s, want A's bake %s", got.BootID, tA.BootID)
	}
}

// bootOf is t's boot id; "" for none.
func bootOf(t *template.Template) string {
	if t == nil {
		return ""
	}
	return t.BootID
}

// otherBakes returns two agents sharing a real S3 server that hold
// different bakes of one template: a, which baked it with the store and
// uploaded it (with a sandbox src made from it), and b, which baked its
// own before it had a store (not recovered since: it has not looked at
// the store's copy yet), with b's chunkstore.
func otherBakes(t *testing.T) (a *Agent, src Info, b *Agent, csB *chunkstore.Store) {
	t.Helper()
	s3 := s3test.Start(t)
	withStore := false
	csB, err := chunkstore.New(s3.Open("fleet"), chunkstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, openB := restartableWith(t, func(c *Config) {
		if withStore {
			c.Store, c.StoreRetry = csB, 100*time.Millisecond
		}
	})
	b = openB()
	b.Recover(ctxT(t))
	own, err := b.templates.Get(ctxT(t), b.TemplateParams("", 0, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()

	openA, csA := storeHost(t, s3.Open("fleet"))
	a, src = sourceSandbox(t, openA)
	tA, _ := a.templates.ByKey(src.Template)
	testkit.WaitForf(t, time.Minute, func() string { return "A's template in the store" }, func() bool {
		m, err := csA.Manifest(ctxT(t), storesync.TemplateSet(src.Template))
		var meta templates.Meta
		return err == nil && json.Unmarshal(m.Meta, &meta) == nil && meta.BootID == tA.BootID
	})
	withStore = true
	b = openB()
	if tB, _ := b.templates.ByKey(src.Template); tB == nil || tB.BootID != own.BootID || tB.BootID == tA.BootID {
		t.Fatalf("B's copy of %s: %+v, want its own bake %s (A's: %s)", src.Template, tB, own.BootID, tA.BootID)
	}
	return a, src, b, csB
}

// capturePack takes a transient capture of sandbox srcID on a, deleted
// from a and b when the test ends, and returns its id and its pack.
func capturePack(t *testing.T, a, b *Agent, srcID string) (string, []byte) {
	t.Helper()
	id := host.NewID()
	if _, err := a.SnapshotTransient(ctxT(t), srcID, id); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.DeleteSnapshot(id); b.DeleteSnapshot(id) })
	var pack bytes.Buffer
	if _, err := a.SendSnapshot(ctxT(t), id, nil, &pack); err != nil {
		t.Fatal(err)
	}
	return id, pack.Bytes()
}

// TestReceiveAndCreate: a host makes a sandbox from a pack as it arrives
// (a cross-host fork's first child): the child's VMM runs before the
// pack's memory image has come, and once it has the child has the
// parent's files and memory state. A pack cut short in the memory image
// kills that VMM, keeps nothing and leaves no sandbox; a create that
// fails on its own keeps the received snapshot.
func TestReceiveAndCreate(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	a, b, _, src := sharingHosts(t)
	shOn(t, a, src.ID, "echo on-a > /root/f.txt")
	sum, keeper, secret := memState(t, a, src.ID)
	capture := func() (string, []byte) { return capturePack(t, a, b, src.ID) }

	// Cut short in the memory image, after the VMM started.
	id, pack := capture()
	memAt := packFileOffset(t, pack, memFile)
	req := CreateRequest{ID: host.NewID(), SnapshotID: id}
	pid, _, si, err := receiveGated(t, b, req, pack[:memAt+(len(pack)-memAt)/2], memAt)
	if !errors.Is(err, ErrCorrupt) || si.ID != "" {
		t.Errorf("pack cut in the memory image: %v, kept %q; want ErrCorrupt, nothing kept", err, si.ID)
	}
	if _, err := b.Get(req.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("the child of a pack cut short remains: %v", err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the VMM (pid %d) of the child of a pack cut short still runs: %v", pid, err)
	}
	if _, err := b.GetSnapshot(id); !errors.Is(err, ErrNotFound) {
		t.Errorf("B keeps the snapshot of a pack cut short: %v", err)
	}
	if _, err := os.Stat(b.snapshotDir(id) + storesync.FetchSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("B keeps the partial files of a pack cut short: %v", err)
	}

	// Whole: the VMM starts before the memory arrives, then the child
	// runs on it.
	req.ID = host.NewID()
	_, child, si, err := receiveGated(t, b, req, pack, memAt)
	if err != nil {
		t.Fatalf("receive and create on B: %v", err)
	}
	t.Cleanup(func() { b.Kill(context.Background(), child.ID) })
	if si.ID != id || si.FetchedBytes != int64(len(pack)) || child.ID != req.ID || child.State != StateRunning {
		t.Errorf("got snapshot %s of %d bytes, child %s %s; want %s of %d bytes, %s running", si.ID, si.FetchedBytes, child.ID, child.State,
			id, len(pack), req.ID)
	}
	if got := shOn(t, b, child.ID, "cat /root/f.txt"); got != "on-a\n" {
		t.Errorf("child on B reads %q, want %q", got, "on-a\n")
	}
	checkMemState(t, "child made as its pack arrived", b, child.ID, sum, keeper, secret)
	// The snapshot is B's as a received one: another child from it.
	if _, err := createFrom(t, b, id); err != nil {
		t.Errorf("a second child from the received snapshot: %v", err)
	}

	// A create that fails on its own (a bad network policy) keeps the
	// snapshot it received.
	id2, pack2 := capture()
	bad := CreateRequest{ID: host.NewID(), SnapshotID: id2, Network: netpolicy.Policy{AllowOut: []string{"not an address"}}}
	_, si, err = b.ReceiveAndCreate(ctxT(t), bad, bytes.NewReader(pack2))
	if !errors.Is(err, ErrInvalid) || si.ID != id2 {
		t.Errorf("create with a bad policy: %v, kept %q; want ErrInvalid, %s kept", err, si.ID, id2)
	}
	if _, err := b.GetSnapshot(id2); err != nil {
		t.Errorf("the snapshot received for a create that failed: %v", err)
	}
	if _, err := b.Get(bad.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("the create that failed left its sandbox: %v", err)
	}
}

// packFileOffset is the offset in pack of the first record of file name.
func packFileOffset(t *testing.T, pack []byte, name string) int {
	t.Helper()
	h, err := chunkstore.ReadPackHeader(bufio.NewReader(bytes.NewReader(pack)))
	if err != nil {
		t.Fatal(err)
	}
	fi := slices.IndexFunc(h.Files, func(f chunkstore.PackFile) bool { return f.Name == name })
	off := 12 + int(binary.LittleEndian.Uint32(pack[8:])) + 4 // the header
	for off+10 <= len(pack) {
		if int(pack[off+1]) >= fi && pack[off] != 'E' {
			return off
		}
		off += 10 + int(binary.LittleEndian.Uint32(pack[off+6:])) + 4
	}
	t.Fatalf("no record of %s (file %d) in the pack", name, fi)
	return 0
}

// receiveGated runs b.ReceiveAndCreate(req) on pack, holding the bytes
// from gate on until the sandbox's VMM runs, whose PID it returns.
func receiveGated(t *testing.T, b *Agent, req CreateRequest, pack []byte, gate int) (int, Info, SnapshotInfo, error) {
	t.Helper()
	release := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(release) }) }
	t.Cleanup(open)
	type result struct {
		in  Info
		si  SnapshotInfo
		err error
	}
	done := make(chan result, 1)
	go func() {
		r := io.MultiReader(bytes.NewReader(pack[:gate]), &afterReader{wait: release, r: bytes.NewReader(pack[gate:])})
		in, si, err := b.ReceiveAndCreate(ctxT(t), req, r)
		done <- result{in, si, err}
	}()
	pid := 0
	testkit.WaitForf(t, time.Minute, func() string { return "the VMM of " + req.ID + " before its memory image arrives" }, func() bool {
		in, err := b.Get(req.ID)
		pid = in.PID
		return err == nil && in.PID != 0
	})
	open()
	r := <-done
	return pid, r.in, r.si, r.err
}

// afterReader reads r once wait is closed.
type afterReader struct {
	wait <-chan struct{}
	r    io.Reader
}

func (ar *afterReader) Read(p []byte) (int, error) {
	<-ar.wait
	return ar.r.Read(p)
}

// TestDirectTransferFromSnapshot: a capture of a sandbox created from a
// snapshot S (an environment: 48 MiB on its disk, 32 MiB in its memory)
// is diffed against S when the receiving host says it holds S: the pack
// carries what the sandbox changed since S, not S's own data again, and
// the child made from it has both. A host that does not hold S refuses
// that pack before writing anything; without held the pack is diffed
// against the template, as before. Fork children and children made on
// another host keep S as their lineage, and a snapshot of the sandbox
// restored from the store on a host holding S takes S's chunks from
// there.
func TestDirectTransferFromSnapshot(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	a, b, _, src := sharingHosts(t)
	shOn(t, a, src.ID, "head -c 50331648 /dev/urandom > /root/env.bin && head -c 33554432 /dev/urandom > /dev/shm/env && sync")
	envSums := shOn(t, a, src.ID, "md5sum /root/env.bin /dev/shm/env")
	snap := durableSnapOn(t, a, src.ID)
	// B holds S once it made a sandbox from it.
	onB, err := createFrom(t, b, snap.ID)
	if err != nil {
		t.Fatal(err)
	}
	b.Kill(ctxT(t), onB.ID)
	held := b.HeldSnapshots()
	if !slices.Contains(held, snap.ID) {
		t.Fatalf("B holds snapshots %v, want %s among them", held, snap.ID)
	}

	x, err := createFrom(t, a, snap.ID)
	if err != nil {
		t.Fatal(err)
	}
	shOn(t, a, x.ID, "echo since-s > /root/x.txt && head -c 1048576 /dev/urandom > /dev/shm/x")
	xSum := shOn(t, a, x.ID, "md5sum /dev/shm/x")
	id := host.NewID()
	if _, err := a.SnapshotTransient(ctxT(t), x.ID, id); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.DeleteSnapshot(id); b.DeleteSnapshot(id) })
	send := func(held []string) ([]byte, chunkstore.PackStats) {
		var pack bytes.Buffer
		st, err := a.SendSnapshot(ctxT(t), id, held, &pack)
		if err != nil {
			t.Fatal(err)
		}
		return pack.Bytes(), st
	}
	_, stT := send(nil)
	pack, stS := send(held)
	t.Logf("pack against the template: %.1f MiB (%+v); against S: %.1f MiB (%+v)", mib(stT.Bytes), stT, mib(stS.Bytes), stS)
	if stT.Bytes < 80<<20 {
		t.Errorf("pack against the template: %d bytes, want at least S's 80 MiB of data", stT.Bytes)
	}
	if stS.Bytes > 16<<20 || stS.BaseChunks == 0 {
		t.Errorf("pack against S: %d bytes, %d chunks as S's; want what changed since S (~1 MiB and some pages), S's chunks as references", stS.Bytes, stS.BaseChunks)
	}
	h, err := chunkstore.ReadPackHeader(bufio.NewReader(bytes.NewReader(pack)))
	if err != nil || h.BaseName != storesync.SnapshotSet(snap.ID) {
		t.Errorf("the pack's base %q (%v), want %s", h.BaseName, err, storesync.SnapshotSet(snap.ID))
	}

	// A host that does not hold S refuses it before writing anything.
	_, openC := restartable(t)
	c := openC()
	if _, err := c.ReceiveSnapshot(ctxT(t), id, bytes.NewReader(pack)); !errors.Is(err, templates.ErrNotFound) {
		t.Errorf("host without S: %v, want templates.ErrNotFound", err)
	}
	if _, err := os.Stat(c.snapshotDir(id) + storesync.FetchSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the host without S wrote files: %v", err)
	}

	// B takes it, and the child has S's data and what changed since.
	si, err := b.ReceiveSnapshot(ctxT(t), id, bytes.NewReader(pack))
	if err != nil {
		t.Fatalf("receive on B: %v", err)
	}
	if si.FetchedBytes != stS.Bytes {
		t.Errorf("B received %d bytes, A sent %d", si.FetchedBytes, stS.Bytes)
	}
	child, err := createFrom(t, b, id)
	if err != nil {
		t.Fatal(err)
	}
	if got := shOn(t, b, child.ID, "md5sum /root/env.bin /dev/shm/env"); got != envSums {
		t.Errorf("child on B: S's data %q, want %q", got, envSums)
	}
	if got := shOn(t, b, child.ID, "cat /root/x.txt; md5sum /dev/shm/x"); got != "since-s\n"+xSum {
		t.Errorf("child on B: what changed since S %q, want %q", got, "since-s\n"+xSum)
	}

	// Children keep the lineage: a fork child of x on A, and the child
	// on B (made from a transient capture), are sent diffed against S.
	yID := host.NewID()
	if _, err := a.Fork(ctxT(t), x.ID, []string{yID}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Kill(context.Background(), yID) })
	for _, tc := range []struct {
		what     string
		from, to *Agent
		sb       string
	}{{"a fork child of x", a, b, yID}, {"the child on B", b, a, child.ID}} {
		cid := host.NewID()
		if _, err := tc.from.SnapshotTransient(ctxT(t), tc.sb, cid); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tc.from.DeleteSnapshot(cid) })
		var p bytes.Buffer
		st, err := tc.from.SendSnapshot(ctxT(t), cid, tc.to.HeldSnapshots(), &p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Bytes > 16<<20 {
			t.Errorf("pack of %s: %.1f MiB, want it diffed against S (a few MiB)", tc.what, mib(st.Bytes))
		}
	}

	// Through the store too: a snapshot of x, restored on B, takes S's
	// chunks from B's copy of S rather than the store.
	s2 := durableSnapOn(t, a, x.ID)
	fromS2, err := createFrom(t, b, s2.ID)
	if err != nil {
		t.Fatal(err)
	}
	// (Whole chunks: any it changed, unlike a pack's pages; 139 MiB
	// without S's chunks, S's 80 MiB of data among them.)
	t.Logf("B fetched %.1f MiB from the store to restore a snapshot of x", mib(fromS2.FetchedBytes))
	if fromS2.FetchedBytes > 48<<20 {
		t.Errorf("B fetched %.1f MiB from the store to restore a snapshot of x, want the chunks x changed since S, not S's 80 MiB of data", mib(fromS2.FetchedBytes))
	}
	if got := shOn(t, b, fromS2.ID, "md5sum /root/env.bin /dev/shm/env"); got != envSums {
		t.Errorf("sandbox on B from a snapshot of x: S's data %q, want %q", got, envSums)
	}
}
