package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/host"
	"github.com/pandastack/pandastack/internal/objstore/s3test"
	"github.com/pandastack/pandastack/internal/template"
)

// TestDirectTransfer: a transient capture goes from one host straight to
// another that holds the same template (SendSnapshot → ReceiveSnapshot),
// carrying about what the sandbox dirtied, never touching the object
// store; a sandbox created from it there has the parent's files and the
// state of its memory (a file in /dev/shm, a process holding a secret).
// A pack cut short is refused and leaves nothing, and a host without the
// template refuses the pack before writing anything.
func TestDirectTransfer(t *testing.T) {
	s3 := s3test.Start(t)
	openA, csA := storeHost(t, s3.Open("fleet"))
	openB, _ := storeHost(t, s3.Open("fleet"))
	a, b := openA(), openB()
	a.Recover(ctxT(t))
	b.Recover(ctxT(t))

	src, err := a.Create(ctxT(t), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Kill(context.Background(), src.ID) })
	key := src.Template
	// B takes A's bake of the template from the store (as hosts sharing a
	// store do): the same bytes, the base the pack is diffed against.
	waitFor(t, func() string { return "template " + key + " in the store" }, func() bool { return hasManifest(csA, templateName(key)) })
	tA, _ := a.templates.ByKey(key)
	waitFor(t, func() string { return "a chunk index of A's template " + key }, func() bool {
		return a.templates.HasChunkIndex(tA, csA.ChunkSize())
	})
	tB, err := b.templates.Get(ctxT(t), b.TemplateParams("", 0, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	if tB.BootID != tA.BootID {
		t.Fatalf("B's template %s is boot %s, A's %s: B baked its own", key, tB.BootID, tA.BootID)
	}

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
	st, err := a.SendSnapshot(ctxT(t), id, &pack)
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
		if _, err := os.Stat(b.snapshotDir(id) + fetchSuffix); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after a pack cut to %d bytes, B keeps its partial files: %v", n, err)
		}
	}

	// A host without the template refuses it before writing anything.
	_, openC := restartable(t)
	c := openC()
	if _, err := c.ReceiveSnapshot(ctxT(t), id, bytes.NewReader(pack.Bytes())); !errors.Is(err, template.ErrNotFound) {
		t.Errorf("host without the template: %v, want template.ErrNotFound", err)
	}
	if _, err := os.Stat(c.snapshotDir(id) + fetchSuffix); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the host without the template wrote files: %v", err)
	}

	// Streamed as a fork does it: A writes as B reads.
	pr, pw := io.Pipe()
	go func() {
		_, err := a.SendSnapshot(ctxT(t), id, pw)
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
	a.upMu.Lock()
	job := a.jobs[storeName(id)]
	a.upMu.Unlock()
	if job != nil || hasManifest(csA, storeName(id)) {
		t.Errorf("the capture sent directly is being uploaded (%v) or is in the store", job != nil)
	}
}
