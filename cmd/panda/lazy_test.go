package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"github.com/pandastack/pandastack/internal/testing/s3test"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// TestUpLazyRestore: `panda up --store s3://... --lazy-restore` creates
// from a snapshot whose files the host lost (with 96 MiB of memory its
// template does not hold) by paging its memory in through the FUSE mount
// DATA_DIR/store/lazy: files and memory-held state
// are intact; the mount is there while panda runs and gone when it
// stopped (newDataDir reports any mount left under the data directory).
// The machine outlives panda: after a SIGKILL of panda, and after a
// shutdown with --on-shutdown keep, it runs on (the holder process keeps
// its memory served) and the next panda serves the pages it had never
// read.
func TestUpLazyRestore(t *testing.T) {
	e2e(t)
	s3 := s3test.Start(t)
	dataDir := newDataDir(t)
	opts := upOptions(dataDir, "", "--store", s3.URL("up"), "--lazy-restore", "--on-shutdown", "keep")
	opts.Env = []string{"AWS_ACCESS_KEY_ID=" + s3.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3.SecretKey}
	p := start(t, "up", opts)
	ctx := ctxFor(t)
	c := p.client(t)

	sb := mustCreate(t, ctx, c)
	writeFile(t, ctx, sb, "/root/d.txt", "lazy\n")
	// 96 MiB the template does not hold: lazy restore is chosen only
	// when that much (64 MiB by default) is to be fetched.
	sum := mustExec(t, ctx, sb, "head -c 100663296 /dev/urandom > /dev/shm/blob && md5sum /dev/shm/blob")
	s1, err := sb.Snapshot(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		s, err := c.GetSnapshot(ctx, s1.ID)
		if err == nil && s.Stored == "durable" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("snapshot not durable: %+v, %v", s, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := os.RemoveAll(filepath.Join(dataDir, "store", "snapshots", s1.ID)); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	c1, err := c.Create(ctx, pandastack.CreateOptions{SnapshotID: s1.ID, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("lazy create from a snapshot the host lost: %v", err)
	}
	// Only a little of the image is read now: the rest (the blob) is read
	// after panda crashed and came back.
	if got := mustExec(t, ctx, c1, "cat /root/d.txt"); got != "lazy\n" {
		t.Errorf("lazily restored: %q, want %q", got, "lazy\n")
	}
	t.Logf("lazy create from the store: first exec %v", time.Since(t0).Round(time.Millisecond))
	// The API tells what of its memory image the host read and fetched;
	// a sandbox restored from local files has no such figures.
	if err := c1.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if m := c1.Info.Memory; m == nil || m.Lazy == nil {
		t.Errorf("lazily restored sandbox's memory: %+v, want lazy figures", m)
	} else if l := m.Lazy; l.ImageMiB != float64(c1.Info.MemoryMiB) || l.FetchedMiB <= 0 || l.FetchedMiB > l.ImageMiB || l.ReadMiB <= 0 {
		t.Errorf("lazy figures %+v of a %d MiB sandbox: want the image's size, 0 < fetched ≤ image, read > 0", *l, c1.Info.MemoryMiB)
	} else {
		t.Logf("memory.lazy after the first exec: %+v (%.1f %% of the image fetched)", *l, 100*l.FetchedMiB/l.ImageMiB)
	}
	if err := sb.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if m := sb.Info.Memory; m == nil || m.Lazy != nil {
		t.Errorf("a sandbox created from its template: memory %+v, want figures without lazy ones", m)
	}
	lazy := filepath.Join(dataDir, "store", "lazy")
	if !testkit.Mounted(lazy) {
		t.Errorf("%s is not mounted", lazy)
	}
	if target, err := os.Readlink(filepath.Join(dataDir, "store", "snapshots", s1.ID, "vm.mem")); err != nil || !strings.HasPrefix(target, lazy+"/") {
		t.Errorf("the fetched snapshot's vm.mem: link to %q, %v; want a link into %s", target, err, lazy)
	}
	holders := pandatest.HolderPIDs(dataDir)
	if len(holders) != 1 {
		t.Fatalf("lazy restore's holder processes: %v, want one", holders)
	}
	if err := sb.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	// panda crashes: the lazily restored machine runs on, its memory
	// served by the holder process, which the next panda attaches to.
	pid := vmmPID(t, dataDir, c1.ID)
	p.Kill()
	if !testkit.Alive(pid) || !testkit.Alive(holders[0]) || !testkit.Mounted(lazy) {
		t.Fatalf("after panda was SIGKILLed: VMM %d alive %v, holder %d alive %v, %s mounted %v; want all",
			pid, testkit.Alive(pid), holders[0], testkit.Alive(holders[0]), lazy, testkit.Mounted(lazy))
	}
	p2 := start(t, "up after the crash", opts)
	c = p2.client(t)
	if info := mustGet(t, ctx, c, c1.ID); info.State != pandastack.StateRunning {
		t.Fatalf("the lazily restored sandbox after panda crashed and restarted: %s (%s), want running", info.State, info.StopReason)
	}
	c1 = c.Sandbox(c1.ID)
	// The blob's pages were never read: they come through the holder from
	// the new panda.
	if got := mustExec(t, ctx, c1, "cat /root/d.txt; md5sum /dev/shm/blob"); got != "lazy\n"+sum {
		t.Errorf("after panda crashed and restarted: %q, want %q", got, "lazy\n"+sum)
	}
	if got := pandatest.HolderPIDs(dataDir); !slices.Equal(got, holders) {
		t.Errorf("holder processes after the restart: %v, want the first %v", got, holders)
	}
	// A shutdown that keeps sandboxes running leaves it running too (no
	// pause needed any more), and the next start adopts it.
	mustStop(t, p2)
	if !testkit.Alive(pid) {
		t.Errorf("the lazily restored sandbox's VMM %d stopped at a shutdown with --on-shutdown keep; want it running", pid)
	}
	again := opts
	again.Args = slices.DeleteFunc(slices.Clone(opts.Args), func(a string) bool { return a == "--on-shutdown" || a == "keep" })
	p3 := start(t, "up again", again)
	c = p3.client(t)
	if info := mustGet(t, ctx, c, c1.ID); info.State != pandastack.StateRunning {
		t.Fatalf("the lazily restored sandbox after a shutdown with keep and a restart: %s (%s), want running", info.State, info.StopReason)
	}
	c1 = c.Sandbox(c1.ID)
	if got := mustExec(t, ctx, c1, "cat /root/d.txt; md5sum /dev/shm/blob"); got != "lazy\n"+sum {
		t.Errorf("after a restart: %q, want %q", got, "lazy\n"+sum)
	}
	// A shutdown that stops the sandboxes unmounts, and the holder exits.
	mustStop(t, p3)
	if testkit.Mounted(lazy) || len(pandatest.HolderPIDs(dataDir)) > 0 {
		t.Errorf("after panda stopped its sandboxes: %s mounted %v, holders %v; want neither", lazy, testkit.Mounted(lazy), pandatest.HolderPIDs(dataDir))
	}
}
