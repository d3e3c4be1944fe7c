package manifest

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// FuzzRead reads arbitrary manifest.json bytes the way a host reads a
// directory it received (a pack from another host, a download from the
// object store: the manifest comes with the files) and checks that Read
// either refuses them as ErrCorrupt or returns a manifest that names only
// files of the directory itself (one path component each, so Check,
// Verify and Fingerprint never look outside it) with sizes >= 0, that
// re-encoding an accepted manifest reads back the same, and that Check,
// Verify and Fingerprint fail only with the documented classes. It also
// seals a directory holding the input's bytes (as Seal does, without its
// flushes) and checks the round trip: Read returns the manifest, Verify
// accepts the directory, and a flipped byte is ErrCorrupt.
func FuzzRead(f *testing.F) {
	f.Add([]byte(`{"version":1,"files":[{"name":"vm.mem","size":5,"sum":"xxh64b1m:0123456789abcdef"}]}`), []byte("hello"))
	f.Add([]byte(`{
  "version": 1,
  "files": [
    {"name": "rootfs.ext4", "size": 0, "sum": "xxh64b1m:0000000000000000"},
    {"name": "vm.state", "size": 2, "sum": "xxh64b1m:ffffffffffffffff"}
  ]
}`), []byte("state"))
	f.Add([]byte(`{"version":1,"files":[{"name":"../outside","size":6,"sum":"xxh64b1m:0"}]}`), []byte{})
	f.Add([]byte(`{"version":1,"files":[{"name":"/etc/hostname","size":0}]}`), []byte{0})
	f.Add([]byte(`{"version":1,"files":[{"name":"a/b","size":1},{"name":".","size":0},{"name":"","size":0}]}`), []byte("x"))
	f.Add([]byte(`{"version":1,"files":[{"name":"vm.mem","size":-1}]}`), []byte("y"))
	f.Add([]byte(`{"version":2,"files":[]}`), []byte("z"))
	f.Add([]byte(`{"version":1,"files":null}`), []byte("\x00\x01"))
	f.Add([]byte(`{"version":1}{"version":3}`), []byte("tail"))
	f.Add([]byte(`[]`), []byte("manifest"))
	f.Add([]byte("{\"version\":1,\"files\":[{\"name\":\"vm.mem\\u0000x\",\"size\":0}]}"), []byte(""))
	// One directory for every run of a worker (the files are rewritten
	// each time): a directory made and removed per run costs more than
	// the run.
	dir := filepath.Join(f.TempDir(), "set")
	if err := os.Mkdir(dir, 0o700); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data, content []byte) {
		files := map[string][]byte{"vm.mem": content, "vm.state": data, Name: data}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		m, err := Read(dir)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Read(%q): %v, want ErrCorrupt", data, err)
			}
		} else {
			if m.Version != version {
				t.Fatalf("Read(%q) accepted version %d", data, m.Version)
			}
			for _, f := range m.Files {
				if f.Name == "" || f.Name == "." || f.Name == ".." || strings.ContainsAny(f.Name, "/\x00") {
					t.Fatalf("Read(%q) accepted file name %q, which is not a file of the directory", data, f.Name)
				}
				if f.Size < 0 {
					t.Fatalf("Read(%q) accepted size %d of %q", data, f.Size, f.Name)
				}
			}
			b, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, Name), b, 0o600); err != nil {
				t.Fatal(err)
			}
			again, err := Read(dir)
			if err != nil || !reflect.DeepEqual(again, m) {
				t.Fatalf("manifest %s re-encoded as %s reads back as %+v, %v", data, b, again, err)
			}
			for what, err := range map[string]error{"Check": Check(dir), "Verify": Verify(dir)} {
				if err != nil && !errors.Is(err, ErrCorrupt) {
					t.Fatalf("%s of manifest %q: %v, want nil or ErrCorrupt", what, data, err)
				}
			}
			if _, err := Fingerprint(dir); err != nil && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Fingerprint of manifest %q: %v, want nil or ErrCorrupt", data, err)
			}
		}

		// Round trip: seal the directory's files (the input's bytes) as
		// Seal does, without its flushes (which cost milliseconds a run).
		sm := Manifest{Version: version}
		for _, name := range []string{"vm.mem", "vm.state"} {
			sf, err := Sum(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			sm.Files = append(sm.Files, sf)
		}
		b, err := json.MarshalIndent(sm, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, Name), b, 0o600); err != nil {
			t.Fatal(err)
		}
		if got, err := Read(dir); err != nil || !reflect.DeepEqual(got, sm) {
			t.Fatalf("Read of a sealed manifest = %+v, %v; want %+v", got, err, sm)
		}
		if err := Verify(dir); err != nil {
			t.Fatalf("Verify of a sealed directory: %v", err)
		}
		if len(content) > 0 {
			flipped := append([]byte(nil), content...)
			flipped[len(flipped)/2] ^= 0x80
			if err := os.WriteFile(filepath.Join(dir, "vm.mem"), flipped, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := Verify(dir); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Verify of a file with a flipped byte: %v, want ErrCorrupt", err)
			}
		}
	})
}
