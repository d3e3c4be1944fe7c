package hostapi_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/chunkstore"
	"github.com/pandastack/pandastack/internal/host"
	"github.com/pandastack/pandastack/internal/hostapi"
	"github.com/pandastack/pandastack/internal/lifecycle"
	"github.com/pandastack/pandastack/internal/objstore"
	"github.com/pandastack/pandastack/internal/vmm/qemu"
	"golang.org/x/sys/unix"
)

// storeHost runs a host agent of its own (own data directory, object
// store objs) behind a host API server, and returns a client of it; all
// of it is closed and removed when the test ends.
func storeHost(t *testing.T, objs objstore.Store) *hostapi.Client {
	t.Helper()
	dir, err := os.MkdirTemp("", "phs") // short: unix socket paths under it
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	drv, err := qemu.New(qemu.Config{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := chunkstore.New(objs, chunkstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.Open(context.Background(), agent.Config{
		DataDir: dir, ImagesDir: testImages(), Accel: "tcg", VolumeSize: 8 << 30, Driver: drv,
		DefaultTemplate: "tiny", DefaultMemoryMiB: 256,
		Store: cs, StoreRetry: 100 * time.Millisecond,
		Logger: log,
	})
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	srv := hostapi.NewServer(a, testToken, log)
	hts := httptest.NewServer(srv)
	c, err := hostapi.Dial(hts.URL, testToken)
	t.Cleanup(func() {
		if c != nil {
			c.Close()
		}
		srv.Close()
		hts.Close()
		a.Close()
		unix.Unmount(filepath.Join(dir, "store"), unix.MNT_DETACH) // if Close could not
		os.RemoveAll(dir)
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestPausedSandboxMovesBetweenHosts drives two host agents that share an
// object store (a directory) through their host API, as a control plane
// does: a sandbox paused on A says where it is kept (Info.Stored) until it
// is durable, is resumed on B, which never held it, with its files and
// memory; a stale copy's kill on A and the kill on B both succeed.
func TestPausedSandboxMovesBetweenHosts(t *testing.T) {
	objs, err := objstore.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	hostA, hostB := storeHost(t, objs), storeHost(t, objs)
	ctx := ctxT(t)
	sb, err := hostA.Create(ctx, host.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hostA.Kill(context.Background(), sb.ID) })
	sum := mustRun(t, hostA, sb.ID, "echo moved > /root/m; head -c 1048576 /dev/urandom > /dev/shm/x; md5sum /dev/shm/x")

	if _, err := hostA.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	var last host.Info
	if !waitFor(time.Minute, func() bool {
		last, err = hostA.Get(ctx, sb.ID)
		return err == nil && last.Stored == host.StoredDurable
	}) {
		t.Fatalf("paused sandbox never durable: %+v, %v", last, err)
	}
	if last.State != lifecycle.Paused || last.StoreError != "" {
		t.Errorf("durable paused sandbox on A: %+v", last)
	}
	if _, err := hostB.Get(ctx, sb.ID); !errors.Is(err, host.ErrNotFound) {
		t.Fatalf("B holds the sandbox before resuming it: %v", err)
	}

	info, err := hostB.Resume(ctx, sb.ID)
	if err != nil {
		t.Fatalf("resume on B of a sandbox paused on A: %v", err)
	}
	t.Cleanup(func() { hostB.Kill(context.Background(), sb.ID) })
	if info.State != lifecycle.Running || info.ID != sb.ID || info.Stored != "" {
		t.Errorf("resumed on B: %+v", info)
	}
	if got := mustRun(t, hostB, sb.ID, "cat /root/m; md5sum /dev/shm/x"); got != "moved\n"+sum {
		t.Errorf("resumed on B: %q, want %q", got, "moved\n"+sum)
	}
	if _, err := hostB.Resume(ctx, host.NewID()); !errors.Is(err, host.ErrNotFound) {
		t.Errorf("resume on B of a sandbox no host has: %v, want host.ErrNotFound", err)
	}
	// A's copy is stale: the control plane kills it there.
	if err := hostA.Kill(ctx, sb.ID); err != nil {
		t.Errorf("kill of A's stale copy: %v", err)
	}
	if got := mustRun(t, hostB, sb.ID, "cat /root/m"); got != "moved\n" {
		t.Errorf("on B after A's kill: %q", got)
	}
	if err := hostB.Kill(ctx, sb.ID); err != nil {
		t.Errorf("kill on B: %v", err)
	}
}
