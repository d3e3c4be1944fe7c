package lazyrestore

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWriteData: the pages of a buffer that hold data are written, in
// runs; the zero pages stay holes; a short page at the end is written.
func TestWriteData(t *testing.T) {
	b := make([]byte, 5*4096+100)
	for _, p := range []int{0, 1, 4} {
		b[p*4096+7] = byte(p + 1)
	}
	b[5*4096+99] = 9
	path := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(len(b)) + 4096); err != nil {
		t.Fatal(err)
	}
	if err := writeData(f, b, 4096); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(b))
	if _, err := f.ReadAt(got, 4096); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("read back: %v, equal %v", err, bytes.Equal(got, b))
	}
	// Pages 2 and 3 of b (3 and 4 of the file) are a hole.
	if off, err := unix.Seek(int(f.Fd()), 3*4096, unix.SEEK_HOLE); err != nil || off != 3*4096 {
		t.Errorf("SEEK_HOLE from page 3: %d, %v; want a hole there", off, err)
	}
	if off, err := unix.Seek(int(f.Fd()), 3*4096, unix.SEEK_DATA); err != nil || off != 5*4096 {
		t.Errorf("SEEK_DATA from page 3: %d, %v; want data from page 5", off, err)
	}
}
