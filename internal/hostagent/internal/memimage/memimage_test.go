package memimage

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// copyFile stands in for a reflink clone: same bytes, own blocks.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	out.Close()
	return err
}

// The test process maps a file MAP_PRIVATE, as QEMU maps guest RAM, and
// dirties some pages: Scan must find exactly those, and Write must produce
// the base patched with them.
func TestScanAndWrite(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	const pages = 256
	content := make([]byte, pages*PageSize)
	for i := range content {
		content[i] = byte(i / PageSize)
	}
	if err := os.WriteFile(base, content, 0o644); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(base)
	mem, err := unix.Mmap(int(f.Fd()), 0, len(content), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	// Read some pages (resident, clean), write others (dirty).
	for _, p := range []int{0, 1, 2, 50} {
		sink += mem[p*PageSize]
	}
	dirty := []int{3, 4, 5, 100, 255}
	for _, p := range dirty {
		mem[p*PageSize+7] = 0xEE
	}
	r := Region{PID: os.Getpid(), Start: uint64(uintptr(unsafe.Pointer(&mem[0]))), Size: uint64(len(mem))}
	m, err := Scan(r)
	if err != nil {
		t.Fatal(err)
	}
	want := []Run{{3 * PageSize, 3 * PageSize}, {100 * PageSize, PageSize}, {255 * PageSize, PageSize}}
	if len(m.Dirty) != len(want) || m.DirtyBytes != int64(len(dirty))*PageSize {
		t.Fatalf("dirty runs %v (%d bytes), want %v", m.Dirty, m.DirtyBytes, want)
	}
	for i := range want {
		if m.Dirty[i] != want[i] {
			t.Errorf("run %d: got %v, want %v", i, m.Dirty[i], want[i])
		}
	}
	if m.ResidentBytes < 4*PageSize {
		t.Errorf("resident %d bytes, want at least the 4 pages read", m.ResidentBytes)
	}
	dst := filepath.Join(dir, "capture")
	n, err := Write(dst, base, copyFile, r, m.Dirty)
	if err != nil {
		t.Fatal(err)
	}
	if n != m.DirtyBytes {
		t.Errorf("copied %d bytes, want %d", n, m.DirtyBytes)
	}
	got, _ := os.ReadFile(dst)
	if !bytes.Equal(got, mem) {
		t.Errorf("the capture differs from the process's view of memory")
	}
	if orig, _ := os.ReadFile(base); !bytes.Equal(orig, content) {
		t.Errorf("the base image changed")
	}
}

var sink byte // keeps the test's reads from being optimized away
