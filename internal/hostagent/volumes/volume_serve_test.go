package volumes_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/volproto"
	"github.com/pandastack/pandastack/internal/hostagent/volumes"
)

// testSpace is a Space with a fixed limit.
type testSpace struct {
	mu          sync.Mutex
	used, limit int64
}

func (s *testSpace) Reserve(n int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used+n > s.limit {
		return syscall.ENOSPC
	}
	s.used += n
	return nil
}

func (s *testSpace) Release(n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used -= n
}

func (s *testSpace) Used() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

func (s *testSpace) Limit() int64 { return s.limit }

// served is a volume directory served by volumes.Serve to a volproto
// client, as the guest's file system uses it.
type served struct {
	dir   string
	space *testSpace
	c     *volproto.Client
}

// serve serves a new temp dir as mount "rw" (limit bytes) and the same
// dir read-only as mount "ro".
func serve(t *testing.T, limit int64) *served {
	t.Helper()
	dir := t.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	s := &served{dir: dir, space: &testSpace{limit: limit}, c: volproto.NewClient()}
	g, h := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() {
		done <- volumes.Serve(ctx, h, []volumes.Mount{
			{Tag: "rw", Root: root, Space: s.space},
			{Tag: "ro", Root: root, Space: s.space, ReadOnly: true},
		})
	}()
	go func() { done <- s.c.Serve(g) }()
	t.Cleanup(func() {
		cancel()
		g.Close()
		<-done
		<-done
	})
	return s
}

// do sends req to mount "rw" (unless it names one) and returns the answer.
func (s *served) do(t *testing.T, req volproto.Request) *volproto.Response {
	t.Helper()
	if req.Tag == "" {
		req.Tag = "rw"
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := s.c.Do(ctx, &req)
	if err != nil {
		t.Fatalf("%v %q: %v", req.Op, req.Path, err)
	}
	return r
}

// ok is do, failing the test unless the answer succeeded.
func (s *served) ok(t *testing.T, req volproto.Request) *volproto.Response {
	t.Helper()
	r := s.do(t, req)
	if r.Errno != 0 {
		t.Fatalf("%v %q: %v", req.Op, req.Path, r.Errno)
	}
	return r
}

// errno is do, failing the test unless the answer is want.
func (s *served) errno(t *testing.T, want syscall.Errno, req volproto.Request) {
	t.Helper()
	if r := s.do(t, req); r.Errno != want {
		t.Errorf("%v %q %q: errno %v, want %v", req.Op, req.Path, req.Path2, r.Errno, want)
	}
}

func TestVolumeServeFiles(t *testing.T) {
	s := serve(t, 1<<20)
	s.ok(t, volproto.Request{Op: volproto.OpMkdir, Path: "d", Mode: 0o755})
	a := s.ok(t, volproto.Request{Op: volproto.OpCreate, Path: "d/f", Mode: 0o640, Flags: volproto.FlagExclusive})
	if !a.HasAttr || a.Attr.Mode != syscall.S_IFREG|0o640 {
		t.Errorf("create: attr %+v, want a regular file of mode 0640", a.Attr)
	}
	w := s.ok(t, volproto.Request{Op: volproto.OpWrite, Path: "d/f", Offset: 3, Data: []byte("hello")})
	if w.N != 5 || w.Attr.Size != 8 {
		t.Errorf("write: n %d size %d, want 5, 8", w.N, w.Attr.Size)
	}
	r := s.ok(t, volproto.Request{Op: volproto.OpRead, Path: "d/f", Offset: 2, Size: 100})
	if want := "\x00hello"; string(r.Data) != want {
		t.Errorf("read: %q, want %q", r.Data, want)
	}
	if got, _ := os.ReadFile(filepath.Join(s.dir, "d/f")); string(got) != "\x00\x00\x00hello" {
		t.Errorf("host file: %q", got)
	}
	if used := s.space.Used(); used != 2*volumes.BlockSize {
		t.Errorf("used %d, want %d (a directory and a 4 KiB block)", used, 2*volumes.BlockSize)
	}
	s.ok(t, volproto.Request{Op: volproto.OpSetattr, Path: "d/f", Flags: volproto.SetSize, Offset: 2})
	if fi, _ := os.Stat(filepath.Join(s.dir, "d/f")); fi.Size() != 2 {
		t.Errorf("size after truncate: %d, want 2", fi.Size())
	}
	s.ok(t, volproto.Request{Op: volproto.OpSymlink, Path: "d/l", Path2: "../../../etc/passwd"})
	if l := s.ok(t, volproto.Request{Op: volproto.OpReadlink, Path: "d/l"}); string(l.Data) != "../../../etc/passwd" {
		t.Errorf("readlink: %q", l.Data)
	}
	s.ok(t, volproto.Request{Op: volproto.OpRename, Path: "d/f", Path2: "g"})
	s.errno(t, syscall.EEXIST, volproto.Request{Op: volproto.OpRename, Path: "g", Path2: "d/l", Flags: volproto.FlagNoReplace})
	s.ok(t, volproto.Request{Op: volproto.OpFsync, Path: "g"})

	// Readdir pages through a directory bigger than one answer.
	for i := range 300 {
		s.ok(t, volproto.Request{Op: volproto.OpCreate, Path: "d/" + string(bytes.Repeat([]byte{'a' + byte(i%26)}, 200)) + string(rune('A'+i/26)), Mode: 0o644})
	}
	names := map[string]bool{}
	var cookie int64
	for pages := 0; ; pages++ {
		r := s.ok(t, volproto.Request{Op: volproto.OpReaddir, Path: "d", Offset: cookie})
		ents, err := volproto.DecodeDirents(r.Data)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			names[e.Name] = true
		}
		if r.M == 0 {
			break
		}
		cookie = r.N
		if pages > 1000 {
			t.Fatal("readdir does not end")
		}
	}
	if len(names) != 301 || !names["l"] {
		t.Errorf("readdir: %d names, want 301 with l", len(names))
	}

	st := s.ok(t, volproto.Request{Op: volproto.OpStatfs})
	if st.N != 1<<20 || st.M != s.space.Used() {
		t.Errorf("statfs: limit %d used %d, want %d, %d", st.N, st.M, 1<<20, s.space.Used())
	}
	s.errno(t, syscall.ENOTEMPTY, volproto.Request{Op: volproto.OpRmdir, Path: "d"})
	s.ok(t, volproto.Request{Op: volproto.OpUnlink, Path: "g"})
	s.errno(t, syscall.ENOENT, volproto.Request{Op: volproto.OpLookup, Path: "g"})
}

// TestVolumeServeRefuses: the guest cannot leave the volume, exceed its
// limit, change a read-only mount, or make setuid files.
func TestVolumeServeRefuses(t *testing.T) {
	s := serve(t, 16*volumes.BlockSize)
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600)
	if err := os.Symlink(outside, filepath.Join(s.dir, "out")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"out/secret", "out"} {
		if r := s.do(t, volproto.Request{Op: volproto.OpRead, Path: p, Size: 10}); r.Errno == 0 {
			t.Errorf("read %s through a symlink out of the volume: %q", p, r.Data)
		}
	}
	s.errno(t, syscall.EACCES, volproto.Request{Op: volproto.OpCreate, Path: "out/new", Mode: 0o644})
	if _, err := os.Stat(filepath.Join(outside, "new")); err == nil {
		t.Error("create through a symlink made a file outside the volume")
	}
	s.errno(t, syscall.EACCES, volproto.Request{Op: volproto.OpRename, Path: "out/secret", Path2: "stolen"})
	// A symlink is not followed by the host when written through.
	s.ok(t, volproto.Request{Op: volproto.OpSymlink, Path: "pw", Path2: "/etc/passwd"})
	if r := s.do(t, volproto.Request{Op: volproto.OpWrite, Path: "pw", Data: []byte("x")}); r.Errno != syscall.ELOOP && r.Errno != syscall.EACCES {
		t.Errorf("write through a symlink: errno %v, want ELOOP or EACCES", r.Errno)
	}
	// Malformed paths end the stream (the decoder refuses them): tested in
	// volproto; a path escaping with ".." cannot be sent.

	// Quota: 16 blocks, 1 used by the symlink "pw" (the pre-made "out" is
	// not accounted: Space is the store's).
	s.ok(t, volproto.Request{Op: volproto.OpCreate, Path: "big", Mode: 0o644})
	s.errno(t, syscall.ENOSPC, volproto.Request{Op: volproto.OpWrite, Path: "big", Data: make([]byte, 16*volumes.BlockSize)})
	if fi, _ := os.Stat(filepath.Join(s.dir, "big")); fi.Size() != 0 {
		t.Errorf("a refused write wrote %d bytes", fi.Size())
	}
	s.errno(t, syscall.ENOSPC, volproto.Request{Op: volproto.OpSetattr, Path: "big", Flags: volproto.SetSize, Offset: 1 << 30})
	s.ok(t, volproto.Request{Op: volproto.OpWrite, Path: "big", Data: make([]byte, 15*volumes.BlockSize)})
	s.errno(t, syscall.ENOSPC, volproto.Request{Op: volproto.OpMkdir, Path: "d", Mode: 0o755})
	s.ok(t, volproto.Request{Op: volproto.OpUnlink, Path: "big"})
	if used := s.space.Used(); used != volumes.BlockSize {
		t.Errorf("used after unlink: %d, want %d", used, volumes.BlockSize)
	}

	// setuid and setgid are stripped.
	a := s.ok(t, volproto.Request{Op: volproto.OpCreate, Path: "suid", Mode: 0o6755})
	if a.Attr.Mode&0o7777 != 0o755 {
		t.Errorf("create mode 6755: got %o, want 755", a.Attr.Mode&0o7777)
	}
	a = s.ok(t, volproto.Request{Op: volproto.OpSetattr, Path: "suid", Flags: volproto.SetMode, Mode: 0o4777})
	if a.Attr.Mode&0o7777 != 0o777 {
		t.Errorf("chmod 4777: got %o, want 777", a.Attr.Mode&0o7777)
	}

	// A read-only mount reads but changes nothing.
	if r := s.ok(t, volproto.Request{Tag: "ro", Op: volproto.OpLookup, Path: "suid"}); !r.HasAttr {
		t.Error("lookup on the read-only mount: no attributes")
	}
	for _, req := range []volproto.Request{
		{Op: volproto.OpWrite, Path: "suid", Data: []byte("x")},
		{Op: volproto.OpCreate, Path: "n", Mode: 0o644},
		{Op: volproto.OpMkdir, Path: "n", Mode: 0o755},
		{Op: volproto.OpUnlink, Path: "suid"},
		{Op: volproto.OpRename, Path: "suid", Path2: "x"},
		{Op: volproto.OpSetattr, Path: "suid", Flags: volproto.SetSize},
		{Op: volproto.OpSymlink, Path: "s", Path2: "x"},
	} {
		req.Tag = "ro"
		s.errno(t, syscall.EROFS, req)
	}
	// An unknown mount.
	s.errno(t, syscall.ESTALE, volproto.Request{Tag: "nope", Op: volproto.OpLookup})
}

// TestVolumeServeRetries: a request re-sent after its stream ended
// (FlagRetry) succeeds where a first attempt that was done makes it fail.
func TestVolumeServeRetries(t *testing.T) {
	s := serve(t, 1<<20)
	// Requests with chosen ids, each on a connection of its own, as a
	// guest re-sends them on a new stream.
	raw := func(req volproto.Request) *volproto.Response {
		t.Helper()
		g, h := net.Pipe()
		root, _ := os.OpenRoot(s.dir)
		defer root.Close()
		go volumes.Serve(context.Background(), h, []volumes.Mount{{Tag: "rw", Root: root, Space: s.space}})
		defer g.Close()
		req.Tag = "rw"
		go g.Write(volproto.AppendRequest(nil, &req))
		body, err := volproto.ReadMessage(g, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := volproto.DecodeResponse(body)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// An exclusive create: the retry of the request that made the file
	// succeeds; another request's fails.
	first := volproto.Request{ID: 77, Op: volproto.OpCreate, Path: "x", Mode: 0o644, Flags: volproto.FlagExclusive}
	if r := raw(first); r.Errno != 0 {
		t.Fatalf("create: %v", r.Errno)
	}
	retry := first
	retry.Flags |= volproto.FlagRetry
	if r := raw(retry); r.Errno != 0 && r.Errno != syscall.EEXIST {
		t.Fatalf("retried create: %v", r.Errno)
	} else if r.Errno == syscall.EEXIST {
		t.Logf("no user xattrs on %s: a retried exclusive create reports EEXIST", s.dir)
	}
	other := retry
	other.ID = 78
	if r := raw(other); r.Errno != syscall.EEXIST {
		t.Errorf("another request's exclusive create of an existing file: %v, want EEXIST", r.Errno)
	}
	// Removals and renames: ENOENT of what the first attempt removed.
	if r := raw(volproto.Request{ID: 79, Op: volproto.OpUnlink, Path: "gone", Flags: volproto.FlagRetry}); r.Errno != 0 {
		t.Errorf("retried unlink of a missing file: %v, want success", r.Errno)
	}
	if r := raw(volproto.Request{ID: 80, Op: volproto.OpUnlink, Path: "gone"}); r.Errno != syscall.ENOENT {
		t.Errorf("unlink of a missing file: %v, want ENOENT", r.Errno)
	}
	if r := raw(volproto.Request{ID: 81, Op: volproto.OpRename, Path: "gone", Path2: "x", Flags: volproto.FlagRetry}); r.Errno != 0 {
		t.Errorf("retried rename whose source is gone and target exists: %v, want success", r.Errno)
	}
	if r := raw(volproto.Request{ID: 82, Op: volproto.OpMkdir, Path: "dir", Mode: 0o755}); r.Errno != 0 {
		t.Fatal(r.Errno)
	}
	if r := raw(volproto.Request{ID: 82, Op: volproto.OpMkdir, Path: "dir", Mode: 0o755, Flags: volproto.FlagRetry}); r.Errno != 0 && r.Errno != syscall.EEXIST {
		t.Errorf("retried mkdir: %v", r.Errno)
	}
}
