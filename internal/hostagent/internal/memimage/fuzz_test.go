package memimage

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FuzzScanWrite maps a file MAP_PRIVATE in this process, as QEMU maps
// guest RAM, lets the input read and write its pages (each pair of bytes
// is one access: a page number and, if odd, a byte to write), and checks
// the memory image made from it against what was done: Scan's dirty runs
// are exactly the pages written, in order, merged, inside the mapping;
// the resident and dirty bytes never exceed the mapping; and Write's image
// is byte for byte what the mapping holds (the base patched with the
// runs). The kernel's page map is the input Scan decodes; the fuzzer
// drives it through the accesses.
func FuzzScanWrite(f *testing.F) {
	f.Add(uint8(16), []byte{0, 0, 1, 1, 2, 3, 5, 9})
	f.Add(uint8(64), []byte{3, 0xee, 4, 0xee, 5, 0xee, 63, 1, 0, 0, 1, 0})
	f.Add(uint8(1), []byte{0, 1})
	f.Add(uint8(0), []byte{})
	f.Add(uint8(40), []byte{10, 2, 20, 3, 11, 5, 12, 7, 39, 9, 38, 11, 37, 13, 30, 0})
	dir := f.TempDir()
	base := filepath.Join(dir, "base")
	img := filepath.Join(dir, "image")
	f.Fuzz(func(t *testing.T, npages uint8, ops []byte) {
		pages := int(npages)%64 + 1
		content := make([]byte, pages*PageSize)
		for i := range content {
			content[i] = byte(i/PageSize) ^ byte(i)
		}
		if err := os.WriteFile(base, content, 0o600); err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Open(base, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		mem, err := unix.Mmap(fd, 0, len(content), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
		unix.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(mem)

		written := map[int]bool{}
		var sum byte
		for i := 0; i+1 < len(ops); i += 2 {
			p := int(ops[i]) % pages
			if ops[i+1]&1 == 0 {
				sum += mem[p*PageSize+int(ops[i+1])%PageSize]
				continue
			}
			mem[p*PageSize+int(ops[i+1])*13%PageSize] = ops[i+1]
			written[p] = true
		}
		sink += sum

		r := Region{PID: os.Getpid(), Start: uint64(uintptr(unsafe.Pointer(&mem[0]))), Size: uint64(len(mem))}
		m, err := Scan(r)
		if err != nil {
			t.Fatal(err)
		}
		var want []Run
		for p := range pages {
			if written[p] {
				want = appendPage(want, int64(p)*PageSize)
			}
		}
		if !slices.Equal(m.Dirty, want) {
			t.Fatalf("Scan found dirty runs %v, want %v (pages written: %v)", m.Dirty, want, written)
		}
		if m.DirtyBytes != int64(len(written))*PageSize {
			t.Fatalf("DirtyBytes = %d, want %d", m.DirtyBytes, len(written)*PageSize)
		}
		if m.DirtyBytes+m.ResidentBytes > int64(len(mem)) || m.ResidentBytes < 0 {
			t.Fatalf("dirty %d + resident %d bytes of a %d-byte mapping", m.DirtyBytes, m.ResidentBytes, len(mem))
		}
		for i, run := range m.Dirty {
			if run.Len <= 0 || run.Off%PageSize != 0 || run.Len%PageSize != 0 || run.Off+run.Len > int64(len(mem)) ||
				i > 0 && run.Off <= m.Dirty[i-1].Off+m.Dirty[i-1].Len {
				t.Fatalf("run %d of %v: not page-aligned, inside the mapping, in order and merged", i, m.Dirty)
			}
		}

		os.Remove(img)
		n, err := Write(img, base, copyFile, r, m.Dirty)
		if err != nil {
			t.Fatal(err)
		}
		if n != m.DirtyBytes {
			t.Fatalf("Write copied %d bytes, want the %d dirty ones", n, m.DirtyBytes)
		}
		got, err := os.ReadFile(img)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, mem) {
			t.Fatal("the image Write made differs from the mapping")
		}
	})
}
