package testkit

import (
	"math/rand"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// WriteSparse makes a file of size bytes that holds data only in the
// given [offset, length] ranges (random bytes from seed), holes elsewhere.
func WriteSparse(t testing.TB, path string, size int64, seed int64, ranges ...[2]int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(seed))
	for _, rg := range ranges {
		b := make([]byte, rg[1])
		r.Read(b)
		if _, err := f.WriteAt(b, rg[0]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// MakeSparse is WriteSparse returning the file's contents (for files
// small enough to hold in memory).
func MakeSparse(t testing.TB, path string, size int64, seed int64, ranges ...[2]int64) []byte {
	t.Helper()
	WriteSparse(t, path, size, seed, ranges...)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Allocated is the space path takes on disk, in bytes (its blocks, not
// its size: holes take none).
func Allocated(t testing.TB, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// CopySparse copies src to dst keeping its holes (cp --sparse=always).
func CopySparse(t testing.TB, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "--sparse=always", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("copy %s: %v: %s", src, err, out)
	}
}

// FreeBytes is the space left to unprivileged users on the file system
// holding dir (statfs: available blocks times the block size).
func FreeBytes(t testing.TB, dir string) int64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatalf("statfs %s: %v", dir, err)
	}
	return int64(st.Bavail) * st.Bsize
}
