package hostagent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/internal/storesync"
	"github.com/pandastack/pandastack/internal/storage/manifest"
	"github.com/pandastack/pandastack/internal/testing/s3test"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// TestTransientCapture: a transient capture (a cross-host fork's) is not
// sealed, becomes durable in the store (AwaitStored returns as soon as it
// is), restores on another host, and a restart of either host removes it,
// from the store too, while the sandbox made from it runs on.
func TestTransientCapture(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
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
	shOn(t, a, src.ID, "echo on-a > /root/f.txt")

	id := host.NewID()
	si, err := a.SnapshotTransient(ctxT(t), src.ID, id)
	if err != nil {
		t.Fatal(err)
	}
	if !si.Transient {
		t.Errorf("transient capture described with Transient false")
	}
	if _, err := manifest.Read(a.snapshotDir(id)); !errors.Is(err, manifest.ErrNoManifest) {
		t.Errorf("transient capture: manifest.Read = %v, want ErrNoManifest (not sealed)", err)
	}
	t0 := time.Now()
	got, err := a.AwaitStored(ctxT(t), id, time.Minute)
	if err != nil || got.Stored != host.StoredDurable {
		t.Fatalf("AwaitStored = %q (%q), %v; want durable", got.Stored, got.StoreError, err)
	}
	t.Logf("durable %v after the capture", time.Since(t0).Round(time.Millisecond))
	if _, err := a.AwaitStored(ctxT(t), "nosuchsnapshot", time.Second); !errors.Is(err, ErrNotFound) {
		t.Errorf("AwaitStored of no snapshot: %v, want ErrNotFound", err)
	}

	child, err := createFrom(t, b, id)
	if err != nil {
		t.Fatalf("create on B from A's transient capture: %v", err)
	}
	if got := shOn(t, b, child.ID, "cat /root/f.txt"); got != "on-a\n" {
		t.Errorf("child on B reads %q, want %q", got, "on-a\n")
	}
	if si, err := b.GetSnapshot(id); err != nil || !si.Transient {
		t.Errorf("B's copy of the capture: %+v, %v; want one marked transient", si, err)
	}

	// A restart of each host (a crash: nothing deleted it) removes it.
	a.Detach()
	b.Detach()
	a, b = openA(), openB()
	a.Recover(ctxT(t))
	b.Recover(ctxT(t))
	for name, h := range map[string]*Agent{"A": a, "B": b} {
		if _, err := h.GetSnapshot(id); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s after a restart: GetSnapshot = %v, want ErrNotFound", name, err)
		}
		if _, err := os.Stat(h.snapshotDir(id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after a restart: the capture's directory is still there (%v)", name, err)
		}
	}
	testkit.WaitForf(t, time.Minute, func() string { return "the capture's set gone from the store" }, func() bool { return !hasManifest(csA, storesync.SnapshotSet(id)) })
	testkit.WaitForf(t, time.Minute, func() string { return "the capture's store records gone" }, func() bool {
		_, errA := os.Stat(a.sync.RecordPath(id))
		_, errB := os.Stat(b.sync.RecordPath(id))
		return errors.Is(errA, os.ErrNotExist) && errors.Is(errB, os.ErrNotExist)
	})
	if got := shOn(t, b, child.ID, "cat /root/f.txt"); got != "on-a\n" {
		t.Errorf("child on B after the restarts reads %q, want %q", got, "on-a\n")
	}
	if left, _ := filepath.Glob(filepath.Join(a.vol.Dir, "snapshots", "*")); len(left) > 0 {
		t.Errorf("A's snapshots directory holds %v after the restart", left)
	}
}
