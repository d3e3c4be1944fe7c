package volume

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/pandastack/pandastack/internal/testing/testkit"
	"golang.org/x/sys/unix"
)

func TestOpenMountsReflinkImageAndCloses(t *testing.T) {
	testkit.Root(t) // loop-mounts an XFS image
	dir := t.TempDir()
	v, err := Open(context.Background(), dir, Options{ImageSize: 2 << 30})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { v.Close() })
	if err := CheckReflink(dir); err == nil {
		// The test directory itself reflinks (XFS/btrfs host): nothing is mounted.
		if v.Image != "" {
			t.Errorf("got image %q on a reflink-capable directory, want none", v.Image)
		}
	} else if v.Image == "" {
		t.Fatalf("got no image on %s which cannot reflink", dir)
	}
	src := filepath.Join(v.Dir, "src")
	want := bytes.Repeat([]byte("panda"), 100000)
	if err := os.WriteFile(src, want, 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(v.Dir, "dst")
	if err := Clone(src, dst); err != nil {
		t.Fatalf("Clone: %v", err)
	}
	// Writing the clone must not change the original.
	if err := os.WriteFile(dst, []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(src)
	if !bytes.Equal(got, want) {
		t.Errorf("original changed after writing its clone")
	}
	if err := Clone(src, dst); err == nil {
		t.Errorf("Clone onto an existing file: got nil error, want one")
	}
	if err := v.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if m, _ := isMountPoint(v.Dir); m {
		t.Errorf("%s still mounted after Close", v.Dir)
	}
	// Reopen finds the same image and data.
	v2, err := Open(context.Background(), dir, Options{})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer v2.Close()
	if got, _ := os.ReadFile(filepath.Join(v2.Dir, "src")); !bytes.Equal(got, want) {
		t.Errorf("data lost across close and reopen")
	}
}

func TestCloneWithoutReflink(t *testing.T) {
	dir := t.TempDir()
	if CheckReflink(dir) == nil {
		t.Skip("the temp directory supports reflink; nothing to test here")
	}
	src := filepath.Join(dir, "a")
	os.WriteFile(src, []byte("x"), 0o644)
	err := Clone(src, filepath.Join(dir, "b"))
	if !errors.Is(err, ErrNoReflink) {
		t.Fatalf("got %v, want ErrNoReflink", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "b")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed clone left its destination behind")
	}
}

func TestUnescapeMount(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`/a/b`, "/a/b"},
		{`/a\040b`, "/a b"},
		{`/x\134y`, `/x\y`},
	} {
		if got := unescapeMount(tc.in); got != tc.want {
			t.Errorf("unescapeMount(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// Writing a page into a reflinked file must allocate about a page, not an
// XFS copy-on-write extent of 128 KiB (see setSmallCoW).
func TestCloneWritesAllocatePages(t *testing.T) {
	testkit.Root(t) // loop-mounts an XFS image
	dir := t.TempDir()
	v, err := Open(context.Background(), dir, Options{ImageSize: 2 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	sub := filepath.Join(v.Dir, "sub") // created after Open: inherits the hint
	os.MkdirAll(sub, 0o755)
	src := filepath.Join(sub, "base")
	if err := os.WriteFile(src, bytes.Repeat([]byte{1}, 64<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(sub, "clone")
	if err := Clone(src, dst); err != nil {
		t.Fatal(err)
	}
	unix.Sync()
	before := testkit.FreeBytes(t, v.Dir)
	f, err := os.OpenFile(dst, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	page := bytes.Repeat([]byte{2}, 4096)
	for i := int64(0); i < 32; i++ {
		if _, err := f.WriteAt(page, i*(2<<20)); err != nil { // 32 pages, 2 MiB apart
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	unix.Sync()
	used := before - testkit.FreeBytes(t, v.Dir)
	t.Logf("32 scattered page writes into a clone allocated %d KiB", used>>10)
	if used > 1<<20 {
		t.Errorf("32 page writes allocated %d KiB, want about 128 KiB", used>>10)
	}
}
