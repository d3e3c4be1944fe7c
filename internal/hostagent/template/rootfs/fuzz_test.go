package rootfs

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// FuzzApplyLayers applies two arbitrary layers (tar streams, as an image's
// layers are: hostile names, links out of the tree, device nodes,
// whiteouts, PAX records, sparse files, huge headers) onto a tree in a
// t.TempDir() and checks that nothing outside the tree changed: a sibling
// directory (and the file, subdirectory and symlinks in it) keeps its
// entries, modes, owners, times and contents, and no new entry appears
// beside the tree. The files written stay within the tree's byte limit.
//
// A tar written as it is reaches the reader's edge cases; mode bit 0
// re-encodes each layer with "@ROOT@" in names and link targets replaced
// by the temporary directory's path, so that links can name the very
// directory beside the tree by its absolute host path (what a layer
// would aim at on a host that resolved them as the host does).
func FuzzApplyLayers(f *testing.F) {
	layer := func(hs ...*tar.Header) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range hs {
			if h.Typeflag == tar.TypeReg && h.Size == 0 && h.Linkname != "" {
				// A regular file's body rides in Linkname here.
				body := h.Linkname
				h.Linkname, h.Size = "", int64(len(body))
				tw.WriteHeader(h)
				tw.Write([]byte(body))
				continue
			}
			tw.WriteHeader(h)
		}
		tw.Close()
		return b.Bytes()
	}
	dir := func(n string) *tar.Header { return &tar.Header{Typeflag: tar.TypeDir, Name: n, Mode: 0o755} }
	file := func(n, body string) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644, Linkname: body}
	}
	sym := func(n, target string) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeSymlink, Name: n, Linkname: target}
	}
	hard := func(n, target string) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeLink, Name: n, Linkname: target}
	}
	for _, s := range []struct {
		a, b []byte
		mode uint8
	}{
		{layer(dir("etc/"), file("etc/hosts", "127.0.0.1 x\n"), sym("bin", "usr/bin"), dir("usr/bin/"), file("usr/bin/sh", "#!")),
			layer(file("etc/.wh.hosts", ""), file("usr/.wh..wh..opq", ""), file("usr/bin/ls", "ls")), 0},
		{layer(sym("out", "@ROOT@/outside"), file("out/new", "x"), file("out/secret", "overwritten")),
			layer(sym("up", "../../../../../../@ROOT@/outside"), file("up/new", "x"), hard("h", "up/secret")), 1},
		{layer(dir("@ROOT@/outside/d/"), sym("out", "@ROOT@/outside"), file("out/new", "x"), file("out/secret", "overwritten")),
			layer(hard("out/d/h", "out/secret"), file("out/.wh.secret", ""), file("out/d/.wh..wh..opq", ""), sym("out/abs", "/")), 1},
		{layer(sym("etc", "/etc"), file("etc/pandastack-fuzz-canary", "x"), sym("tmp", "@ROOT@"), file("tmp/outside/new", "x")),
			layer(dir("a/"), sym("a/b", "/"), file("a/b/@ROOT@/outside/new", "x"), hard("l", "@ROOT@/outside/secret")), 1},
		{layer(file("../escape", "x")), layer(file("/abs/ok", "x"), file("./a/../../b", "x")), 0},
		{layer(&tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3},
			&tar.Header{Typeflag: tar.TypeBlock, Name: "dev/sda", Mode: 0o600, Devmajor: 8},
			&tar.Header{Typeflag: tar.TypeFifo, Name: "run/fifo", Mode: 0o600}),
			layer(file("dev/null", "replaced"), file("run/fifo/x", "y")), 0},
		{layer(&tar.Header{Typeflag: tar.TypeReg, Name: "cap", Mode: 0o4755, Uid: 1000, Gid: 1000,
			PAXRecords: map[string]string{"SCHILY.xattr.user.x": "1"}},
			&tar.Header{Typeflag: tar.TypeSymlink, Name: "lnk", Linkname: "cap", PAXRecords: map[string]string{"SCHILY.xattr.trusted.y": "2"}}),
			layer(&tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "g", PAXRecords: map[string]string{"path": "x"}},
				&tar.Header{Typeflag: tar.TypeReg, Name: strings.Repeat("d/", 200) + "f", Mode: 0o644}), 0},
		{layer(sym("loop", "loop"), file("loop/x", "y"), sym("l1", "l2"), sym("l2", "l1"), file("l1/x", "y")),
			layer(dir("./"), file("", "root"), hard("self", "self"), hard("r", "."), file("a\x00b", "nul")), 0},
		{layer(file("big", strings.Repeat("z", 4096))), layer(&tar.Header{Typeflag: tar.TypeGNUSparse, Name: "sparse", Size: 1 << 40, Mode: 0o644}), 0},
		{[]byte("not a tar at all"), nil, 0},
	} {
		f.Add(s.a, s.b, s.mode)
	}
	f.Fuzz(func(t *testing.T, a, b []byte, mode uint8) {
		root := t.TempDir()
		outside := filepath.Join(root, "outside")
		treeDir := filepath.Join(root, "tree")
		for _, d := range []string{outside, filepath.Join(outside, "d"), treeDir} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600); err != nil {
			t.Fatal(err)
		}
		for name, target := range map[string]string{"abs": outside, "rel": "../tree", "dangling": "nowhere"} {
			if err := os.Symlink(target, filepath.Join(outside, name)); err != nil {
				t.Fatal(err)
			}
		}
		// Times in the past, so that any change shows.
		past := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
		for _, p := range []string{filepath.Join(outside, "secret"), filepath.Join(outside, "d"), outside} {
			os.Chtimes(p, past, past)
		}
		before := fuzzSnapshot(t, root, treeDir)

		const limit = 1 << 20
		tr, err := newTree(treeDir, limit)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.close()
		err = nil
		for _, l := range [][]byte{a, b} {
			if mode&1 != 0 {
				l = fuzzRewrite(l, root)
			}
			if err = tr.applyLayer(context.Background(), bytes.NewReader(l)); err != nil {
				break
			}
		}
		if err == nil {
			err = tr.finish()
		}
		if err != nil && errors.Is(err, ErrTooLarge) && tr.written <= limit {
			t.Fatalf("ErrTooLarge with %d bytes written, limit %d", tr.written, limit)
		}
		if tr.written > limit+1 {
			t.Fatalf("%d bytes of files written, limit %d", tr.written, limit)
		}

		after := fuzzSnapshot(t, root, treeDir)
		for p, want := range before {
			if got, ok := after[p]; !ok || got != want {
				t.Fatalf("outside the tree, %s changed: %+v, was %+v (layers applied with %v)", p, got, want, err)
			}
		}
		for p, got := range after {
			if _, ok := before[p]; !ok {
				t.Fatalf("outside the tree, %s appeared: %+v (layers applied with %v)", p, got, err)
			}
		}
		if _, err := os.Lstat("/etc/pandastack-fuzz-canary"); err == nil {
			t.Fatal("a layer wrote /etc/pandastack-fuzz-canary on the host")
		}
	})
}

// fuzzEntry is what an entry outside the tree looks like.
type fuzzEntry struct {
	mode       fs.FileMode
	uid, gid   uint32
	size       int64
	mtime      int64
	sum        [32]byte // of a regular file's contents
	linkTarget string
}

// fuzzSnapshot records every entry below root except the tree and what is
// below it.
func fuzzSnapshot(t *testing.T, root, tree string) map[string]fuzzEntry {
	out := map[string]fuzzEntry{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == tree {
			return filepath.SkipDir
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		e := fuzzEntry{mode: fi.Mode(), uid: st.Uid, gid: st.Gid, size: fi.Size(), mtime: fi.ModTime().UnixNano()}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			e.linkTarget, _ = os.Readlink(p)
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			e.sum = sha256.Sum256(b)
		}
		out[p] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// fuzzRewrite re-encodes a tar stream with "@ROOT@" in its names and link
// targets replaced by root; what does not decode is dropped from there
// on, and the result is PAX (long names survive).
func fuzzRewrite(l []byte, root string) []byte {
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	tr := tar.NewReader(bytes.NewReader(l))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		h.Name = strings.ReplaceAll(h.Name, "@ROOT@", root)
		h.Linkname = strings.ReplaceAll(h.Linkname, "@ROOT@", root)
		h.Format = tar.FormatPAX
		if h.Typeflag == tar.TypeGNUSparse {
			h.Typeflag = tar.TypeReg
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if h.Size > 1<<20 {
			h.Size = 1 << 20
		}
		if tw.WriteHeader(h) != nil {
			break
		}
		if h.Size > 0 {
			io.Copy(tw, io.LimitReader(io.MultiReader(tr, fuzzZeros{}), h.Size))
		}
	}
	tw.Close()
	return out.Bytes()
}

type fuzzZeros struct{}

func (fuzzZeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
