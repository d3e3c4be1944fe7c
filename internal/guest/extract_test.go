package guest_test

import (
	"archive/tar"
	"bytes"
	"cmp"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/guest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// entry is one tar entry of a test archive.
type entry struct {
	name, link, body string
	typ              byte
	mode             int64
	uid, gid         int // 0: 4242
}

func archive(t *testing.T, entries ...entry) *bytes.Reader {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: typ, Mode: mode, Size: int64(len(e.body)),
			ModTime: time.Unix(1_600_000_000, 0), Uid: cmp.Or(e.uid, 4242), Gid: cmp.Or(e.gid, 4242)}
		if typ != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b.Bytes())
}

func me() guest.Owner { return guest.Owner{UID: os.Getuid(), GID: os.Getgid()} }

func TestExtract(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "usr/lib"), 0o755)
	os.Symlink("usr/lib", filepath.Join(root, "lib")) // merged /usr, as Debian has it
	os.WriteFile(filepath.Join(root, "old"), []byte("old"), 0o644)
	err := guest.Extract(root, archive(t,
		entry{name: "./", typ: tar.TypeDir, mode: 0o700},
		entry{name: "app/", typ: tar.TypeDir, mode: 0o750},
		entry{name: "app/run.sh", body: "#!/bin/sh\n", mode: 0o4755},
		entry{name: "app/link", typ: tar.TypeSymlink, link: "run.sh"},
		entry{name: "app/hard", typ: tar.TypeLink, link: "app/run.sh"},
		entry{name: "deep/er/file", body: "x"},
		entry{name: "lib/mod.so", body: "so"},
		entry{name: "lib/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "old", typ: tar.TypeSymlink, link: "app"},
		entry{name: "fifo", typ: tar.TypeFifo, mode: 0o640},
	), me())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{
		{"app", os.ModeDir | 0o750},
		{"app/run.sh", os.ModeSetuid | 0o755},
		{"app/link", os.ModeSymlink | 0o777},
		{"deep", os.ModeDir | 0o755},
		{"deep/er/file", 0o644},
		{"usr/lib/mod.so", 0o644},
		{"lib", os.ModeSymlink | 0o777},
		{"old", os.ModeSymlink | 0o777},
		{"fifo", os.ModeNamedPipe | 0o640},
	} {
		st, err := os.Lstat(filepath.Join(root, c.path))
		if err != nil {
			t.Errorf("%s: %v", c.path, err)
			continue
		}
		if st.Mode() != c.mode {
			t.Errorf("%s: mode %v, want %v", c.path, st.Mode(), c.mode)
		}
		if s := st.Sys().(*syscall.Stat_t); int(s.Uid) != os.Getuid() || int(s.Gid) != os.Getgid() {
			t.Errorf("%s: owner %d:%d, want %d:%d", c.path, s.Uid, s.Gid, os.Getuid(), os.Getgid())
		}
		if c.path != "deep" && c.path != "lib" && !st.ModTime().Equal(time.Unix(1_600_000_000, 0)) {
			t.Errorf("%s: mtime %v, want the archive's", c.path, st.ModTime())
		}
	}
	if got, _ := os.Readlink(filepath.Join(root, "app/link")); got != "run.sh" {
		t.Errorf("app/link -> %q, want run.sh", got)
	}
	a, _ := os.Stat(filepath.Join(root, "app/run.sh"))
	b, _ := os.Stat(filepath.Join(root, "app/hard"))
	if !os.SameFile(a, b) {
		t.Errorf("app/hard is not a hard link of app/run.sh")
	}
	if st, _ := os.Stat(root); st.Mode().Perm() == 0o700 {
		t.Errorf("the root's mode was changed to the archive's ./")
	}
}

// An existing directory keeps its owner and mode (COPY's archive holds the
// parents of what it copies: /tmp must stay 1777, /root 0700); with
// ArchiveOwner each entry gets the owner the archive records, and the
// directories made for them are root's.
func TestExtractExistingDirAndArchiveOwner(t *testing.T) {
	testkit.Root(t) // gives files to other users
	root := t.TempDir()
	os.Mkdir(filepath.Join(root, "tmp"), 0o700)
	os.Chmod(filepath.Join(root, "tmp"), os.ModeSticky|0o777)
	os.Chown(filepath.Join(root, "tmp"), 0, 0)
	err := guest.Extract(root, archive(t,
		entry{name: "tmp/", typ: tar.TypeDir, mode: 0o755, uid: 7, gid: 8},
		entry{name: "tmp/a", body: "a", uid: 7, gid: 8},
		entry{name: "new/b", body: "b", uid: 9, gid: 10},
	), guest.ArchiveOwner)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path     string
		mode     os.FileMode
		uid, gid uint32
	}{
		{"tmp", os.ModeDir | os.ModeSticky | 0o777, 0, 0},
		{"tmp/a", 0o644, 7, 8},
		{"new", os.ModeDir | 0o755, 0, 0},
		{"new/b", 0o644, 9, 10},
	} {
		st, err := os.Lstat(filepath.Join(root, c.path))
		if err != nil {
			t.Errorf("%s: %v", c.path, err)
			continue
		}
		s := st.Sys().(*syscall.Stat_t)
		if st.Mode() != c.mode || s.Uid != c.uid || s.Gid != c.gid {
			t.Errorf("%s: %v %d:%d, want %v %d:%d", c.path, st.Mode(), s.Uid, s.Gid, c.mode, c.uid, c.gid)
		}
	}
}

// TestExtractHostile: names that leave the root are refused; symbolic
// links (the tree's or the archive's own) resolve inside the root, so
// writes through them stay there.
func TestExtractHostile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []entry
		wantErr string
		// mayFail: refusing is as good as containing (a link to a
		// directory that does not exist in the root).
		mayFail bool
	}{
		{"dotdot", []entry{{name: "../x", body: "evil"}}, "leaves the root", false},
		{"inner dotdot", []entry{{name: "a/../../x", body: "evil"}}, "leaves the root", false},
		{"absolute", []entry{{name: "/x", body: "evil"}}, "absolute", false},
		{"hard link out", []entry{{name: "h", typ: tar.TypeLink, link: "../outside/x"}}, "leaves the root", false},
		{"hard link absolute", []entry{{name: "h", typ: tar.TypeLink, link: "/etc/passwd"}}, "absolute", false},
		{"symlink absolute then write", []entry{
			{name: "evil", typ: tar.TypeSymlink, link: "OUTSIDE"},
			{name: "evil/x", body: "evil"},
		}, "", true},
		{"symlink dotdot then write", []entry{
			{name: "evil", typ: tar.TypeSymlink, link: "../../../../../../OUTSIDE"},
			{name: "evil/x", body: "evil"},
		}, "", true},
		{"symlink file then overwrite", []entry{
			{name: "f", typ: tar.TypeSymlink, link: "OUTSIDE/x"},
			{name: "f", body: "evil"},
		}, "", false},
		{"symlink to a root dir then write", []entry{
			{name: "etc/", typ: tar.TypeDir, mode: 0o755},
			{name: "evil", typ: tar.TypeSymlink, link: "/etc"},
			{name: "evil/x", body: "evil"},
		}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			root := filepath.Join(base, "root")
			os.MkdirAll(outside, 0o755)
			os.MkdirAll(root, 0o755)
			os.WriteFile(filepath.Join(outside, "x"), []byte("mine"), 0o644)
			for i := range tc.entries {
				tc.entries[i].link = strings.ReplaceAll(tc.entries[i].link, "OUTSIDE", outside)
			}
			err := guest.Extract(root, archive(t, tc.entries...), me())
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Extract: %v, want an error containing %q", err, tc.wantErr)
			}
			if tc.wantErr == "" && err != nil && !tc.mayFail {
				t.Errorf("Extract: %v, want it contained", err)
			}
			if b, err := os.ReadFile(filepath.Join(outside, "x")); err != nil || string(b) != "mine" {
				t.Errorf("outside/x = %q, %v; want it untouched", b, err)
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 {
				t.Errorf("outside holds %d entries, want 1", len(ents))
			}
			ents, _ = os.ReadDir(base)
			if len(ents) != 2 {
				t.Errorf("the root's parent holds %d entries, want 2", len(ents))
			}
			if tc.wantErr == "" && err == nil && tc.name != "symlink file then overwrite" {
				// Contained: the write landed under the root, where the
				// link resolves when the root is "/".
				found := false
				filepath.Walk(root, func(p string, info os.FileInfo, err error) error {
					if err == nil && info.Mode().IsRegular() && filepath.Base(p) == "x" {
						found = true
					}
					return nil
				})
				if !found {
					t.Errorf("no x under the root")
				}
			}
		})
	}
}

func TestResolveOwner(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0::/root:/bin/sh\nbuilder:x:1000:1001::/home/b:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nbuilders:x:1001:\nstaff:x:50:\n"), 0o644)
	for _, tc := range []struct {
		spec string
		want guest.Owner
		ok   bool
	}{
		{"", guest.ArchiveOwner, true},
		{"builder", guest.Owner{UID: 1000, GID: 1001}, true},
		{"builder:staff", guest.Owner{UID: 1000, GID: 50}, true},
		{"7:8", guest.Owner{UID: 7, GID: 8}, true},
		{"nosuch", guest.Owner{}, false},
		{"builder:nosuch", guest.Owner{}, false},
		{"bad name!", guest.Owner{}, false},
	} {
		got, err := guest.ResolveOwner(root, tc.spec)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ResolveOwner(%q) = %+v, %v; want %+v, ok %v", tc.spec, got, err, tc.want, tc.ok)
		}
	}
}
