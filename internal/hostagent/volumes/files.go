package volumes

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"syscall"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
)

// The files API of a volume: what the REST API's volume files routes do,
// on the host, through the volume's os.Root, with its accountant. Paths
// are slash-separated and relative to the volume's root ("/a/b" and "a/b"
// alike; "" or "/" is the root); one that is not clean is ErrInvalid.
// Errors about files are *guestproto.Error, as a sandbox's files API
// reports them (CodeNotFound, CodeIsDir, ...); a write over the limit is
// host.ErrNoSpace. Writes are flushed to stable storage before they
// return.

// fileChunk is the size of one read or write of a streamed file.
const fileChunk = 1 << 20

// uploadPrefix starts the name of a file being written (renamed over its
// path once whole).
const uploadPrefix = ".panda-upload-"

// cleanPath turns a files API path into one relative to the volume's root
// ("." for the root).
func cleanPath(p string) (string, error) {
	rel := strings.TrimPrefix(p, "/")
	if rel == "" {
		return ".", nil
	}
	if strings.ContainsRune(rel, 0) || path.Clean(rel) != rel || rel == ".." || strings.HasPrefix(rel, "../") || rel == "." {
		return "", fmt.Errorf("%w: path %q is not a clean path inside the volume", host.ErrInvalid, p)
	}
	return rel, nil
}

// apiPath is rel as the files API names it: "/" and rel.
func apiPath(rel string) string {
	if rel == "." {
		return "/"
	}
	return "/" + rel
}

// fileError classifies a file system error of a volume's file as a
// *guestproto.Error (quota and host space errors keep their class).
func fileError(err error) error {
	var pe *guestproto.Error
	if err == nil || errors.As(err, &pe) || errors.Is(err, host.ErrNoSpace) || errors.Is(err, host.ErrInvalid) || errors.Is(err, host.ErrNotFound) {
		return err
	}
	msg := err.Error()
	if strings.Contains(msg, "path escapes") {
		return guestproto.Errorf(guestproto.CodePermission, "%s", strings.Replace(msg, "path escapes from parent", "path leads outside the volume", 1))
	}
	code := guestproto.CodeInternal
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if errno == syscall.ENOSPC || errno == syscall.EDQUOT {
			return fmt.Errorf("%w: %v", host.ErrNoSpace, err)
		}
		code = guestproto.ErrnoCode(errno)
	}
	return &guestproto.Error{Code: code, Message: msg}
}

// fileInfo describes rel from an lstat result.
func fileInfo(root *os.Root, rel string, fi fs.FileInfo) guestproto.FileInfo {
	info := guestproto.FileInfo{
		Name:          path.Base(apiPath(rel)),
		Path:          apiPath(rel),
		Size:          fi.Size(),
		Mode:          uint32(fi.Mode().Perm()),
		IsDir:         fi.IsDir(),
		IsSymlink:     fi.Mode()&fs.ModeSymlink != 0,
		MtimeUnixNano: fi.ModTime().UnixNano(),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.Mode = st.Mode & 0o7777
	}
	if info.IsSymlink {
		info.LinkTarget, _ = root.Readlink(rel)
	}
	return info
}

// ListDir describes the entries of directory p of volume id, by name.
func (s *Store) ListDir(id, p string) ([]guestproto.FileInfo, error) {
	rel, err := cleanPath(p)
	if err != nil {
		return nil, err
	}
	h, err := s.handle(id)
	if err != nil {
		return nil, err
	}
	f, err := h.root.Open(rel)
	if err != nil {
		return nil, fileError(err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, fileError(err)
	} else if !fi.IsDir() {
		return nil, guestproto.Errorf(guestproto.CodeNotDir, "%s is not a directory", apiPath(rel))
	}
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, fileError(err)
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	out := make([]guestproto.FileInfo, 0, len(ents))
	for _, e := range ents {
		erel := path.Join(rel, e.Name())
		fi, err := h.root.Lstat(erel)
		if err != nil {
			continue // removed since ReadDir
		}
		out = append(out, fileInfo(h.root, erel, fi))
	}
	return out, nil
}

// Stat describes p of volume id (lstat: a symlink is described, not
// followed).
func (s *Store) Stat(id, p string) (guestproto.FileInfo, error) {
	rel, err := cleanPath(p)
	if err != nil {
		return guestproto.FileInfo{}, err
	}
	h, err := s.handle(id)
	if err != nil {
		return guestproto.FileInfo{}, err
	}
	fi, err := h.root.Lstat(rel)
	if err != nil {
		return guestproto.FileInfo{}, fileError(err)
	}
	return fileInfo(h.root, rel, fi), nil
}

// ReadFile opens the regular file p of volume id (symlinks followed
// inside the volume only) for reading; the caller closes it.
func (s *Store) ReadFile(id, p string) (io.ReadCloser, guestproto.FileInfo, error) {
	rel, err := cleanPath(p)
	if err != nil {
		return nil, guestproto.FileInfo{}, err
	}
	h, err := s.handle(id)
	if err != nil {
		return nil, guestproto.FileInfo{}, err
	}
	f, err := h.root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, guestproto.FileInfo{}, fileError(err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, guestproto.FileInfo{}, fileError(err)
	}
	if fi.IsDir() {
		f.Close()
		return nil, guestproto.FileInfo{}, guestproto.Errorf(guestproto.CodeIsDir, "%s is a directory", apiPath(rel))
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, guestproto.FileInfo{}, guestproto.Errorf(guestproto.CodePermission, "%s is not a regular file", apiPath(rel))
	}
	return f, fileInfo(h.root, rel, fi), nil
}

// WriteFile writes r to the file p of volume id (created with its parent
// directories, or replaced whole: the data goes to a new file next to it,
// renamed over p once flushed), with mode's permission and sticky bits
// (0644 if none; setuid and setgid are never set). It returns the bytes
// written. Over the volume's limit it fails with host.ErrNoSpace before
// writing the chunk that would exceed it, and p is unchanged.
func (s *Store) WriteFile(id, p string, r io.Reader, mode fs.FileMode) (int64, error) {
	rel, err := cleanPath(p)
	if err != nil {
		return 0, err
	}
	if rel == "." {
		return 0, guestproto.Errorf(guestproto.CodeIsDir, "/ is a directory")
	}
	h, err := s.handle(id)
	if err != nil {
		return 0, err
	}
	if fi, err := h.root.Lstat(rel); err == nil && fi.IsDir() {
		return 0, guestproto.Errorf(guestproto.CodeIsDir, "%s is a directory", apiPath(rel))
	}
	dir := path.Dir(rel)
	if err := h.mkdirAll(dir); err != nil {
		return 0, err
	}
	tmp := path.Join(dir, uploadPrefix+randHex(8))
	f, err := h.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, fileError(err)
	}
	var written int64
	done := false
	defer func() {
		if !done {
			f.Close()
			h.root.Remove(tmp)
			h.sp.Release(Blocks(written))
		}
	}()
	buf := make([]byte, fileChunk)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if err := h.sp.Reserve(Blocks(written+int64(n)) - Blocks(written)); err != nil {
				return written, fmt.Errorf("write %s: %w: the volume's limit is %d bytes", apiPath(rel), host.ErrNoSpace, h.sp.Limit())
			}
			if _, err := f.Write(buf[:n]); err != nil {
				h.sp.Release(Blocks(written+int64(n)) - Blocks(written))
				return written, fileError(err)
			}
			written += int64(n)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			return written, fmt.Errorf("write %s: %w", apiPath(rel), rerr)
		}
	}
	perm := mode & (fs.ModePerm | fs.ModeSticky)
	if perm == 0 {
		perm = 0o644
	}
	err = f.Chmod(perm)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return written, fileError(err)
	}
	var old int64
	if fi, err := h.root.Lstat(rel); err == nil {
		switch {
		case fi.IsDir():
			return written, guestproto.Errorf(guestproto.CodeIsDir, "%s is a directory", apiPath(rel))
		case fi.Mode().IsRegular():
			old = Blocks(fi.Size())
		default:
			old = Block
		}
	}
	if err := h.root.Rename(tmp, rel); err != nil {
		return written, fileError(err)
	}
	done = true
	h.sp.Release(old)
	if err := h.syncDir(dir); err != nil {
		return written, fileError(err)
	}
	return written, nil
}

// Mkdir makes directory p of volume id and its parents (mkdir -p);
// CodeExists if p is something else.
func (s *Store) Mkdir(id, p string) error {
	rel, err := cleanPath(p)
	if err != nil {
		return err
	}
	h, err := s.handle(id)
	if err != nil {
		return err
	}
	return h.mkdirAll(rel)
}

// Remove removes p of volume id: a file, a symlink, an empty directory,
// or with recursive a directory and everything in it. The root cannot be
// removed.
func (s *Store) Remove(id, p string, recursive bool) error {
	rel, err := cleanPath(p)
	if err != nil {
		return err
	}
	if rel == "." {
		return fmt.Errorf("%w: the root of a volume cannot be removed", host.ErrInvalid)
	}
	h, err := s.handle(id)
	if err != nil {
		return err
	}
	fi, err := h.root.Lstat(rel)
	if err != nil {
		return fileError(err)
	}
	switch {
	case fi.IsDir() && recursive:
		sub, err := h.root.OpenRoot(rel)
		if err != nil {
			return fileError(err)
		}
		n, err := walkUsed(sub)
		sub.Close()
		if err != nil {
			return fileError(err)
		}
		if err := h.root.RemoveAll(rel); err != nil {
			h.recount()
			return fileError(err)
		}
		h.sp.Release(n + Block)
	case fi.Mode().IsRegular():
		if err := h.root.Remove(rel); err != nil {
			return fileError(err)
		}
		h.sp.Release(Blocks(fi.Size()))
	default:
		if err := h.root.Remove(rel); err != nil {
			return fileError(err)
		}
		h.sp.Release(Block)
	}
	return fileError(h.syncDir(path.Dir(rel)))
}

// Rename moves from to to in volume id (replacing a file or empty
// directory at to, as rename(2)).
func (s *Store) Rename(id, from, to string) error {
	rf, err := cleanPath(from)
	if err != nil {
		return err
	}
	rt, err := cleanPath(to)
	if err != nil {
		return err
	}
	if rf == "." || rt == "." {
		return fmt.Errorf("%w: the root of a volume cannot be renamed", host.ErrInvalid)
	}
	h, err := s.handle(id)
	if err != nil {
		return err
	}
	var old int64
	if fi, err := h.root.Lstat(rt); err == nil {
		if fi.Mode().IsRegular() {
			old = Blocks(fi.Size())
		} else {
			old = Block
		}
	}
	if err := h.root.Rename(rf, rt); err != nil {
		return fileError(err)
	}
	h.sp.Release(old)
	if err := h.syncDir(path.Dir(rt)); err != nil {
		return fileError(err)
	}
	return fileError(h.syncDir(path.Dir(rf)))
}

// mkdirAll makes directory rel and its missing parents, each accounted.
func (h *openVol) mkdirAll(rel string) error {
	if rel == "." {
		return nil
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		fi, err := h.root.Stat(p) // a symlink to a directory inside the volume is one
		if err == nil {
			if !fi.IsDir() {
				if i == len(parts)-1 {
					return guestproto.Errorf(guestproto.CodeExists, "%s exists and is not a directory", apiPath(p))
				}
				return guestproto.Errorf(guestproto.CodeNotDir, "%s is not a directory", apiPath(p))
			}
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fileError(err)
		}
		if err := h.sp.Reserve(Block); err != nil {
			return fmt.Errorf("mkdir %s: %w: the volume's limit is %d bytes", apiPath(p), host.ErrNoSpace, h.sp.Limit())
		}
		if err := h.root.Mkdir(p, 0o755); err != nil {
			h.sp.Release(Block)
			if errors.Is(err, fs.ErrExist) {
				continue // made meanwhile
			}
			return fileError(err)
		}
		if err := h.syncDir(path.Dir(p)); err != nil {
			return fileError(err)
		}
	}
	return nil
}

// syncDir flushes directory rel's entries.
func (h *openVol) syncDir(rel string) error {
	f, err := h.root.Open(rel)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// recount counts the volume's bytes again, after a failure left the count
// unknown.
func (h *openVol) recount() {
	if n, err := walkUsed(h.root); err == nil {
		h.sp.set(n)
	}
}
