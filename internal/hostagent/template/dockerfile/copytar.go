package dockerfile

import (
	"archive/tar"
	"bufio"
	"compress/bzip2"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"
)

// writeTar writes the tar stream a VM extracts for cs: its entries named
// relative to the guest's /, each preceded by its parent directories.
// intoDir says that a Single file goes into the directory cs.Dst (which
// exists in the guest) rather than being cs.Dst.
func writeTar(w io.Writer, cs *copySpec, intoDir bool) error {
	tw := tar.NewWriter(w)
	t := &tarOut{tw: tw, dirs: map[string]bool{}}
	dst := strings.TrimPrefix(cs.Dst, "/")
	if cs.DstDir && dst != "" {
		if err := t.parents(dst + "/x"); err != nil {
			return err
		}
	}
	for _, e := range cs.entries {
		name := path.Join(dst, e.Rel)
		if e.Single && !intoDir || e.Type == "archive" {
			name = dst
		}
		if e.Type == "archive" {
			if err := t.archive(e.host, name); err != nil {
				return fmt.Errorf("unpack %s: %w", e.Rel, err)
			}
			continue
		}
		if name == "" {
			continue // the root itself
		}
		if err := t.parents(name); err != nil {
			return err
		}
		mode := e.Mode
		if cs.Chmod != nil && e.Type != "symlink" {
			mode = *cs.Chmod
		}
		h := &tar.Header{Name: name, Mode: mode, ModTime: e.mtime, Format: tar.FormatPAX}
		switch e.Type {
		case "dir":
			h.Typeflag, h.Name = tar.TypeDir, name+"/"
			t.dirs[name] = true
		case "symlink":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.Link
		case "file":
			h.Typeflag, h.Size = tar.TypeReg, e.size
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if e.Type == "file" {
			if err := copyFile(tw, e.host, e.size); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

type tarOut struct {
	tw *tar.Writer
	// dirs holds the directories written.
	dirs map[string]bool
}

// parents writes the directories above name that are not written yet.
func (t *tarOut) parents(name string) error {
	var missing []string
	for d := path.Dir(name); d != "." && d != "/" && !t.dirs[d]; d = path.Dir(d) {
		missing = append(missing, d)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		d := missing[i]
		t.dirs[d] = true
		h := &tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
		if err := t.tw.WriteHeader(h); err != nil {
			return err
		}
	}
	return nil
}

// archive writes the members of the tar archive at host (plain, gzip or
// bzip2) below the directory dst, keeping their modes and owners.
func (t *tarOut) archive(host, dst string) error {
	kind, err := archiveKind(host)
	if err != nil {
		return err
	}
	f, err := os.Open(host)
	if err != nil {
		return err
	}
	defer f.Close()
	var r io.Reader = bufio.NewReader(f)
	switch kind {
	case "gzip":
		zr, err := gzip.NewReader(r)
		if err != nil {
			return err
		}
		defer zr.Close()
		r = zr
	case "bzip2":
		r = bzip2.NewReader(r)
	}
	if err := t.parents(dst + "/x"); err != nil {
		return err
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return invalidf("ADD: %s is not a valid tar archive: %v", path.Base(host), err)
		}
		name := cleanName(h.Name)
		if name == "" {
			continue
		}
		if !local(name) {
			return invalidf("ADD: archive entry %q is outside the archive (..)", cut(h.Name, 200))
		}
		out := &tar.Header{
			Name: path.Join(dst, name), Mode: h.Mode & 07777, Uid: h.Uid, Gid: h.Gid,
			Uname: h.Uname, Gname: h.Gname, ModTime: h.ModTime, Format: tar.FormatPAX,
		}
		switch h.Typeflag {
		case tar.TypeDir:
			out.Typeflag = tar.TypeDir
			t.dirs[out.Name] = true
			out.Name += "/"
		case tar.TypeReg, tar.TypeRegA:
			out.Typeflag, out.Size = tar.TypeReg, h.Size
		case tar.TypeSymlink:
			out.Typeflag, out.Linkname = tar.TypeSymlink, h.Linkname
		case tar.TypeLink:
			target := cleanName(h.Linkname)
			if target == "" || !local(target) {
				return invalidf("ADD: archive hard link %q points outside the archive", cut(h.Name, 200))
			}
			out.Typeflag, out.Linkname = tar.TypeLink, path.Join(dst, target)
		case tar.TypeXGlobalHeader:
			continue
		default:
			return invalidf("ADD: archive entry %q is a device, fifo or other special file; only files, directories and links are unpacked", cut(h.Name, 200))
		}
		if err := t.parents(path.Join(dst, name)); err != nil {
			return err
		}
		if err := t.tw.WriteHeader(out); err != nil {
			return err
		}
		if out.Typeflag == tar.TypeReg {
			if _, err := io.Copy(t.tw, tr); err != nil {
				return err
			}
		}
	}
}

// copyFile writes the size bytes of the file p; a file that changed size
// since it was hashed is an error (the context is private, so it should
// not).
func copyFile(w io.Writer, p string, size int64) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, io.LimitReader(f, size))
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%s changed while it was copied", path.Base(p))
	}
	return nil
}
