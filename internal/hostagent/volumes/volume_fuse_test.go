package volumes_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/guestproto/guestprototest"
	"github.com/pandastack/pandastack/internal/contract/volproto"
	"github.com/pandastack/pandastack/internal/guest"
	"github.com/pandastack/pandastack/internal/hostagent/volumes"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// These tests run the real guest agent (internal/guest) in this process,
// connected to a guestproto.Client over an in-memory transport: the
// agent mounts its volume file systems (FUSE) on this host, and
// volumes.Serve serves them from temp dirs, as the host agent does over
// the virtio-serial channel. They need root (FUSE mounts).

type nopHooks struct{}

func (nopHooks) SetClock(time.Time) error  { return nil }
func (nopHooks) AddEntropy([]byte) error   { return nil }
func (nopHooks) SetHostname(string) error  { return nil }
func (nopHooks) SetMachineID(string) error { return nil }

// fuseWorld is a guest agent with its transport.
type fuseWorld struct {
	tr  *guestprototest.Transport
	srv *guest.Server
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// startAgent starts a guest agent; its cleanup unmounts every volume it
// mounted, also when the test failed.
func startAgent(t testing.TB) *fuseWorld {
	t.Helper()
	testkit.Root(t)
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Fatalf("FUSE: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	reaper := guest.NewReaper(false)
	go reaper.Run(ctx)
	w := &fuseWorld{tr: guestprototest.New()}
	w.srv = guest.NewServer(guest.Config{Hooks: nopHooks{}, Reaper: reaper, Version: "test"})
	agent := guestproto.NewAgent(w.tr, w.srv, nil)
	done := make(chan struct{})
	go func() { defer close(done); _ = agent.Run(ctx) }()
	t.Cleanup(func() {
		w.srv.UnmountVolumes()
		cancel()
		_ = w.tr.Close()
		<-done
	})
	return w
}

// connect starts a new session (as after a restore or in a fork child).
func (w *fuseWorld) connect(t testing.TB) *guestproto.Client {
	t.Helper()
	c := guestproto.NewClient(w.tr.Connect(true))
	t.Cleanup(func() { _ = c.Close() })
	entropy := make([]byte, guestproto.MinEntropy)
	rand.Read(entropy)
	r, err := c.Hello(testCtx(t), guestproto.HelloRequest{Session: fmt.Sprintf("s%x", entropy[:8]), Entropy: entropy})
	if err != nil {
		t.Fatalf("Hello: %v", err)
	}
	if !r.HasFeature(guestproto.FeatureVolumes) {
		t.Fatalf("the agent does not list %s: %v", guestproto.FeatureVolumes, r.Features)
	}
	return c
}

// hostVolume is a volume's directory on the host and its accountant.
type hostVolume struct {
	dir   string
	root  *os.Root
	space *testSpace
}

func newHostVolume(t testing.TB, limit int64) *hostVolume {
	t.Helper()
	dir := t.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return &hostVolume{dir: dir, root: root, space: &testSpace{limit: limit}}
}

// mountPoints returns n new guest paths; their cleanup (registered after
// the temp dir's, so run before it) unmounts whatever is still mounted.
func mountPoints(t testing.TB, n int) []string {
	t.Helper()
	base := t.TempDir()
	// Other users reach the mounts (t.TempDir's directories are 0700).
	os.Chmod(base, 0o755)
	os.Chmod(filepath.Dir(base), 0o755)
	var ps []string
	for i := range n {
		ps = append(ps, filepath.Join(base, fmt.Sprintf("m%d", i)))
	}
	// This process serves the mounts: one of its threads blocked on a
	// mount whose server stopped answering keeps it from exiting, so a
	// failed test aborts the mounts' connections (a forced unmount of a
	// FUSE mount does) before anything else, and before the test's
	// deadline too.
	forceUnmount := func() {
		for _, p := range ps {
			for testkit.Mounted(p) {
				if err := syscall.Unmount(p, syscall.MNT_FORCE); err != nil {
					if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil {
						t.Errorf("unmount %s: %v", p, err)
						break
					}
				}
			}
		}
	}
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if deadline, ok := d.Deadline(); ok {
			watchdog := time.AfterFunc(time.Until(deadline)-15*time.Second, forceUnmount)
			t.Cleanup(func() { watchdog.Stop() })
		}
	}
	t.Cleanup(forceUnmount)
	return ps
}

// open opens the volume stream of c with mounts and serves it with
// volumes.Serve (conn wraps it when not nil) until the test ends.
func open(t testing.TB, c *guestproto.Client, gm []guestproto.VolumeMount, hm []volumes.Mount, wrap func(net.Conn) net.Conn) {
	t.Helper()
	conn, err := c.OpenVolumes(testCtx(t), gm)
	if err != nil {
		t.Fatalf("OpenVolumes: %v", err)
	}
	if wrap != nil {
		conn = wrap(conn)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- volumes.Serve(ctx, conn, hm) }()
	t.Cleanup(func() {
		cancel()
		conn.Close()
		<-done
	})
}

// TestVolumeFUSE: the guest's file operations on a volume mount arrive on
// the host's directory, with its refusals, limit and read-only mounts,
// and two mounts of one volume see each other's closed writes.
func TestVolumeFUSE(t *testing.T) {
	w := startAgent(t)
	c := w.connect(t)
	vol := newHostVolume(t, 1<<20)
	mp := mountPoints(t, 3)
	a, b, ro := mp[0], mp[1], mp[2]
	open(t, c, []guestproto.VolumeMount{{Tag: "a", Path: a}, {Tag: "b", Path: b}, {Tag: "ro", Path: ro, ReadOnly: true}},
		[]volumes.Mount{{Tag: "a", Root: vol.root, Space: vol.space}, {Tag: "b", Root: vol.root, Space: vol.space}, {Tag: "ro", Root: vol.root, Space: vol.space, ReadOnly: true}}, nil)
	for _, p := range mp {
		if !testkit.Mounted(p) {
			t.Fatalf("%s is not mounted", p)
		}
	}

	// Write, read, append, mkdir, rename, readdir, truncate, symlink.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(a, "f"), []byte("hello"), 0o644))
	if got, _ := os.ReadFile(filepath.Join(vol.dir, "f")); string(got) != "hello" {
		t.Errorf("host file after the guest's write: %q", got)
	}
	f, err := os.OpenFile(filepath.Join(a, "f"), os.O_WRONLY|os.O_APPEND, 0)
	must(err)
	_, err = f.WriteString(", world")
	must(err)
	must(f.Close())
	if got, _ := os.ReadFile(filepath.Join(b, "f")); string(got) != "hello, world" {
		t.Errorf("read through the other mount: %q", got)
	}
	must(os.MkdirAll(filepath.Join(a, "d/e"), 0o755))
	must(os.Rename(filepath.Join(a, "f"), filepath.Join(a, "d/e/g")))
	must(os.Truncate(filepath.Join(a, "d/e/g"), 5))
	must(os.Symlink("e/g", filepath.Join(a, "d/link")))
	if got, _ := os.ReadFile(filepath.Join(a, "d/link")); string(got) != "hello" {
		t.Errorf("read through the symlink: %q", got)
	}
	if target, err := os.Readlink(filepath.Join(vol.dir, "d/link")); err != nil || target != "e/g" {
		t.Errorf("host symlink: %q, %v", target, err)
	}
	ents, err := os.ReadDir(filepath.Join(b, "d"))
	must(err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	if fmt.Sprint(names) != "[e link]" {
		t.Errorf("readdir: %v, want [e link]", names)
	}
	fi, err := os.Lstat(filepath.Join(b, "d/e/g"))
	if err != nil || fi.Size() != 5 || fi.Mode().Perm() != 0o644 {
		t.Errorf("stat through the other mount: %v, %v", fi, err)
	}

	// Refused: hard links, FIFOs, devices; setuid is stripped.
	if err := os.Link(filepath.Join(a, "d/e/g"), filepath.Join(a, "hard")); !errors.Is(err, syscall.EPERM) {
		t.Errorf("hard link: %v, want EPERM", err)
	}
	if err := syscall.Mkfifo(filepath.Join(a, "fifo"), 0o644); !errors.Is(err, syscall.EPERM) {
		t.Errorf("mkfifo: %v, want EPERM", err)
	}
	if err := syscall.Mknod(filepath.Join(a, "dev"), syscall.S_IFCHR|0o644, 0x0103); !errors.Is(err, syscall.EPERM) {
		t.Errorf("mknod: %v, want EPERM", err)
	}
	must(os.WriteFile(filepath.Join(a, "suid"), nil, 0o755))
	must(os.Chmod(filepath.Join(a, "suid"), 0o4755|os.ModeSetuid))
	if fi, _ := os.Stat(filepath.Join(vol.dir, "suid")); fi.Mode()&os.ModeSetuid != 0 {
		t.Errorf("setuid reached the host: %v", fi.Mode())
	}
	// A guest symlink out of the volume is stored, not followed by the
	// host: it names a path of the guest's.
	must(os.Symlink("/etc", filepath.Join(a, "etc")))
	if fi, err := os.Lstat(filepath.Join(vol.dir, "etc")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("host entry of the guest's symlink: %v, %v", fi, err)
	}

	// Any guest user may write: owners and modes are shown, not
	// enforced (the volume's root is the host's, mode 0700 here).
	must(os.Chmod(vol.dir, 0o700))
	cmd := exec.Command("/bin/sh", "-c", "echo user > "+filepath.Join(a, "by-user")+" && stat -c %u "+filepath.Join(a, "by-user"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1234, Gid: 1234}}
	if out, err := cmd.CombinedOutput(); err != nil || string(out) != "1234\n" {
		t.Errorf("a guest user's write: %q, %v; want it to succeed and own the file", out, err)
	}

	// A file removed while open stays usable through its open file, is
	// not listed, and is gone from the host at its last close.
	tmp, err := os.Create(filepath.Join(a, "tmp"))
	must(err)
	must(os.Remove(filepath.Join(a, "tmp")))
	if _, err := tmp.WriteString("still here"); err != nil {
		t.Errorf("write to a removed open file: %v", err)
	}
	if got := make([]byte, 10); func() error { _, err := tmp.ReadAt(got, 0); return err }() != nil || string(got) != "still here" {
		t.Errorf("read of a removed open file: %q", got)
	}
	if ents, _ := os.ReadDir(a); len(ents) > 0 {
		for _, e := range ents {
			if strings.Contains(e.Name(), "unlinked") || e.Name() == "tmp" {
				t.Errorf("a removed open file is listed as %s", e.Name())
			}
		}
	}
	must(tmp.Close())
	testkit.WaitForf(t, time.Minute, func() string { return "the removed file gone from the host at its last close" }, func() bool {
		ents, _ := os.ReadDir(vol.dir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".panda-unlinked-") {
				return false
			}
		}
		return true
	})

	// Read-only mount.
	if err := os.WriteFile(filepath.Join(ro, "new"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Errorf("write on the read-only mount: %v, want EROFS", err)
	}
	if got, err := os.ReadFile(filepath.Join(ro, "d/e/g")); err != nil || string(got) != "hello" {
		t.Errorf("read on the read-only mount: %q, %v", got, err)
	}

	// The limit: df shows it; a write beyond it fails with ENOSPC.
	var st syscall.Statfs_t
	must(syscall.Statfs(a, &st))
	if got := int64(st.Blocks) * int64(st.Bsize); got != 1<<20 {
		t.Errorf("statfs size: %d, want %d", got, 1<<20)
	}
	if used := int64(st.Blocks-st.Bfree) * int64(st.Bsize); used != vol.space.Used() {
		t.Errorf("statfs used: %d, want %d", used, vol.space.Used())
	}
	err = os.WriteFile(filepath.Join(a, "big"), make([]byte, 2<<20), 0o644)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("write beyond the limit: %v, want ENOSPC", err)
	}
	if vol.space.Used() > 1<<20 {
		t.Errorf("used %d beyond the limit", vol.space.Used())
	}
	must(os.Remove(filepath.Join(a, "big")))

	// Close-to-open: b holds the file open with its pages cached; a
	// rewrites it; b's next open reads the new bytes.
	p := filepath.Join(b, "c2o")
	must(os.WriteFile(p, bytes.Repeat([]byte("1"), 8192), 0o644))
	held, err := os.Open(p)
	must(err)
	defer held.Close()
	if _, err := io.ReadAll(held); err != nil {
		t.Fatal(err)
	}
	must(os.WriteFile(filepath.Join(a, "c2o"), bytes.Repeat([]byte("2"), 8192), 0o644))
	if got, _ := os.ReadFile(p); string(got) != string(bytes.Repeat([]byte("2"), 8192)) {
		t.Errorf("open after the other mount's close: %d bytes, %.8q...; want 8192 of '2'", len(got), got)
	}
	// A file made elsewhere (the files API) is seen at once.
	must(os.WriteFile(filepath.Join(vol.dir, "host-made"), []byte("h"), 0o644))
	if got, err := os.ReadFile(filepath.Join(a, "host-made")); err != nil || string(got) != "h" {
		t.Errorf("file the host made: %q, %v", got, err)
	}
	must(os.Remove(filepath.Join(vol.dir, "host-made")))
	if _, err := os.Stat(filepath.Join(b, "host-made")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("file the host removed: %v, want not found", err)
	}
}

// TestVolumeFUSEUnmount: a new OpenVolumes without a mount unmounts it.
func TestVolumeFUSEUnmount(t *testing.T) {
	w := startAgent(t)
	c := w.connect(t)
	vol := newHostVolume(t, 1<<20)
	mp := mountPoints(t, 2)
	gm := []guestproto.VolumeMount{{Tag: "a", Path: mp[0]}, {Tag: "b", Path: mp[1]}}
	hm := []volumes.Mount{{Tag: "a", Root: vol.root, Space: vol.space}, {Tag: "b", Root: vol.root, Space: vol.space}}
	open(t, c, gm, hm, nil)
	open(t, c, gm[:1], hm[:1], nil)
	if !testkit.Mounted(mp[0]) || testkit.Mounted(mp[1]) {
		t.Errorf("after reopening with %s only: mounted %v, %v", mp[0], testkit.Mounted(mp[0]), testkit.Mounted(mp[1]))
	}
	if err := os.WriteFile(filepath.Join(mp[0], "x"), []byte("x"), 0o644); err != nil {
		t.Errorf("write on the remaining mount after the stream was replaced: %v", err)
	}
	// Bad mounts are refused before anything is sent.
	if _, err := c.OpenVolumes(testCtx(t), []guestproto.VolumeMount{{Tag: "a", Path: "relative"}}); err == nil {
		t.Error("OpenVolumes of a relative path: no error")
	}
}

// dropper sits between the guest's volume stream and volumes.Serve: it
// passes every message, except the answer to the first mkdir of name,
// which it drops (and then reports on dropped), as when the guest's
// session ends after the host did the request but before the answer
// reached the guest.
type dropper struct {
	name    string
	dropped chan struct{}
	mu      sync.Mutex
	mkdir   map[uint64]bool
	done    bool
}

func (d *dropper) wrap(guestConn net.Conn) net.Conn {
	hostEnd, proxyEnd := net.Pipe()
	go func() { // guest → host
		defer proxyEnd.Close()
		for {
			body, err := volproto.ReadMessage(guestConn, nil)
			if err != nil {
				return
			}
			if req, err := volproto.DecodeRequest(body); err == nil && req.Op == volproto.OpMkdir && filepath.Base(req.Path) == d.name {
				d.mu.Lock()
				d.mkdir[req.ID] = true
				d.mu.Unlock()
			}
			if _, err := proxyEnd.Write(append(bigEndian(len(body)), body...)); err != nil {
				return
			}
		}
	}()
	go func() { // host → guest
		defer guestConn.Close()
		for {
			body, err := volproto.ReadMessage(proxyEnd, nil)
			if err != nil {
				return
			}
			resp, err := volproto.DecodeResponse(body)
			if err != nil {
				return
			}
			d.mu.Lock()
			drop := d.mkdir[resp.ID] && !d.done
			if drop {
				d.done = true
			}
			d.mu.Unlock()
			if drop {
				close(d.dropped)
				continue
			}
			if _, err := guestConn.Write(append(bigEndian(len(body)), body...)); err != nil {
				return
			}
		}
	}()
	return hostEnd
}

func bigEndian(n int) []byte { return []byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)} }

// TestVolumeFUSEStreamReplaced: a request outstanding when the guest's
// session ends (a restore, a fork child) is sent again on the next
// session's volume stream and completes there; one the host had done
// already (its answer lost) succeeds on the retry.
func TestVolumeFUSEStreamReplaced(t *testing.T) {
	w := startAgent(t)
	c := w.connect(t)
	vol := newHostVolume(t, 1<<20)
	mp := mountPoints(t, 1)
	gm := []guestproto.VolumeMount{{Tag: "v", Path: mp[0]}}
	hm := []volumes.Mount{{Tag: "v", Root: vol.root, Space: vol.space}}
	d := &dropper{name: "retried", dropped: make(chan struct{}), mkdir: map[uint64]bool{}}
	open(t, c, gm, hm, d.wrap)

	errc := make(chan error, 1)
	go func() { errc <- os.Mkdir(filepath.Join(mp[0], "retried"), 0o755) }()
	select {
	case <-d.dropped:
	case err := <-errc:
		t.Fatalf("mkdir returned before its answer was dropped: %v", err)
	case <-testCtx(t).Done():
		t.Fatal("mkdir never reached the host")
	}
	if _, err := os.Stat(filepath.Join(vol.dir, "retried")); err != nil {
		t.Fatalf("the host did not make the directory: %v", err)
	}
	// The session ends; requests made meanwhile wait for the next stream.
	c.Close()
	statc := make(chan error, 1)
	go func() {
		_, err := os.ReadFile(filepath.Join(mp[0], "retried/none"))
		statc <- err
	}()
	c2 := w.connect(t)
	open(t, c2, gm, hm, nil)
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("mkdir re-sent on the new stream: %v, want success", err)
		}
	case <-testCtx(t).Done():
		t.Fatal("mkdir never completed on the new stream")
	}
	select {
	case err := <-statc:
		if !errors.Is(err, os.ErrNotExist) {
			t.Errorf("read made while no stream was attached: %v, want not found", err)
		}
	case <-testCtx(t).Done():
		t.Fatal("a request made while no stream was attached never completed")
	}
	if err := os.WriteFile(filepath.Join(mp[0], "retried/after"), []byte("ok"), 0o644); err != nil {
		t.Errorf("write on the new stream: %v", err)
	}
}

// BenchmarkVolumeFUSE: sequential write and read of 256 MiB through a
// volume mount (the whole guest → host path in memory) and, for
// comparison, of the host's directory itself.
func BenchmarkVolumeFUSE(b *testing.B) {
	const size = 256 << 20
	w := startAgent(b)
	c := w.connect(b)
	vol := newHostVolume(b, 1<<40)
	mp := mountPoints(b, 1)
	open(b, c, []guestproto.VolumeMount{{Tag: "v", Path: mp[0]}}, []volumes.Mount{{Tag: "v", Root: vol.root, Space: vol.space}}, nil)
	buf := make([]byte, 1<<20)
	rand.Read(buf)
	for _, dir := range []struct{ name, path string }{{"fuse", mp[0]}, {"plain", vol.dir}} {
		b.Run(dir.name+"-write", func(b *testing.B) {
			b.SetBytes(size)
			for range b.N {
				f, err := os.Create(filepath.Join(dir.path, "seq"))
				if err != nil {
					b.Fatal(err)
				}
				for n := 0; n < size; n += len(buf) {
					if _, err := f.Write(buf); err != nil {
						b.Fatal(err)
					}
				}
				if err := f.Sync(); err != nil {
					b.Fatal(err)
				}
				f.Close()
			}
		})
		b.Run(dir.name+"-read", func(b *testing.B) {
			b.SetBytes(size)
			for range b.N {
				// Drop the host's page cache of the file? No: both read a
				// file the host just wrote; the comparison is the path.
				f, err := os.Open(filepath.Join(dir.path, "seq"))
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.CopyBuffer(io.Discard, f, buf)
				f.Close()
				if err != nil || n != size {
					b.Fatalf("read %d, %v", n, err)
				}
			}
		})
	}
}

// BenchmarkVolumeFUSEStat: stat of 1000 files of a volume directory, the
// metadata cost of the mounts' zero entry and attribute timeouts.
func BenchmarkVolumeFUSEStat(b *testing.B) {
	w := startAgent(b)
	c := w.connect(b)
	vol := newHostVolume(b, 1<<40)
	mp := mountPoints(b, 1)
	open(b, c, []guestproto.VolumeMount{{Tag: "v", Path: mp[0]}}, []volumes.Mount{{Tag: "v", Root: vol.root, Space: vol.space}}, nil)
	for i := range 1000 {
		os.WriteFile(filepath.Join(vol.dir, fmt.Sprintf("f%d", i)), nil, 0o644)
	}
	b.ResetTimer()
	for range b.N {
		for i := range 1000 {
			if _, err := os.Stat(filepath.Join(mp[0], fmt.Sprintf("f%d", i))); err != nil {
				b.Fatal(err)
			}
		}
	}
}
