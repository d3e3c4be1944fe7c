package host_test

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/host"
	"golang.org/x/sys/unix"
)

// AnonResidentBytes counts what a process writes into memory of its own,
// and not the pages of a file it maps and reads (as a VMM's shared memory
// image).
func TestAnonResidentBytes(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "image")
	if err != nil {
		t.Fatal(err)
	}
	const size = 32 << 20
	if _, err := f.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	mapping := func(fd, flags int) []byte {
		b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, flags)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Munmap(b) })
		return b
	}
	file := mapping(int(f.Fd()), unix.MAP_SHARED)
	own := mapping(-1, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	debug.FreeOSMemory() // the Go heap's own ups and downs out of the way first

	pid := os.Getpid()
	before := host.AnonResidentBytes(pid)
	if before <= 0 {
		t.Fatalf("AnonResidentBytes of this process = %d, want > 0", before)
	}
	var sum byte
	for i := 0; i < size; i += 4096 {
		sum += file[i] // read: page cache, shared
	}
	mid := host.AnonResidentBytes(pid)
	for i := 0; i < size; i += 4096 {
		own[i] = 1 // written: anonymous, private
	}
	after := host.AnonResidentBytes(pid)
	if got := (after - mid) >> 20; got < 28 || got > 40 {
		t.Errorf("writing 32 MiB of its own memory added %d MiB, want ~32", got)
	}
	if got := (mid - before) >> 20; got > 8 {
		t.Errorf("reading a 32 MiB file mapping added %d MiB (sum %d), want ~0: file pages are shared", got, sum)
	}
	if host.AnonResidentBytes(-1) != 0 {
		t.Error("AnonResidentBytes of no process is not 0")
	}
}
