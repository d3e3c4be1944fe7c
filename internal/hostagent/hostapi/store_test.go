package hostapi_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/controlplane/hostclient"
	"github.com/pandastack/pandastack/internal/hostagent"
	"github.com/pandastack/pandastack/internal/hostagent/hostapi"
	"github.com/pandastack/pandastack/internal/hostagent/vmm/qemu"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/objstore"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	"golang.org/x/sys/unix"
)

// storeHost runs a host agent of its own (own data directory, object
// store objs) behind a host API server, and returns a client of it; all
// of it is closed and removed when the test ends.
func storeHost(t *testing.T, objs objstore.Store) *hostclient.Client {
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
	a, err := hostagent.Open(context.Background(), hostagent.Config{
		DataDir: dir, ImagesDir: testkit.Images(), Accel: "tcg", VolumeSize: 8 << 30, Driver: drv,
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
	c, err := hostclient.Dial(hts.URL, testToken)
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
	testkit.VM(t)
	testkit.Root(t)
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
	if !testkit.Poll(time.Minute, func() bool {
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

// TestSnapshotGoesDirect drives a direct transfer through the host API as
// a cross-host fork does: A's transient capture, streamed from A's pack
// endpoint into B's, before B holds A's template (B fetches it from the
// store while the pack waits), cut short (refused: corrupt), then whole;
// B then creates from it with A's files.
func TestSnapshotGoesDirect(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
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
	mustRun(t, hostA, sb.ID, "echo direct > /root/d")
	capture := transientCaptures(t, hostA, hostB, sb.ID)
	id := capture()
	// pack opens A's pack of snapshot id, cut to limit bytes if limit > 0;
	// the caller closes it.
	pack := func(id string, limit int64) (io.Reader, io.Closer) {
		rc, err := hostA.SnapshotPack(ctx, id)
		if err != nil {
			t.Fatalf("open A's pack: %v", err)
		}
		if limit > 0 {
			return io.LimitReader(rc, limit), rc
		}
		return rc, rc
	}
	send := func(limit int64) (host.SnapshotInfo, error) {
		r, c := pack(id, limit)
		defer c.Close()
		return hostB.ReceiveSnapshot(ctx, id, r)
	}
	if _, err := hostA.SnapshotPack(ctx, host.NewID()); !errors.Is(err, host.ErrNotFound) {
		t.Errorf("pack of no snapshot: %v, want host.ErrNotFound", err)
	}

	// B, without A's template, fetches it from the store while the pack
	// waits, and takes the pack.
	cs, err := chunkstore.New(objs, chunkstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if !testkit.Poll(time.Minute, func() bool {
		_, err := cs.Manifest(ctx, "templates/"+sb.Template)
		return err == nil
	}) {
		t.Fatalf("A's template %s never reached the store", sb.Template)
	}
	first := capture()
	r, c := pack(first, 0)
	_, err = hostB.ReceiveSnapshot(ctx, first, r)
	c.Close()
	if err != nil {
		t.Errorf("B without A's template: %v, want it fetched and the pack taken", err)
	}

	if _, err := send(64 << 10); !errors.Is(err, host.ErrCorrupt) {
		t.Errorf("pack cut short: %v, want host.ErrCorrupt", err)
	}
	si, err := send(0)
	if err != nil {
		t.Fatalf("direct transfer A → B: %v", err)
	}
	if si.ID != id || !si.Transient || si.FetchedBytes <= 0 {
		t.Errorf("B's received capture: %+v", si)
	}
	if _, err := send(0); !errors.Is(err, host.ErrConflict) {
		t.Errorf("a second transfer of the same capture: %v, want host.ErrConflict", err)
	}
	child, err := hostB.Create(ctx, host.CreateRequest{SnapshotID: id})
	if err != nil {
		t.Fatalf("create on B from the received capture: %v", err)
	}
	t.Cleanup(func() { hostB.Kill(context.Background(), child.ID) })
	if got := mustRun(t, hostB, child.ID, "cat /root/d"); got != "direct\n" {
		t.Errorf("child on B reads %q, want %q", got, "direct\n")
	}

	// Received and created at once (POST …/pack/create), as a
	// cross-host fork makes its first child on a host.
	sendCreate := func(req host.CreateRequest, limit int64) (host.Info, host.SnapshotInfo, error) {
		r, c := pack(req.SnapshotID, limit)
		defer c.Close()
		return hostB.ReceiveAndCreate(ctx, req, r)
	}
	if _, kept, err := sendCreate(host.CreateRequest{SnapshotID: id}, 0); !errors.Is(err, host.ErrConflict) || kept.ID != "" {
		t.Errorf("pack and create of a capture B has: %v, kept %q; want host.ErrConflict, nothing kept", err, kept.ID)
	}
	id2 := capture()
	if _, kept, err := sendCreate(host.CreateRequest{SnapshotID: id2}, 64<<10); !errors.Is(err, host.ErrCorrupt) || kept.ID != "" {
		t.Errorf("pack cut short, with a create: %v, kept %q; want host.ErrCorrupt, nothing kept", err, kept.ID)
	}
	// made checks a child made from capture id as its pack arrived.
	made := func(what, id string, child host.Info, si host.SnapshotInfo, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s A → B: %v", what, err)
		}
		t.Cleanup(func() { hostB.Kill(context.Background(), child.ID) })
		if si.ID != id || si.FetchedBytes <= 0 || child.State != lifecycle.Running {
			t.Errorf("%s: snapshot %+v, sandbox %+v", what, si, child)
		}
		if got := mustRun(t, hostB, child.ID, "cat /root/d"); got != "direct\n" {
			t.Errorf("child made by %s reads %q, want %q", what, got, "direct\n")
		}
	}
	child, si2, err := sendCreate(host.CreateRequest{SnapshotID: id2}, 0)
	made("pack and create", id2, child, si2, err)
	id3 := capture()
	bad := host.CreateRequest{SnapshotID: id3, Network: netpolicy.Policy{AllowOut: []string{"not an address"}}}
	if _, kept, err := sendCreate(bad, 0); !errors.Is(err, host.ErrInvalid) || kept.ID != id3 {
		t.Errorf("pack and a create with a bad policy: %v, kept %q; want host.ErrInvalid, %s kept", err, kept.ID, id3)
	}

	// Fetched by B straight from A (POST …/pack/pull, with a ticket made
	// from A's token), as a cross-host fork's child host does.
	id4 := capture()
	from, ok := hostA.PackSource(id4, time.Minute)
	if !ok || from.Ticket == "" {
		t.Fatalf("A's client gives no pack source: %+v", from)
	}
	// The ticket grants that pack and nothing else.
	get := func(path, ticket string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, from.URL+hostwire.Prefix+path, nil)
		req.Header.Set("Authorization", "Ticket "+ticket)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	forged := []byte(from.Ticket)
	forged[len(forged)-1] ^= 1 // a hex digit still, another one
	for _, tc := range []struct{ what, path, ticket string }{
		{"another snapshot's pack", "/snapshots/" + id + "/pack", from.Ticket},
		{"a sandbox", "/sandboxes/" + sb.ID, from.Ticket},
		{"the same snapshot's state in the store", "/snapshots/" + id4 + "/stored?wait_ms=0", from.Ticket},
		{"an expired ticket", "/snapshots/" + id4 + "/pack", hostwire.PackTicket(testToken, id4, time.Now().Add(-time.Second))},
		{"another agent's ticket", "/snapshots/" + id4 + "/pack", hostwire.PackTicket("pandaagent_another", id4, time.Now().Add(time.Minute))},
		{"a forged ticket", "/snapshots/" + id4 + "/pack", string(forged)},
	} {
		if code := get(tc.path, tc.ticket); code != http.StatusUnauthorized {
			t.Errorf("%s with a pack ticket: %d, want 401", tc.what, code)
		}
	}
	if code := get("/snapshots/"+id4+"/pack", from.Ticket); code != http.StatusOK {
		t.Errorf("the pack its ticket grants: %d, want 200", code)
	}
	badTicket := from
	badTicket.Ticket = string(forged)
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	for _, tc := range []struct {
		what string
		from host.PackSource
	}{{"a refused ticket", badTicket}, {"a host that does not answer", host.PackSource{URL: closed.URL, Ticket: from.Ticket}}} {
		if _, kept, err := hostB.PullAndCreate(ctx, host.CreateRequest{SnapshotID: id4}, tc.from); !errors.Is(err, host.ErrUnavailable) || kept.ID != "" {
			t.Errorf("pull with %s: %v, kept %q; want host.ErrUnavailable, nothing kept", tc.what, err, kept.ID)
		}
	}
	child, si4, err := hostB.PullAndCreate(ctx, host.CreateRequest{SnapshotID: id4}, from)
	made("pull and create", id4, child, si4, err)
}

// transientCaptures returns a function that takes a transient capture of
// sandbox id on a (a cross-host fork's), deleted from a and b when the
// test ends, and returns its id.
func transientCaptures(t *testing.T, a, b *hostclient.Client, id string) func() string {
	return func() string {
		snap := host.NewID()
		if _, err := a.SnapshotTransient(ctxT(t), id, snap); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			a.DeleteSnapshot(context.Background(), snap)
			b.DeleteSnapshot(context.Background(), snap)
		})
		return snap
	}
}

// TestPullDiffsAgainstSnapshot: a host that pulls a capture of a sandbox
// created from a snapshot it holds says so (its held snapshots go with
// the request), and gets only what the sandbox changed since that
// snapshot; the pack relayed without that is diffed against the template
// and carries the snapshot's data again.
func TestPullDiffsAgainstSnapshot(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
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
	sum := mustRun(t, hostA, sb.ID, "head -c 25165824 /dev/urandom > /root/env && sync && md5sum /root/env")
	snapID := host.NewID()
	if _, err := hostA.Snapshot(ctx, sb.ID, snapID); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		hostA.DeleteSnapshot(context.Background(), snapID)
		hostB.DeleteSnapshot(context.Background(), snapID)
	})
	if si, err := hostA.AwaitStored(ctx, snapID, hostwire.MaxStoredWait); err != nil || si.Stored != host.StoredDurable {
		t.Fatalf("snapshot in the store: %+v, %v", si, err)
	}
	onB, err := hostB.Create(ctx, host.CreateRequest{SnapshotID: snapID}) // B holds it from now on
	if err != nil {
		t.Fatal(err)
	}
	hostB.Kill(ctx, onB.ID)
	x, err := hostA.Create(ctx, host.CreateRequest{SnapshotID: snapID})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hostA.Kill(context.Background(), x.ID) })
	mustRun(t, hostA, x.ID, "echo since > /root/since")
	capture := transientCaptures(t, hostA, hostB, x.ID)
	check := func(what string, child host.Info, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Cleanup(func() { hostB.Kill(context.Background(), child.ID) })
		if got := mustRun(t, hostB, child.ID, "md5sum /root/env; cat /root/since"); got != sum+"since\n" {
			t.Errorf("child made by %s reads %q, want %q", what, got, sum+"since\n")
		}
	}

	relayed := capture()
	rc, err := hostA.SnapshotPack(ctx, relayed)
	if err != nil {
		t.Fatal(err)
	}
	child, siR, err := hostB.ReceiveAndCreate(ctx, host.CreateRequest{SnapshotID: relayed}, rc)
	rc.Close()
	check("a relayed pack", child, err)

	pulled := capture()
	from, ok := hostA.PackSource(pulled, time.Minute)
	if !ok {
		t.Fatal("A's client gives no pack source")
	}
	child, siP, err := hostB.PullAndCreate(ctx, host.CreateRequest{SnapshotID: pulled}, from)
	check("a pull", child, err)
	t.Logf("relayed (against the template): %d bytes; pulled (against the snapshot B holds): %d bytes", siR.FetchedBytes, siP.FetchedBytes)
	if siR.FetchedBytes < 24<<20 || siP.FetchedBytes > siR.FetchedBytes/4 {
		t.Errorf("relayed %d bytes, pulled %d: want the relayed pack to carry the snapshot's 24 MiB, the pulled one only what changed since", siR.FetchedBytes, siP.FetchedBytes)
	}
}

// TestStoredUserTemplates: the host API lists the user template versions
// whose set the agent's object store holds ("NAME:N", other sets left out)
// and deletes one (the control plane's sweep of versions its registry no
// longer has); a version that is not a number is refused.
func TestStoredUserTemplates(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	objs, err := objstore.OpenDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := storeHost(t, objs)
	cs, err := chunkstore.New(objs, chunkstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f := filepath.Join(t.TempDir(), "rootfs.ext4")
	if err := os.WriteFile(f, []byte("a root filesystem"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, set := range []string{"userfs/app/v1", "userfs/app/v2", "snapshots/abc"} {
		if _, _, err := cs.Upload(ctx, set, map[string]string{"rootfs.ext4": f}, nil); err != nil {
			t.Fatal(err)
		}
	}
	got, err := c.StoredUserTemplates(ctx)
	if err != nil || !slices.Equal(got, []string{"app:1", "app:2"}) {
		t.Fatalf("StoredUserTemplates = %q, %v; want app:1 app:2", got, err)
	}
	if err := c.DropStoredUserTemplate(ctx, "app", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Manifest(ctx, "userfs/app/v1"); !errors.Is(err, objstore.ErrNotFound) {
		t.Errorf("userfs/app/v1 after its drop: %v, want not found", err)
	}
	if got, err := c.StoredUserTemplates(ctx); err != nil || !slices.Equal(got, []string{"app:2"}) {
		t.Errorf("StoredUserTemplates after the drop = %q, %v; want app:2", got, err)
	}
	if err := c.DropStoredUserTemplate(ctx, "app", 1); err != nil {
		t.Errorf("a drop of a set already gone: %v, want none", err)
	}
	if err := c.DropStoredUserTemplate(ctx, "app", 0); !errors.Is(err, host.ErrInvalid) {
		t.Errorf("a drop of version 0: %v, want ErrInvalid", err)
	}
}
