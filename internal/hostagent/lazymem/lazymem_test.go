package lazymem

import (
	"bytes"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"github.com/pandastack/pandastack/internal/storage/objstore"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	"golang.org/x/sys/unix"
)

// TestMain: the test binary is the holder process of the tests that use
// one (Config.Holder).
func TestMain(m *testing.M) {
	HolderMain()
	os.Exit(m.Run())
}

func TestName(t *testing.T) {
	for _, set := range []string{"snapshots/abc", "paused/x1", "a%b", "with space"} {
		got, ok := setOf(Name(set))
		if !ok || got != set {
			t.Errorf("setOf(Name(%q)) = %q, %v", set, got, ok)
		}
		if strings.Contains(Name(set), "/") {
			t.Errorf("Name(%q) = %q has a slash", set, Name(set))
		}
	}
	for _, bad := range []string{"", ".mem", "abc", "a/b.mem", "snapshots/abc.mem", "%zz.mem"} {
		if s, ok := setOf(bad); ok {
			t.Errorf("setOf(%q) = %q, want no set", bad, s)
		}
	}
}

func TestFetchOrder(t *testing.T) {
	stored := []bool{true, false, true, true, false, true}
	for _, tc := range []struct {
		name     string
		prefetch []int
		all      bool
		want     []int
	}{
		{"nothing", nil, false, nil},
		{"prefetch only, zero and bad chunks dropped", []int{3, 1, 3, -1, 9, 0}, false, []int{3, 0}},
		{"all after prefetch", []int{5, 2}, true, []int{5, 2, 0, 3}},
		{"all", nil, true, []int{0, 2, 3, 5}},
	} {
		got := fetchOrder(&Image{Stored: stored, Prefetch: tc.prefetch, FetchAll: tc.all}, len(stored))
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSeekData(t *testing.T) {
	fi := fileInfo{Size: 45, ChunkSize: 10, Stored: []bool{false, true, true, false, true}}
	for _, tc := range []struct {
		off  int64
		data bool
		want int64
		ok   bool
	}{
		{0, true, 10, true}, {12, true, 12, true}, {25, true, 25, true}, {35, true, 40, true}, {44, true, 44, true}, {45, true, 0, false},
		{0, false, 0, true}, {10, false, 30, true}, {41, false, 45, true}, {-1, false, 0, false},
	} {
		got, ok := seekData(fi, tc.off, tc.data)
		if got != tc.want || ok != tc.ok {
			t.Errorf("seekData(%d, data=%v) = %d, %v; want %d, %v", tc.off, tc.data, got, ok, tc.want, tc.ok)
		}
	}
}

// memSource is a Source over bytes that counts reads per chunk; its
// first fail reads fail (unavailable).
type memSource struct {
	b     []byte
	csize int64
	mu    sync.Mutex
	reads map[int64]int
	fail  int
}

func (m *memSource) Size() int64 { return int64(len(m.b)) }
func (m *memSource) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	m.mu.Lock()
	m.reads[off/m.csize]++
	failing := m.fail > 0
	if failing {
		m.fail--
	}
	m.mu.Unlock()
	if failing {
		return 0, fmt.Errorf("fetch: %w", objstore.ErrUnavailable)
	}
	if off >= int64(len(m.b)) {
		return 0, io.EOF
	}
	n := copy(p, m.b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (m *memSource) readsOf(i int64) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reads[i]
}

func needRoot(t *testing.T) {
	t.Helper()
	testkit.Root(t) // mounting FUSE
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Fatalf("no /dev/fuse: %v", err)
	}
}

// mountT mounts an FS at a temporary directory, unmounted at cleanup.
func mountT(t *testing.T, resolve Resolver) *FS {
	t.Helper()
	return mountCfg(t, Config{Dir: filepath.Join(t.TempDir(), "mnt"), Resolve: resolve})
}

// mountCfg mounts an FS with cfg, closed at cleanup: nothing may be left
// mounted, and no holder process running.
func mountCfg(t *testing.T, cfg Config) *FS {
	t.Helper()
	f, err := Mount(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var pid int
		if h := f.link(); h != nil {
			pid = h.pid
		}
		if err := f.Close(); err != nil {
			t.Error(err)
		}
		if testkit.Mounted(cfg.Dir) {
			t.Errorf("%s still mounted after Close", cfg.Dir)
			unix.Unmount(cfg.Dir, unix.MNT_DETACH)
		}
		if pid > 0 && unix.Kill(pid, 0) == nil {
			t.Errorf("holder %d runs on after Close", pid)
			unix.Kill(pid, unix.SIGKILL)
		}
		if left := HolderPIDs(filepath.Dir(cfg.Dir)); len(left) > 0 {
			t.Errorf("holders %v run on after Close", left)
		}
	})
	return f
}

// testBinary is this test binary: the holder of the tests that use one.
func testBinary(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// TestFileThroughFUSE: what QEMU and the agent do to a lazy file, served
// by this process and by a holder process.
func TestFileThroughFUSE(t *testing.T) {
	needRoot(t)
	t.Run("in-process", func(t *testing.T) { testFileThroughFUSE(t, "") })
	t.Run("holder", func(t *testing.T) { testFileThroughFUSE(t, testBinary(t)) })
}

func testFileThroughFUSE(t *testing.T, holder string) {
	const csize = 64 << 10
	src := &memSource{b: make([]byte, 8*csize+4096), csize: csize, reads: map[int64]int{}}
	for i := range src.b {
		src.b[i] = byte(i * 7 / 4096)
	}
	var recorded chan []int = make(chan []int, 1)
	f := mountCfg(t, Config{Dir: filepath.Join(t.TempDir(), "mnt"), Holder: holder, Resolve: func(ctx context.Context, name string) (*Image, error) {
		if name != "snapshots/abc" {
			return nil, fmt.Errorf("no set %s: %w", name, os.ErrNotExist)
		}
		return &Image{Source: src, ChunkSize: csize, RecordFor: 200 * time.Millisecond,
			OnRecorded: func(c []int) { recorded <- c }}, nil
	}})
	if _, err := os.Stat(f.Path("snapshots/nope")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stat of an unknown set: %v, want not exist", err)
	}
	p := f.Path("snapshots/abc")
	// What QEMU 7.2 does: open O_RDWR, map private, write to the mapping.
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open O_RDWR: %v", err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Size != int64(len(src.b)) {
		t.Fatalf("fstat: size %d, %v; want %d", st.Size, err, len(src.b))
	}
	if st.Ino != inoOf("snapshots/abc") {
		t.Errorf("inode %d, want %d", st.Ino, inoOf("snapshots/abc"))
	}
	off := 5*csize + 100
	// A process must not map a file its own FUSE server serves: a page
	// fault blocks its thread without giving up the Go scheduler's P, so
	// a stop-the-world (GC) waits for it while the fault waits for the
	// server, forever. The agent never maps these files (QEMU does, in
	// its own process); this test maps them only when a holder process
	// serves them.
	if holder != "" {
		mem, err := unix.Mmap(fd, 0, len(src.b), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
		if err != nil {
			t.Fatalf("mmap private: %v", err)
		}
		defer unix.Munmap(mem)
		// The driver finds guest RAM by the inode /proc/PID/maps shows:
		// it must be the one stat gives.
		if ino := mappedIno(t, p); ino != st.Ino {
			t.Errorf("maps shows inode %d, fstat %d", ino, st.Ino)
		}
		if mem[off] != src.b[off] {
			t.Errorf("mapped byte %d: %d, want %d", off, mem[off], src.b[off])
		}
		mem[off] = ^src.b[off] // a private copy of the page
	} else {
		b := make([]byte, 1)
		if _, err := unix.Pread(fd, b, int64(off)); err != nil || b[0] != src.b[off] {
			t.Errorf("byte %d: %d, %v; want %d", off, b[0], err, src.b[off])
		}
	}
	if _, err := unix.Pwrite(fd, []byte{1}, 0); !errors.Is(err, unix.EROFS) {
		t.Errorf("pwrite: %v, want EROFS", err)
	}
	if err := unix.Ftruncate(fd, 10); !errors.Is(err, unix.EROFS) {
		t.Errorf("ftruncate: %v, want EROFS", err)
	}
	if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096); err == nil {
		t.Errorf("punch hole succeeded")
	}
	got := make([]byte, 4096)
	if off, err := unix.Seek(fd, 0, unix.SEEK_DATA); err != nil || off != 0 {
		t.Errorf("SEEK_DATA of a file without holes: %d, %v", off, err)
	}
	if _, err := unix.Pread(fd, got, int64(off)&^4095); err != nil || !bytes.Equal(got, src.b[off&^4095:off&^4095+4096]) {
		t.Errorf("pread after a private write: the file changed (%v)", err)
	}
	// chown/chmod as the agent does to give the file to a machine's group.
	if err := os.Chown(p, -1, 4242); err != nil {
		t.Errorf("chown: %v", err)
	}
	if err := os.Chmod(p, 0o660); err != nil {
		t.Errorf("chmod: %v", err)
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o660 || fi.Sys().(*syscall.Stat_t).Gid != 4242 {
		t.Errorf("after chown/chmod: %v, %v", fi.Mode(), err)
	}
	// Only the chunks touched were read; the file's page cache outlives
	// a close and a new open (keep_cache): no new reads.
	if n := src.readsOf(0); n != 0 && !slices.Contains(f.Touched("snapshots/abc"), 0) {
		t.Errorf("chunk 0 read %d times but not recorded", n)
	}
	before := src.readsOf(5)
	fd2, err := unix.Open(p, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.Pread(fd2, got, int64(off)&^4095)
	unix.Close(fd2)
	if after := src.readsOf(5); after != before {
		t.Errorf("reading a cached page again after a new open: %d reads of its chunk, want %d", after, before)
	}
	select {
	case c := <-recorded:
		// The fault may read ahead (and around) the page.
		if !slices.Contains(c, 5) || len(c) > 3 {
			t.Errorf("recorded %v, want chunk 5 and its neighbours at most", c)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("no working set recorded")
	}
	st2, _ := f.Stats("snapshots/abc")
	if st2.ChunksTouched == 0 || st2.ChunksTouched >= 9 || st2.BytesRead == 0 || st2.PagesRead == 0 || int64(st2.PagesRead)*4096 > st2.BytesRead {
		t.Errorf("stats %+v: want some, not all, chunks touched", st2)
	}
}

// TestStoreImages: a set in a chunkstore (directory store) served lazily:
// content as uploaded, only touched chunks fetched, working set recorded
// and then prefetched by a second FS.
func TestStoreImages(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	objs, err := objstore.OpenDir(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	const csize = 256 << 10
	up, err := chunkstore.New(objs, chunkstore.Config{ChunkSize: csize})
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "set")
	os.MkdirAll(src, 0o700)
	content := make([]byte, 32*csize)
	for i := range content {
		if (i/csize)%4 != 3 { // every fourth chunk zero
			content[i] = byte(i/4096 + i/csize)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "vm.mem"), content, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := up.Upload(ctx, "snapshots/s1", map[string]string{"vm.mem": filepath.Join(src, "vm.mem")}, nil); err != nil {
		t.Fatal(err)
	}
	open := func(recordFor time.Duration) (*FS, *chunkstore.Cache) {
		cache, err := chunkstore.OpenCache(filepath.Join(t.TempDir(), "cache"))
		if err != nil {
			t.Fatal(err)
		}
		cs, err := chunkstore.New(objs, chunkstore.Config{Cache: cache})
		if err != nil {
			t.Fatal(err)
		}
		si := &StoreImages{Chunks: cs, Objects: objs, File: "vm.mem", RecordFor: recordFor}
		return mountT(t, si.Resolve), cache
	}
	f, cache := open(0)
	b, err := os.ReadFile(f.Path("snapshots/s1"))
	if err != nil || !bytes.Equal(b, content) {
		t.Fatalf("whole file through the mount differs from the upload (%v)", err)
	}
	if got, want := cache.Stats().Fetches, int64(24); got != want {
		t.Errorf("reading it all fetched %d chunks, want %d (zero chunks are not fetched)", got, want)
	}

	// A second host: reads two chunks; records them.
	f2, cache2 := open(100 * time.Millisecond)
	fd, err := os.Open(f2.Path("snapshots/s1"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	fd.ReadAt(buf, 9*csize+8192)
	fd.ReadAt(buf, 2*csize)
	fd.Close()
	if got := cache2.Stats().Fetches; got != 2 {
		t.Errorf("two reads fetched %d chunks, want 2", got)
	}
	var ws WorkingSet
	deadline := time.Now().Add(5 * time.Second)
	for {
		ws, err = LoadWorkingSet(ctx, objs, "snapshots/s1")
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || !slices.Equal(ws.Chunks, []int{9, 2}) || ws.ChunkSize != csize {
		t.Fatalf("working set %+v, %v; want chunks [9 2]", ws, err)
	}

	// FetchAll (before the set leaves the store) gets the rest.
	if err := f2.FetchAll(ctx, "snapshots/s1"); err != nil {
		t.Fatal(err)
	}
	if got := cache2.Stats().Fetches; got != 24 {
		t.Errorf("after FetchAll: %d chunks fetched, want 24", got)
	}
	if err := f2.FetchAll(ctx, "snapshots/none"); err != nil {
		t.Errorf("FetchAll of a set never looked up: %v", err)
	}

	// A third host prefetches them at lookup, before any read.
	f3, cache3 := open(100 * time.Millisecond)
	if _, err := os.Stat(f3.Path("snapshots/s1")); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for cache3.Stats().Fetches < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st, _ := f3.Stats("snapshots/s1"); st.Prefetched != 2 || cache3.Stats().Fetches != 2 {
		t.Errorf("prefetch: %+v, %d fetches; want 2", st, cache3.Stats().Fetches)
	}
}

func mappedIno(t *testing.T, path string) uint64 {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 6 && f[5] == path {
			var ino uint64
			fmt.Sscan(f[4], &ino)
			return ino
		}
	}
	t.Fatalf("no mapping of %s", path)
	return 0
}

// TestFetchAllWaitsForQuiet: the background fetch of the rest starts only
// once machines read the file, and then when they pause.
func TestFetchAllWaitsForQuiet(t *testing.T) {
	needRoot(t)
	const csize = 64 << 10
	src := &memSource{b: make([]byte, 8*csize), csize: csize, reads: map[int64]int{}}
	f := mountT(t, func(ctx context.Context, name string) (*Image, error) {
		return &Image{Source: src, ChunkSize: csize, FetchAll: true}, nil
	})
	p := f.Path("paused/x")
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * quietFor)
	if st, _ := f.Stats("paused/x"); st.Prefetched != 0 {
		t.Errorf("%d chunks fetched before any read", st.Prefetched)
	}
	fd, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	fd.ReadAt(make([]byte, 1), 0)
	fd.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, _ := f.Stats("paused/x")
		if st.Prefetched == 8 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a read: %d of 8 chunks fetched", st.Prefetched)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReadRetries: a read the store fails is retried (the machine's vCPU
// waits) until RetryFor; then it fails (EIO).
func TestReadRetries(t *testing.T) {
	needRoot(t)
	const csize = 64 << 10
	src := &memSource{b: bytes.Repeat([]byte{7}, 4*csize), csize: csize, reads: map[int64]int{}, fail: 3}
	dir := filepath.Join(t.TempDir(), "mnt")
	f, err := Mount(Config{Dir: dir, RetryFor: 2 * time.Second, Resolve: func(ctx context.Context, name string) (*Image, error) {
		return &Image{Source: src, ChunkSize: csize}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 4096)
	fd, err := os.Open(f.Path("x"))
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	if _, err := fd.ReadAt(b, 0); err != nil || b[0] != 7 {
		t.Errorf("read after 3 failures: %v, %d", err, b[0])
	}
	if st, _ := f.Stats("x"); st.SourceBytes != csize {
		t.Errorf("after a read of chunk 0: %d bytes from the source, want %d", st.SourceBytes, csize)
	}
	src.mu.Lock()
	src.fail = 1000
	src.mu.Unlock()
	t0 := time.Now()
	if _, err := fd.ReadAt(b, 2*csize); !errors.Is(err, syscall.EIO) {
		t.Errorf("read of a store down for good: %v, want EIO", err)
	}
	if d := time.Since(t0); d < time.Second || d > 10*time.Second {
		t.Errorf("gave up after %v, want about RetryFor (2 s)", d)
	}
	if st, _ := f.Stats("x"); st.SourceBytes != csize {
		t.Errorf("after a failed read: %d bytes from the source, want still %d", st.SourceBytes, csize)
	}
}

// TestLocalChunks: chunks this host holds (Image.Local) are read from
// there, never from the Source, and never fetched in the background.
func TestLocalChunks(t *testing.T) {
	needRoot(t)
	const csize = 64 << 10
	src := &memSource{b: bytes.Repeat([]byte{1}, 4*csize), csize: csize, reads: map[int64]int{}}
	seed := bytes.Repeat([]byte{9}, 2*csize)
	closed := make(chan struct{})
	f := mountT(t, func(ctx context.Context, name string) (*Image, error) {
		return &Image{Source: src, ChunkSize: csize, FetchAll: true,
			Local: map[int]LocalChunk{2: {File: bytes.NewReader(seed), Off: csize}},
			Close: func() { close(closed) }}, nil
	})
	b, err := os.ReadFile(f.Path("x"))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []byte{1, 1, 9, 1} {
		if got := b[i*csize : (i+1)*csize]; !bytes.Equal(got, bytes.Repeat([]byte{want}, csize)) {
			t.Errorf("chunk %d: not all %d", i, want)
		}
	}
	// The background fetch of the other three chunks ends.
	testkit.Poll(10*time.Second, func() bool { st, _ := f.Stats("x"); return st.Prefetched == 3 })
	if n := src.readsOf(2); n != 0 {
		t.Errorf("the local chunk was read %d times from the source", n)
	}
	if st, _ := f.Stats("x"); st.LocalBytes != csize || st.Prefetched != 3 || st.SourceBytes != 3*csize {
		t.Errorf("stats %+v: want %d bytes local, 3 chunks fetched in the background, %d bytes from the source", st, csize, 3*csize)
	}
	if got := fetchOrder(&Image{Local: map[int]LocalChunk{1: {}}, FetchAll: true, Prefetch: []int{1, 3}}, 4); !slices.Equal(got, []int{3, 0, 2}) {
		t.Errorf("fetch order with chunk 1 local: %v, want [3 0 2]", got)
	}
	f.Close()
	select {
	case <-closed:
	default:
		t.Errorf("Image.Close not called by Close")
	}
}

// TestDeviceNotInherited: a process started after the mount (a VMM) does
// not inherit the FUSE connection's descriptor: it could otherwise read
// and answer the requests for every memory file, and the connection
// would outlive the agent.
func TestDeviceNotInherited(t *testing.T) {
	needRoot(t)
	mountT(t, func(context.Context, string) (*Image, error) { return nil, os.ErrNotExist })
	out, err := exec.Command("ls", "-l", "/proc/self/fd/").CombinedOutput()
	if err != nil {
		t.Fatalf("ls: %v: %s", err, out)
	}
	if strings.Contains(string(out), "/dev/fuse") {
		t.Errorf("a child process holds /dev/fuse:\n%s", out)
	}
}

// holderSource is a file of 8 chunks of 64 KiB, chunk i all byte i+1,
// served by a Config whose holder is this test binary.
func holderSource(t *testing.T) (*memSource, Config) {
	const csize = 64 << 10
	src := &memSource{csize: csize, reads: map[int64]int{}}
	for i := range 8 {
		src.b = append(src.b, bytes.Repeat([]byte{byte(i + 1)}, csize)...)
	}
	return src, Config{Dir: filepath.Join(t.TempDir(), "mnt"), Holder: testBinary(t), Resolve: func(ctx context.Context, name string) (*Image, error) {
		return &Image{Source: src, ChunkSize: csize}, nil
	}}
}

// TestHolderOutlivesFS: with a holder process, a file stays open and
// readable across FSes (agents): a read made while none is attached
// waits, and the next FS to attach serves it.
func TestHolderOutlivesFS(t *testing.T) {
	needRoot(t)
	src, cfg := holderSource(t)
	cfg.AgentWait = time.Minute
	f1, err := Mount(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !f1.Held() {
		t.Fatal("an FS with a holder: not held")
	}
	pid := f1.link().pid
	if got := HolderPIDs(filepath.Dir(cfg.Dir)); !slices.Equal(got, []int{pid}) {
		t.Errorf("HolderPIDs of the mount's directory: %v, want [%d]", got, pid)
	}
	fd, err := os.Open(f1.Path("x"))
	if err != nil {
		f1.Close()
		t.Fatal(err)
	}
	defer fd.Close()
	b := make([]byte, 4096)
	if _, err := fd.ReadAt(b, 64<<10); err != nil || b[0] != 2 {
		t.Fatalf("read of chunk 1: %d, %v", b[0], err)
	}
	if err := f1.Leave(); err != nil {
		t.Fatal(err)
	}
	if !testkit.Mounted(cfg.Dir) || unix.Kill(pid, 0) != nil {
		t.Fatalf("after Leave: mounted %v, holder %d alive %v; want both", testkit.Mounted(cfg.Dir), pid, unix.Kill(pid, 0) == nil)
	}
	// A read while no FS is attached: it waits for the next.
	type result struct {
		b   byte
		err error
	}
	got := make(chan result, 1)
	go func() {
		b := make([]byte, 4096)
		_, err := fd.ReadAt(b, 5*64<<10)
		got <- result{b[0], err}
	}()
	reads := src.readsOf(5)
	f2 := mountCfg(t, cfg)
	if f2.link().pid != pid {
		t.Errorf("the second FS linked to holder %d, want the running one %d", f2.link().pid, pid)
	}
	if r := <-got; r.err != nil || r.b != 6 {
		t.Errorf("the read made while no FS was attached: %d, %v; want 6", r.b, r.err)
	}
	if src.readsOf(5) == reads {
		t.Errorf("chunk 5 was not read from the source after the second FS attached")
	}
	// The second FS knows the file the first looked up (from the
	// holder's hello), before any read of its own.
	if _, ok := f2.Stats("x"); !ok {
		t.Errorf("the second FS has no stats of the held file")
	}
	if _, err := fd.ReadAt(b, 64<<10); err != nil || b[0] != 2 {
		t.Errorf("read of chunk 1 again: %d, %v", b[0], err)
	}
}

// TestHolderWaitsBounded: a read while no FS is attached fails (EIO)
// once Config.AgentWait has passed; and a holder with no FS and no file
// open unmounts and exits after Config.HolderIdle.
func TestHolderWaitsBounded(t *testing.T) {
	needRoot(t)
	_, cfg := holderSource(t)
	cfg.AgentWait, cfg.HolderIdle = time.Second, time.Second
	f, err := Mount(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pid := f.link().pid
	fd, err := os.Open(f.Path("x"))
	if err != nil {
		f.Close()
		t.Fatal(err)
	}
	f.Leave()
	t0 := time.Now()
	if _, err := fd.ReadAt(make([]byte, 4096), 3*64<<10); !errors.Is(err, syscall.EIO) {
		t.Errorf("read with no FS attached past AgentWait: %v, want EIO", err)
	}
	if d := time.Since(t0); d < 900*time.Millisecond || d > 10*time.Second {
		t.Errorf("failed after %v, want about AgentWait (1 s)", d)
	}
	fd.Close()
	deadline := time.Now().Add(20 * time.Second)
	for unix.Kill(pid, 0) == nil || testkit.Mounted(cfg.Dir) {
		if time.Now().After(deadline) {
			unix.Kill(pid, unix.SIGKILL)
			unix.Unmount(cfg.Dir, unix.MNT_DETACH)
			t.Fatalf("holder idle (no FS, no file open): still running or mounted after 20 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(socketOf(cfg.Dir)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the idle holder left its socket: %v", err)
	}
}

// BenchmarkMiss: a page-cache miss of a 2 MiB-chunked file whose chunks
// are in memory (the chunk cache's best case), read 128 KiB at a time as
// the kernel's readahead does, served by this process and by a holder
// process (a round trip over its socket more):
//
//	go test ./internal/lazymem -run XXX -bench Miss -benchtime 2000x
func BenchmarkMiss(b *testing.B) {
	testkit.Root(b) // mounting FUSE
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []struct{ name, holder string }{{"in-process", ""}, {"holder", exe}} {
		b.Run(mode.name, func(b *testing.B) {
			const csize = 2 << 20
			src := &memSource{b: bytes.Repeat([]byte{3}, 256<<20), csize: csize, reads: map[int64]int{}}
			f, err := Mount(Config{Dir: filepath.Join(b.TempDir(), "mnt"), Holder: mode.holder, Resolve: func(ctx context.Context, name string) (*Image, error) {
				return &Image{Source: src, ChunkSize: csize}, nil
			}})
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			fd, err := os.Open(f.Path("x"))
			if err != nil {
				b.Fatal(err)
			}
			defer fd.Close()
			buf := make([]byte, 128<<10)
			pages := int64(len(src.b)) / int64(len(buf))
			b.SetBytes(int64(len(buf)))
			b.ResetTimer()
			for i := range b.N {
				off := (int64(i) % pages) * int64(len(buf))
				if i > 0 && off == 0 {
					b.StopTimer()
					unix.Fadvise(int(fd.Fd()), 0, 0, unix.FADV_DONTNEED)
					b.StartTimer()
				}
				if _, err := fd.ReadAt(buf, off); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestHolderKilled: an FS whose holder died says so (Broken), and a new
// Mount starts another holder over the dead mount.
func TestHolderKilled(t *testing.T) {
	needRoot(t)
	_, cfg := holderSource(t)
	f, err := Mount(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pid := f.link().pid
	if f.Broken() {
		t.Fatal("a new FS is broken")
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !f.Broken() {
		if time.Now().After(deadline) {
			t.Fatal("the holder was killed: the FS is not broken after 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	f.Leave()
	f2 := mountCfg(t, cfg)
	if f2.link().pid == pid {
		t.Fatalf("the new FS linked to the dead holder %d", pid)
	}
	b := make([]byte, 4096)
	fd, err := os.Open(f2.Path("x"))
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	if _, err := fd.ReadAt(b, 2*64<<10); err != nil || b[0] != 3 {
		t.Errorf("read through the new holder: %d, %v; want 3", b[0], err)
	}
}

// locSource is a memSource that is a Locator: each chunk it is asked for
// is written to a file of its own (as the chunk cache does).
type locSource struct {
	*memSource
	dir string
}

func (l *locSource) ChunkPath(ctx context.Context, i int) (string, error) {
	p := filepath.Join(l.dir, fmt.Sprint(i))
	end := min(int64(i+1)*l.csize, int64(len(l.b)))
	return p, os.WriteFile(p, l.b[int64(i)*l.csize:end], 0o600)
}

// TestLayout: where each chunk of a file is: the source's files, a local
// file's offset, nothing for zeros; a source that cannot say is
// unsupported.
func TestLayout(t *testing.T) {
	needRoot(t)
	const csize = 64 << 10
	src := &memSource{b: bytes.Repeat([]byte{5}, 4*csize-4096), csize: csize, reads: map[int64]int{}}
	seed, err := os.Create(filepath.Join(t.TempDir(), "seed"))
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	dir := t.TempDir()
	var locate bool
	f := mountT(t, func(ctx context.Context, name string) (*Image, error) {
		im := &Image{Source: src, ChunkSize: csize, Stored: []bool{true, true, false, true},
			Local: map[int]LocalChunk{1: {File: seed, Off: 3 * csize}}}
		if locate {
			im.Source = &locSource{src, dir}
		}
		return im, nil
	})
	if _, err := f.Layout(ctxT(t), "plain"); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("layout of a file whose source is no Locator: %v, want unsupported", err)
	}
	locate = true
	locs, err := f.Layout(ctxT(t), "located")
	if err != nil {
		t.Fatal(err)
	}
	want := []ChunkLoc{{Path: filepath.Join(dir, "0"), Len: csize}, {File: seed, Off: 3 * csize, Len: csize}, {Len: csize}, {Path: filepath.Join(dir, "3"), Len: csize - 4096}}
	if !slices.Equal(locs, want) {
		t.Errorf("layout:\n%+v\nwant\n%+v", locs, want)
	}
	if st, _ := f.Stats("located"); st.SourceBytes != 2*csize-4096 {
		t.Errorf("after the layout: %d bytes from the source, want %d", st.SourceBytes, 2*csize-4096)
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestHolderRelinks: when the holder drops an FS's link (here: another
// connection took its place), the FS links again, and reads go on.
func TestHolderRelinks(t *testing.T) {
	needRoot(t)
	_, cfg := holderSource(t)
	f := mountCfg(t, cfg)
	first := f.link()
	other, err := net.Dial("unix", socketOf(cfg.Dir))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	deadline := time.Now().Add(10 * time.Second)
	for f.link() == first {
		if time.Now().After(deadline) {
			t.Fatal("the FS did not link again in 10 s after the holder dropped its link")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if f.Broken() || f.link().pid != first.pid {
		t.Errorf("after linking again: broken %v, holder %d, want %d", f.Broken(), f.link().pid, first.pid)
	}
	fd, err := os.Open(f.Path("x"))
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	b := make([]byte, 4096)
	if _, err := fd.ReadAt(b, 6*64<<10); err != nil || b[0] != 7 {
		t.Errorf("read after linking again: %d, %v; want 7", b[0], err)
	}
}

// TestSendThenPeerCloses: a message without data that the holder takes
// and answers by closing the connection (a shutdown: it unmounts, replies
// and exits, fast) is sent, not failed with EPIPE by a write after it.
// Before the fix, send also wrote the empty data, and that write failed
// once the holder had closed: Close then reported a failed shutdown.
func TestSendThenPeerCloses(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := fileConn(t, fds[0])
	peer := fileConn(t, fds[1])
	// The peer closes as soon as the next write (the message) is made,
	// once the encoder has sent its type (as it has on a link in use).
	c := &closingPeer{Conn: conn, peer: peer}
	h := &holder{conn: c, enc: gob.NewEncoder(c)}
	if err := h.send(wireMsg{ID: 0, Op: "reply"}, nil); err != nil {
		t.Fatal(err)
	}
	c.armed.Store(true)
	if err := h.send(wireMsg{ID: 1, Op: "shutdown"}, nil); err != nil {
		t.Errorf("send of a message the peer took and then closed: %v", err)
	}
	// With data, a write after the peer closed still fails.
	if err := h.send(wireMsg{ID: 2, Op: "reply"}, []byte("data")); err == nil {
		t.Errorf("send to a closed peer succeeded")
	}
}

func fileConn(t *testing.T, fd int) net.Conn {
	t.Helper()
	f := os.NewFile(uintptr(fd), "socketpair")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closingPeer closes peer after its first write once armed.
type closingPeer struct {
	net.Conn
	peer  net.Conn
	armed atomic.Bool
	once  sync.Once
}

func (c *closingPeer) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if c.armed.Load() {
		c.once.Do(func() { c.peer.Close() })
	}
	return n, err
}
