package volumes

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
)

const (
	volA = "vol_aaaaaaaaaaaaaaaa"
	volB = "vol_bbbbbbbbbbbbbbbb"
	volC = "vol_cccccccccccccccc"
)

func newStore(t *testing.T) (*Store, string) {
	t.Helper()
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, dir
}

func putFile(t *testing.T, s *Store, id, p, data string) {
	t.Helper()
	if n, err := s.WriteFile(id, p, strings.NewReader(data), 0); err != nil || n != int64(len(data)) {
		t.Fatalf("WriteFile(%s, %s) = %d, %v", id, p, n, err)
	}
}

func getFile(t *testing.T, s *Store, id, p string) string {
	t.Helper()
	r, _, err := s.ReadFile(id, p)
	if err != nil {
		t.Fatalf("ReadFile(%s, %s): %v", id, p, err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func used(t *testing.T, s *Store, id string) int64 {
	t.Helper()
	v, err := s.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	return v.UsedBytes
}

func TestVolumeStoreLifecycle(t *testing.T) {
	s, dir := newStore(t)
	if _, err := s.Create("vol_BAD", 1<<20); !errors.Is(err, host.ErrInvalid) {
		t.Errorf("Create(bad id) = %v, want ErrInvalid", err)
	}
	if _, err := s.Create(volA, 0); !errors.Is(err, host.ErrInvalid) {
		t.Errorf("Create(limit 0) = %v, want ErrInvalid", err)
	}
	v, err := s.Create(volA, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if v.ID != volA || v.LimitBytes != 1<<20 || v.UsedBytes != 0 || v.CreatedAt.IsZero() {
		t.Errorf("Create = %+v", v)
	}
	if _, err := s.Create(volA, 1<<20); !errors.Is(err, host.ErrConflict) {
		t.Errorf("Create again = %v, want ErrConflict", err)
	}
	if _, err := s.Create(volB, 2<<20); err != nil {
		t.Fatal(err)
	}
	list, err := s.List()
	if err != nil || len(list) != 2 || list[0].ID != volA || list[1].ID != volB {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if _, err := s.Resize(volA, 1<<19); !errors.Is(err, host.ErrInvalid) {
		t.Errorf("Resize smaller = %v, want ErrInvalid", err)
	}
	if v, err := s.Resize(volA, 4<<20); err != nil || v.LimitBytes != 4<<20 {
		t.Errorf("Resize = %+v, %v", v, err)
	}
	if _, err := s.Get(volC); !errors.Is(err, host.ErrNotFound) {
		t.Errorf("Get(missing) = %v, want ErrNotFound", err)
	}
	putFile(t, s, volA, "/d/f", "hello")
	if err := s.Delete(volA); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(volA); !errors.Is(err, host.ErrNotFound) {
		t.Errorf("Get(deleted) = %v, want ErrNotFound", err)
	}
	if err := s.Delete(volA); !errors.Is(err, host.ErrNotFound) {
		t.Errorf("Delete again = %v, want ErrNotFound", err)
	}
	// A reopened store keeps the limit and counts what is there.
	putFile(t, s, volB, "x", strings.Repeat("y", 5000))
	s.Close()
	s2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if v, err := s2.Get(volB); err != nil || v.LimitBytes != 2<<20 || v.UsedBytes != 2*Block {
		t.Errorf("Get after reopen = %+v, %v; want limit %d, used %d", v, err, 2<<20, 2*Block)
	}
}

func TestVolumeStoreFiles(t *testing.T) {
	s, _ := newStore(t)
	if _, err := s.Create(volA, 1<<20); err != nil {
		t.Fatal(err)
	}
	putFile(t, s, volA, "/a/b/c.txt", "one")
	putFile(t, s, volA, "a/b/c.txt", "two!")
	if got := getFile(t, s, volA, "/a/b/c.txt"); got != "two!" {
		t.Errorf("read = %q, want %q", got, "two!")
	}
	// a, a/b: two directories; c.txt: one block.
	if got, want := used(t, s, volA), int64(3*Block); got != want {
		t.Errorf("used = %d, want %d", got, want)
	}
	fi, err := s.Stat(volA, "/a/b/c.txt")
	if err != nil || fi.Size != 4 || fi.Path != "/a/b/c.txt" || fi.Name != "c.txt" || fi.Mode != 0o644 {
		t.Errorf("Stat = %+v, %v", fi, err)
	}
	if _, err := s.WriteFile(volA, "/s", strings.NewReader("x"), 0o4755); err != nil {
		t.Fatal(err)
	}
	if fi, _ := s.Stat(volA, "/s"); fi.Mode != 0o755 {
		t.Errorf("mode of a file written setuid = %o, want 755", fi.Mode)
	}
	if err := s.Mkdir(volA, "/m/n"); err != nil {
		t.Fatal(err)
	}
	ls, err := s.ListDir(volA, "/")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ls {
		names = append(names, e.Name)
	}
	if got := strings.Join(names, ","); got != "a,m,s" {
		t.Errorf("ListDir(/) = %s, want a,m,s", got)
	}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"read missing", func() error { _, _, err := s.ReadFile(volA, "/nope"); return err }(), guestproto.ErrNotFound},
		{"read dir", func() error { _, _, err := s.ReadFile(volA, "/a"); return err }(), guestproto.ErrIsDir},
		{"list file", func() error { _, err := s.ListDir(volA, "/s"); return err }(), guestproto.ErrNotDir},
		{"write onto dir", func() error { _, err := s.WriteFile(volA, "/a", strings.NewReader("x"), 0); return err }(), guestproto.ErrIsDir},
		{"mkdir over file", s.Mkdir(volA, "/s"), guestproto.ErrExists},
		{"mkdir under file", s.Mkdir(volA, "/s/t"), guestproto.ErrNotDir},
		{"remove non-empty", s.Remove(volA, "/a", false), guestproto.ErrNotEmpty},
		{"remove root", s.Remove(volA, "/", true), host.ErrInvalid},
		{"dotdot", func() error { _, _, err := s.ReadFile(volA, "../meta.json"); return err }(), host.ErrInvalid},
		{"unclean", func() error { _, err := s.Stat(volA, "/a/../a"); return err }(), host.ErrInvalid},
		{"missing volume", func() error { _, err := s.Stat(volB, "/"); return err }(), host.ErrNotFound},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.name, tc.err, tc.want)
		}
	}
	if err := s.Remove(volA, "/a", true); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(volA, "/s", false); err != nil {
		t.Fatal(err)
	}
	if got, want := used(t, s, volA), int64(2*Block); got != want { // m, m/n
		t.Errorf("used after removes = %d, want %d", got, want)
	}
	if err := s.Rename(volA, "/m", "/k"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stat(volA, "/k/n"); err != nil {
		t.Errorf("after rename: %v", err)
	}
}

// TestVolumeStoreConfined: a volume's symlinks, wherever they point, never
// lead the host outside its data directory.
func TestVolumeStoreConfined(t *testing.T) {
	s, dir := newStore(t)
	if _, err := s.Create(volA, 1<<20); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, volA, dataDir)
	secret := filepath.Join(dir, volA, metaFile)
	for name, target := range map[string]string{"root": "/", "up": "..", "meta": "../" + metaFile, "abs": secret} {
		if err := os.Symlink(target, filepath.Join(data, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"/root/etc/passwd", "/up/meta.json", "/meta", "/abs"} {
		if r, _, err := s.ReadFile(volA, p); err == nil {
			b, _ := io.ReadAll(r)
			r.Close()
			t.Errorf("ReadFile(%s) read %d bytes outside the volume", p, len(b))
		}
		if _, err := s.ListDir(volA, p); err == nil {
			t.Errorf("ListDir(%s) listed outside the volume", p)
		}
	}
	if _, err := s.WriteFile(volA, "/up/evil", strings.NewReader("x"), 0); err == nil {
		t.Error("WriteFile through .. symlink succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, volA, "evil")); err == nil {
		t.Error("a write through a symlink landed outside the volume")
	}
	if err := s.Mkdir(volA, "/root/tmp/x"); err == nil {
		t.Error("Mkdir through a symlink to / succeeded")
	}
	// Writing over a symlink replaces the symlink, never its target.
	putFile(t, s, volA, "/meta", "mine")
	if b, _ := os.ReadFile(secret); strings.Contains(string(b), "mine") {
		t.Error("write over a symlink wrote its target")
	}
}

func TestVolumeStoreQuota(t *testing.T) {
	s, _ := newStore(t)
	if _, err := s.Create(volA, 3*Block); err != nil {
		t.Fatal(err)
	}
	putFile(t, s, volA, "/f", "keep")
	_, err := s.WriteFile(volA, "/f", bytes.NewReader(make([]byte, 3*Block)), 0)
	if !errors.Is(err, host.ErrNoSpace) {
		t.Fatalf("write over the limit = %v, want ErrNoSpace", err)
	}
	if got := getFile(t, s, volA, "/f"); got != "keep" {
		t.Errorf("after a refused write f = %q, want %q", got, "keep")
	}
	if got := used(t, s, volA); got != Block {
		t.Errorf("used after a refused write = %d, want %d", got, Block)
	}
	ls, _ := s.ListDir(volA, "/")
	if len(ls) != 1 {
		t.Errorf("a refused write left files: %+v", ls)
	}
	// Exactly the limit fits.
	putFile(t, s, volA, "/g", strings.Repeat("x", 2*Block))
	if err := s.Mkdir(volA, "/d"); !errors.Is(err, host.ErrNoSpace) {
		t.Errorf("mkdir over the limit = %v, want ErrNoSpace", err)
	}
	if _, err := s.Resize(volA, 4*Block); err != nil {
		t.Fatal(err)
	}
	if err := s.Mkdir(volA, "/d"); err != nil {
		t.Errorf("mkdir after growing: %v", err)
	}
}

func TestVolumeSpaceConcurrent(t *testing.T) {
	sp := &space{limit: 100 * Block}
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := sp.Reserve(Block); err == nil {
				mu.Lock()
				ok++
				mu.Unlock()
			} else if !errors.Is(err, syscall.ENOSPC) {
				t.Errorf("Reserve = %v, want ENOSPC", err)
			}
		}()
	}
	wg.Wait()
	if ok != 100 || sp.Used() != 100*Block {
		t.Errorf("reserved %d times, used %d; want 100 and %d", ok, sp.Used(), 100*Block)
	}
}

func TestVolumeBranchPromote(t *testing.T) {
	s, _ := newStore(t)
	if _, err := s.Create(volA, 1<<20); err != nil {
		t.Fatal(err)
	}
	putFile(t, s, volA, "/d/f", "parent")
	root, _, err := s.Open(volA)
	if err != nil {
		t.Fatal(err)
	}
	if err := root.Symlink("d/f", "link"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Branch(volA, volA); !errors.Is(err, host.ErrConflict) {
		t.Errorf("Branch onto itself = %v, want ErrConflict", err)
	}
	v, err := s.Branch(volA, volB)
	if err != nil {
		t.Fatal(err)
	}
	if v.LimitBytes != 1<<20 || v.UsedBytes != used(t, s, volA) {
		t.Errorf("Branch = %+v, want parent's limit and use", v)
	}
	if p, _ := s.Parent(volB); p != volA {
		t.Errorf("Parent = %q, want %q", p, volA)
	}
	if got := getFile(t, s, volB, "/link"); got != "parent" {
		t.Errorf("branch's link reads %q", got)
	}
	if _, err := s.Resize(volB, 2<<20); err != nil {
		t.Fatal(err)
	}
	putFile(t, s, volB, "/d/f", "branch")
	putFile(t, s, volA, "/d/g", "only parent")
	if got := getFile(t, s, volA, "/d/f"); got != "parent" {
		t.Errorf("parent's file after the branch wrote = %q", got)
	}
	if _, err := s.Stat(volB, "/d/g"); !errors.Is(err, guestproto.ErrNotFound) {
		t.Errorf("branch sees the parent's later file: %v", err)
	}
	v, err = s.Promote(volB, volA)
	if err != nil {
		t.Fatal(err)
	}
	if v.ID != volA || v.UsedBytes != 3*Block || v.LimitBytes != 2<<20 {
		t.Errorf("Promote = %+v", v)
	}
	if got := getFile(t, s, volA, "/d/f"); got != "branch" {
		t.Errorf("after promote f = %q, want branch", got)
	}
	if _, err := s.Stat(volA, "/d/g"); !errors.Is(err, guestproto.ErrNotFound) {
		t.Errorf("after promote the parent's own file is still there: %v", err)
	}
	if _, err := s.Get(volB); !errors.Is(err, host.ErrNotFound) {
		t.Errorf("branch after promote: %v, want ErrNotFound", err)
	}
	if _, err := s.Promote(volA, volA); !errors.Is(err, host.ErrInvalid) {
		t.Errorf("Promote onto itself = %v", err)
	}
}
