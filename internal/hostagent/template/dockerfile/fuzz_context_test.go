package dockerfile

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// FuzzContext unpacks arbitrary build contexts (the tar, plain or gzip, a
// user uploads with a Dockerfile build: hostile names, links out of the
// context, devices, a .dockerignore), resolves a COPY or ADD of an
// arbitrary source from it and writes the tar the build VM extracts, and
// checks:
//
//   - unpacking changes nothing outside the context's directory (a
//     sibling directory with a file and symlinks stays as it was, and no
//     entry appears beside the context), and leaves only files,
//     directories and symlinks in it;
//   - a resolved copy takes only files of the context: every entry's
//     host file, its directory with symlinks resolved, lies inside the
//     context's directory, and so does a regular file itself;
//   - the tar for the VM names only the destination, its parent
//     directories and what is below it (no "..", no absolute names),
//     links included, holds no device or fifo, and a copied file's bytes
//     are the context file's.
func FuzzContext(f *testing.F) {
	type e = tentry
	ctxTar := func(es ...tentry) []byte { return tarBytes(f, es...) }
	inner := ctxTar(tfile("a/b.txt", "inner"), tdir("d/"), tlink("d/l", "/etc/passwd"),
		tentry{name: "hard", typ: tar.TypeLink, link: "a/b.txt"})
	for _, s := range []struct {
		tar   []byte
		src   string
		flags uint8
	}{
		{ctxTar(tfile(".dockerignore", "*.log\n!keep.log\nsecret/\n"), tfile("app.js", "js"), tfile("a.log", "x"), tfile("keep.log", "k"),
			tdir("secret/"), tfile("secret/key", "k"), tdir("src/"), tfile("src/main.go", "go"), tlink("src/link.go", "main.go")), ".", 0},
		{ctxTar(tlink("current", "/src"), tdir("src/"), tfile("src/x", "x")), "current/x", 0},
		{ctxTar(tlink("escape", "../../../etc"), tlink("abs", "/etc/passwd")), "escape/passwd", 0},
		{ctxTar(tlink("escape", "../../../etc")), "escape", cfDstFile},
		{ctxTar(tlink("up", ".."), tfile("f", "f")), "up/f", 0},
		{ctxTar(tlink("l1", "l2"), tlink("l2", "l1")), "l1", 0},
		{ctxTar(tlink("dir", "/"), tfile("dir/x", "through a symlink")), "dir", 0},
		{ctxTar(tfile("../outside", "x")), ".", 0},
		{ctxTar(tfile("/abs", "x")), ".", 0},
		{ctxTar(tfile("f", "f"), e{name: "h", typ: tar.TypeLink, link: "../../f"}), ".", 0},
		{ctxTar(tlink("s", "/"), e{name: "h", typ: tar.TypeLink, link: "s/etc/passwd"}), ".", 0},
		{ctxTar(e{name: "dev", typ: tar.TypeChar, mode: 0o666}), ".", 0},
		{ctxTar(tfile("docs/a.md", "a"), tfile("docs/b.md", "b"), tfile("docs/c.txt", "c")), "docs/*.md", 0},
		{ctxTar(tfile("x", "x")), "[", 0},
		{ctxTar(e{name: "inner.tar", typ: tar.TypeReg, body: string(inner), mode: 0o644}), "inner.tar", cfAdd},
		{ctxTar(e{name: "bad.tar", typ: tar.TypeReg, body: string(ctxTar(tfile("../../x", "x"))), mode: 0o644}), "bad.tar", cfAdd},
		{ctxTar(e{name: "dev.tar", typ: tar.TypeReg, body: string(ctxTar(e{name: "null", typ: tar.TypeChar})), mode: 0o644}), "dev.tar", cfAdd},
		{ctxTar(tfile("f", "single")), "f", cfDstFile | cfIntoDir | cfChmod},
		{[]byte("\x1f\x8b not gzip"), ".", 0},
		{ctxTar(tdir("a/"), tfile("a", "file over dir"), tdir("a/")), "a", 0},
	} {
		f.Add(s.tar, s.src, s.flags)
	}
	f.Fuzz(func(t *testing.T, data []byte, src string, flags uint8) {
		ctx := context.Background()
		root := t.TempDir()
		outside := filepath.Join(root, "outside")
		dir := filepath.Join(root, "context")
		for _, d := range []string{outside, dir} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(outside, "abs")); err != nil {
			t.Fatal(err)
		}
		past := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
		os.Chtimes(filepath.Join(outside, "secret"), past, past)
		os.Chtimes(outside, past, past)
		tarPath := filepath.Join(outside, "context.tar")
		if err := os.WriteFile(tarPath, data, 0o600); err != nil {
			t.Fatal(err)
		}
		before := fuzzOutside(t, root, dir)

		bctx, err := openContext(ctx, tarPath, dir, 1<<20)
		after := fuzzOutside(t, root, dir)
		for p, want := range before {
			if got, ok := after[p]; !ok || got != want {
				t.Fatalf("outside the context, %s changed: %+v, was %+v (unpacked with %v)", p, got, want, err)
			}
		}
		for p, got := range after {
			if _, ok := before[p]; !ok {
				t.Fatalf("outside the context, %s appeared: %+v (unpacked with %v)", p, got, err)
			}
		}
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.Type().IsRegular() && !d.IsDir() && d.Type()&fs.ModeSymlink == 0 {
				t.Fatalf("the context holds %s, a %v", p, d.Type())
			}
			return nil
		})
		if err != nil {
			return
		}

		cs := &copySpec{Add: flags&cfAdd != 0, Srcs: []string{src}, Dst: "/dst/", DstDir: true}
		if flags&cfDstFile != 0 {
			cs.Dst, cs.DstDir = "/dst/file", false
		}
		if flags&cfChmod != 0 {
			mode := int64(0o4755)
			cs.Chmod = &mode
		}
		if err := bctx.resolve(ctx, cs); err != nil {
			return
		}
		realDir, err := filepath.EvalSymlinks(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, ce := range cs.entries {
			p := filepath.Dir(ce.host)
			if ce.Type != "symlink" {
				p = ce.host
			}
			rp, err := filepath.EvalSymlinks(p)
			if err != nil || !fuzzWithin(realDir, rp) {
				t.Fatalf("COPY %q: entry %q is %s, which resolves to %q (%v), outside the context %s", src, ce.Rel, ce.host, rp, err, realDir)
			}
		}

		var buf bytes.Buffer
		if err := writeTar(&buf, cs, flags&cfIntoDir != 0); err != nil {
			return // an ADD of a bad archive
		}
		dst := path.Clean(strings.TrimPrefix(cs.Dst, "/"))
		tr := tar.NewReader(&buf)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("the tar for the VM does not read back: %v", err)
			}
			name := strings.TrimSuffix(h.Name, "/")
			if h.Typeflag == tar.TypeDir && fuzzUnder(dst, name) {
				continue // a parent of the destination
			}
			if !fuzzUnder(name, dst) {
				t.Fatalf("COPY %q to %s: the VM's tar names %q", src, cs.Dst, h.Name)
			}
			switch h.Typeflag {
			case tar.TypeLink:
				if !fuzzUnder(h.Linkname, dst) {
					t.Fatalf("COPY %q to %s: hard link %q to %q", src, cs.Dst, h.Name, h.Linkname)
				}
			case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
				t.Fatalf("COPY %q: the VM's tar holds device or fifo %q", src, h.Name)
			case tar.TypeReg:
				if cs.Add {
					continue // an archive's members
				}
				got, _ := io.ReadAll(tr)
				var from *copyEntry
				for i := range cs.entries {
					if cs.entries[i].Type == "file" && (path.Join(dst, cs.entries[i].Rel) == name || cs.entries[i].Single && name == dst) {
						from = &cs.entries[i]
					}
				}
				if from == nil {
					t.Fatalf("COPY %q: the VM's tar holds %q, which no entry names", src, h.Name)
				}
				want, err := os.ReadFile(from.host)
				if err != nil || sha256.Sum256(got) != sha256.Sum256(want) {
					t.Fatalf("COPY %q: %q in the VM's tar is not the context's %s", src, h.Name, from.host)
				}
			}
		}
	})
}

// Flags of FuzzContext.
const (
	cfAdd     = 1 << 0 // ADD rather than COPY
	cfDstFile = 1 << 1 // the destination is a file, not a directory
	cfIntoDir = 1 << 2 // a single file goes into an existing directory
	cfChmod   = 1 << 3 // --chmod=4755
)

// fuzzUnder reports whether the tar name n is dst or below it, with no ".."
// and not absolute.
func fuzzUnder(n, dst string) bool {
	if path.IsAbs(n) || n != path.Clean(n) && n+"/" != path.Clean(n)+"/" {
		return false
	}
	for _, c := range strings.Split(n, "/") {
		if c == ".." {
			return false
		}
	}
	return n == dst || strings.HasPrefix(n, dst+"/")
}

// fuzzWithin reports whether the clean absolute path p is dir or below it.
func fuzzWithin(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// fuzzFileState is what an entry outside the context looks like.
type fuzzFileState struct {
	mode       fs.FileMode
	size       int64
	mtime      int64
	sum        [32]byte
	linkTarget string
}

// fuzzOutside records every entry below root except dir and what is below it.
func fuzzOutside(t *testing.T, root, dir string) map[string]fuzzFileState {
	out := map[string]fuzzFileState{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return filepath.SkipDir
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		s := fuzzFileState{mode: fi.Mode(), size: fi.Size(), mtime: fi.ModTime().UnixNano()}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			s.linkTarget, _ = os.Readlink(p)
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			s.sum = sha256.Sum256(b)
		}
		out[p] = s
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
