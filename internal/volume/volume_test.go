package volume

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestOpenMountsReflinkImageAndCloses(t *testing.T) {
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
