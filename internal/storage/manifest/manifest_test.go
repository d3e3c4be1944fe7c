package manifest

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/pandastack/pandastack/internal/testing/testkit"
)

func TestSealVerify(t *testing.T) {
	dir := t.TempDir()
	testkit.WriteSparse(t, filepath.Join(dir, "vm.mem"), 64<<20, 1, [2]int64{0, 4096}, [2]int64{10 << 20, 3 << 20}, [2]int64{(64 << 20) - 100, 100})
	testkit.WriteSparse(t, filepath.Join(dir, "vm.state"), 12345, 2, [2]int64{0, 12345})
	testkit.WriteSparse(t, filepath.Join(dir, "empty"), 0, 3)
	m, err := Seal(dir, "vm.mem", "vm.state", "empty")
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Files) != 3 || m.Files[0].Name != "empty" || m.Files[1].Name != "vm.mem" || m.Files[1].Size != 64<<20 {
		t.Fatalf("manifest = %+v", m)
	}
	if err := Verify(dir); err != nil {
		t.Fatalf("Verify of an intact directory: %v", err)
	}
	if err := Check(dir); err != nil {
		t.Fatalf("Check of an intact directory: %v", err)
	}
}

func TestVerifyFindsCorruption(t *testing.T) {
	tests := []struct {
		name    string
		corrupt func(t *testing.T, dir string)
		check   bool // Check (sizes only) must find it too
	}{
		{"byte flipped in data", func(t *testing.T, dir string) { flip(t, filepath.Join(dir, "vm.mem"), 10<<20+17) }, false},
		{"byte written into a hole", func(t *testing.T, dir string) { flip(t, filepath.Join(dir, "vm.mem"), 40<<20) }, false},
		{"last partial block", func(t *testing.T, dir string) { flip(t, filepath.Join(dir, "vm.state"), 12000) }, false},
		{"truncated", func(t *testing.T, dir string) { os.Truncate(filepath.Join(dir, "vm.mem"), 32<<20) }, true},
		{"missing", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "vm.state")) }, true},
		{"manifest garbled", func(t *testing.T, dir string) { os.WriteFile(filepath.Join(dir, Name), []byte("{nope"), 0o600) }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			testkit.WriteSparse(t, filepath.Join(dir, "vm.mem"), 64<<20, 1, [2]int64{0, 4096}, [2]int64{10 << 20, 3 << 20})
			testkit.WriteSparse(t, filepath.Join(dir, "vm.state"), 12345, 2, [2]int64{0, 12345})
			if _, err := Seal(dir, "vm.mem", "vm.state"); err != nil {
				t.Fatal(err)
			}
			tt.corrupt(t, dir)
			if err := Verify(dir); !errors.Is(err, ErrCorrupt) {
				t.Errorf("Verify = %v, want ErrCorrupt", err)
			}
			if err := Check(dir); tt.check != errors.Is(err, ErrCorrupt) {
				t.Errorf("Check = %v, want corrupt: %v", err, tt.check)
			}
		})
	}
}

func flip(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := []byte{0}
	f.ReadAt(b, off)
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// The hash is the content's: a hole and written zeros hash the same.
func TestSumIgnoresLayout(t *testing.T) {
	dir := t.TempDir()
	sparse, dense := filepath.Join(dir, "sparse"), filepath.Join(dir, "dense")
	testkit.WriteSparse(t, sparse, 8<<20, 7, [2]int64{3 << 20, 1000})
	b, _ := os.ReadFile(sparse)
	if err := os.WriteFile(dense, b, 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := Sum(sparse)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Sum(dense)
	if err != nil {
		t.Fatal(err)
	}
	if a.Sum != d.Sum {
		t.Errorf("sparse %s != dense %s", a.Sum, d.Sum)
	}
	other := filepath.Join(dir, "other")
	testkit.WriteSparse(t, other, 8<<20, 8, [2]int64{3 << 20, 1000})
	if o, _ := Sum(other); o.Sum == a.Sum {
		t.Errorf("different content, same sum %s", o.Sum)
	}
}

func TestVerifyUnsealed(t *testing.T) {
	if err := Verify(t.TempDir()); !errors.Is(err, ErrNoManifest) {
		t.Errorf("Verify = %v, want ErrNoManifest", err)
	}
}

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "sandbox.json")
	for _, content := range []string{"one", "two, longer"} {
		if err := WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(p)
		if !bytes.Equal(got, []byte(content)) {
			t.Errorf("got %q, want %q", got, content)
		}
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}
	if _, err := os.Stat(p + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left: %v", err)
	}
}

// BenchmarkSum hashes a 1 GiB sparse file holding 200 MiB of data, the
// shape of a guest memory image.
func BenchmarkSum(b *testing.B) {
	dir := b.TempDir()
	p := filepath.Join(dir, "vm.mem")
	var ranges [][2]int64
	for off := int64(0); off < 1<<30; off += 5 << 20 {
		ranges = append(ranges, [2]int64{off, 1 << 20})
	}
	testkit.WriteSparse(b, p, 1<<30, 1, ranges...)
	b.SetBytes(1 << 30)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Sum(p); err != nil {
			b.Fatal(err)
		}
	}
}

func TestFingerprintChangesOnWrite(t *testing.T) {
	dir := t.TempDir()
	testkit.WriteSparse(t, filepath.Join(dir, "vm.state"), 4096, 1, [2]int64{0, 4096})
	if _, err := Seal(dir, "vm.state"); err != nil {
		t.Fatal(err)
	}
	a, err := Fingerprint(dir)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := Fingerprint(dir); b != a {
		t.Errorf("fingerprint changed without a write: %q, %q", a, b)
	}
	flip(t, filepath.Join(dir, "vm.state"), 10)
	if b, _ := Fingerprint(dir); b == a {
		t.Errorf("fingerprint %q unchanged after a write", b)
	}
}
