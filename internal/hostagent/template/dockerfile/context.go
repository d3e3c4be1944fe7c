package dockerfile

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	"golang.org/x/sys/unix"
)

// DefaultMaxContextBytes is the default bound of a build context's
// unpacked file contents.
const DefaultMaxContextBytes = 4 << 30

// maxContextEntries bounds a build context's entries.
const maxContextEntries = 1 << 20

// maxLinkHops bounds the symlinks followed resolving one COPY source.
const maxLinkHops = 40

// buildContext is a build context unpacked in a private directory.
type buildContext struct {
	root string
}

// openContext unpacks the tar (plain or gzip) at tarPath into dir (which
// must exist and be empty), leaving out what .dockerignore excludes.
// Unsafe entries fail it with ErrInvalid errors.
func openContext(ctx context.Context, tarPath, dir string, maxBytes int64) (*buildContext, error) {
	var pm *patternmatcher.PatternMatcher
	err := readTar(tarPath, func(tr *tar.Reader, h *tar.Header) (bool, error) {
		if cleanName(h.Name) != ".dockerignore" || (h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeRegA) {
			return true, nil
		}
		if h.Size > 1<<20 {
			return false, invalidf("build context: .dockerignore is larger than 1 MiB")
		}
		patterns, err := ignorefile.ReadAll(tr)
		if err != nil {
			return false, invalidf("build context: .dockerignore: %v", err)
		}
		if pm, err = patternmatcher.New(patterns); err != nil {
			return false, invalidf("build context: .dockerignore: %v", err)
		}
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	c := &buildContext{root: dir}
	var total int64
	entries := 0
	err = readTar(tarPath, func(tr *tar.Reader, h *tar.Header) (bool, error) {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		entries++
		if entries > maxContextEntries {
			return false, invalidf("build context: more than %d entries", maxContextEntries)
		}
		if strings.HasPrefix(h.Name, "/") {
			return false, invalidf("build context: entry %q has an absolute path", cut(h.Name, 200))
		}
		name := cleanName(h.Name)
		if name == "" {
			return true, nil
		}
		if !local(name) {
			return false, invalidf("build context: entry %q is outside the context (..)", cut(h.Name, 200))
		}
		if pm != nil {
			if skip, err := pm.MatchesOrParentMatches(name); err != nil {
				return false, invalidf("build context: .dockerignore: %v", err)
			} else if skip {
				return true, nil
			}
		}
		if h.Typeflag == tar.TypeReg || h.Typeflag == tar.TypeRegA {
			total += h.Size
			if total > maxBytes {
				return false, invalidf("build context: larger than %d MiB unpacked", maxBytes>>20)
			}
		}
		return true, c.put(tr, h, name)
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// readTar calls fn for each entry of the tar (plain or gzip) at p until fn
// returns false or an error.
func readTar(p string, fn func(*tar.Reader, *tar.Header) (bool, error)) error {
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("open build context: %w", err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return invalidf("build context: not a valid gzip file: %v", err)
		}
		defer zr.Close()
		r = zr
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return invalidf("build context: not a valid tar file: %v", err)
		}
		more, err := fn(tr, h)
		if err != nil || !more {
			return err
		}
	}
}

// cleanName is a tar entry's name cleaned, "" for the root.
func cleanName(n string) string {
	n = path.Clean(strings.TrimLeft(n, "/"))
	if n == "." {
		return ""
	}
	return n
}

// local reports whether the clean relative path p stays below its root.
func local(p string) bool {
	return p != ".." && !strings.HasPrefix(p, "../") && !path.IsAbs(p)
}

// put creates entry h, named name (clean, local), in the context.
func (c *buildContext) put(tr *tar.Reader, h *tar.Header, name string) error {
	if err := c.mkParents(name); err != nil {
		return err
	}
	host := filepath.Join(c.root, name)
	mode := uint32(h.Mode & 07777)
	switch h.Typeflag {
	case tar.TypeDir:
		fi, err := os.Lstat(host)
		if err == nil && !fi.IsDir() {
			if err := os.Remove(host); err != nil {
				return err
			}
		}
		if err := os.Mkdir(host, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("unpack build context: %w", err)
		}
		return unix.Chmod(host, mode|0o700)
	case tar.TypeReg, tar.TypeRegA:
		if err := os.RemoveAll(host); err != nil {
			return err
		}
		f, err := os.OpenFile(host, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("unpack build context: %w", err)
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return invalidf("build context: reading %q: %v", cut(name, 200), err)
		}
		if err := unix.Chmod(host, mode); err != nil {
			return err
		}
		return os.Chtimes(host, h.ModTime, h.ModTime)
	case tar.TypeSymlink:
		if err := os.RemoveAll(host); err != nil {
			return err
		}
		// Kept as written; resolve scopes it to the context when a COPY
		// source goes through it.
		return os.Symlink(h.Linkname, host)
	case tar.TypeLink:
		target := cleanName(h.Linkname)
		if target == "" || !local(target) {
			return invalidf("build context: hard link %q points outside the context", cut(h.Name, 200))
		}
		if err := c.noSymlinkIn(target); err != nil {
			return invalidf("build context: hard link %q: its target %q is inside a symlink", cut(h.Name, 200), cut(h.Linkname, 200))
		}
		fi, err := os.Lstat(filepath.Join(c.root, target))
		if err != nil || !fi.Mode().IsRegular() {
			return invalidf("build context: hard link %q: its target %q is not a file before it in the tar", cut(h.Name, 200), cut(h.Linkname, 200))
		}
		if err := os.RemoveAll(host); err != nil {
			return err
		}
		return os.Link(filepath.Join(c.root, target), host)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return invalidf("build context: %q is a device or fifo; only files, directories and symlinks are allowed", cut(h.Name, 200))
	default:
		return invalidf("build context: %q has an unsupported tar entry type %q", cut(h.Name, 200), h.Typeflag)
	}
}

// mkParents creates the missing parents of name, refusing to go through a
// symlink (an entry "link/x" with "link" pointing out of the context would
// write outside it).
func (c *buildContext) mkParents(name string) error {
	dir := c.root
	parts := strings.Split(name, "/")
	for _, p := range parts[:len(parts)-1] {
		dir = filepath.Join(dir, p)
		fi, err := os.Lstat(dir)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(dir, 0o755); err != nil {
				return fmt.Errorf("unpack build context: %w", err)
			}
		case err != nil:
			return fmt.Errorf("unpack build context: %w", err)
		case fi.Mode()&fs.ModeSymlink != 0:
			return invalidf("build context: entry %q is inside a symlink", cut(name, 200))
		case !fi.IsDir():
			return invalidf("build context: entry %q is inside a file", cut(name, 200))
		}
	}
	return nil
}

// noSymlinkIn fails if a directory above name (clean, local) is a symlink:
// a path through one could lead out of the context.
func (c *buildContext) noSymlinkIn(name string) error {
	dir := c.root
	parts := strings.Split(name, "/")
	for _, p := range parts[:len(parts)-1] {
		dir = filepath.Join(dir, p)
		fi, err := os.Lstat(dir)
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return errors.New("inside a symlink")
		}
	}
	return nil
}

// follow resolves the context path rel (clean, local) through symlinks,
// each scoped to the context: an absolute target starts at the context's
// root, and a target that climbs above the root is an error.
func (c *buildContext) follow(rel string) (string, error) {
	parts := strings.Split(rel, "/")
	resolved := ""
	hops := 0
	for len(parts) > 0 {
		p := parts[0]
		parts = parts[1:]
		switch p {
		case "", ".":
			continue
		case "..":
			if resolved == "" {
				return "", fmt.Errorf("%s: a symlink points outside the build context", rel)
			}
			resolved = strings.TrimSuffix(path.Dir(resolved), ".")
			continue
		}
		next := path.Join(resolved, p)
		fi, err := os.Lstat(filepath.Join(c.root, next))
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%s: no such file or directory in the build context", rel)
		}
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			resolved = next
			continue
		}
		if hops++; hops > maxLinkHops {
			return "", fmt.Errorf("%s: too many levels of symlinks", rel)
		}
		target, err := os.Readlink(filepath.Join(c.root, next))
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(target, "/") {
			resolved = ""
		}
		parts = append(strings.Split(target, "/"), parts...)
	}
	return resolved, nil
}

// copySpec is a COPY or ADD with its sources resolved. Its JSON form (all
// but the entries, whose hash is Hash) is part of the step's cache key.
type copySpec struct {
	Add    bool     `json:"add,omitempty"`
	Srcs   []string `json:"srcs"`
	Dst    string   `json:"dst"`
	DstDir bool     `json:"dst_dir,omitempty"`
	Chown  string   `json:"chown,omitempty"`
	Chmod  *int64   `json:"chmod,omitempty"`
	// Hash is the sha256 of what is copied: the entries' names, types,
	// modes, contents and symlink targets.
	Hash    string      `json:"hash"`
	entries []copyEntry `json:"-"`
}

// copyEntry is one thing a copy writes.
type copyEntry struct {
	// Rel is the entry's path below the destination directory; for a
	// Single file, its base name (or nothing: the destination itself).
	Rel    string `json:"rel"`
	Type   string `json:"type"` // "file", "dir", "symlink" or "archive"
	Mode   int64  `json:"mode"`
	Link   string `json:"link,omitempty"`
	Sum    string `json:"sum,omitempty"`
	Single bool   `json:"single,omitempty"`
	host   string
	size   int64
	mtime  time.Time
}

// resolve finds cs's sources, fills in its entries and their hash.
func (c *buildContext) resolve(ctx context.Context, cs *copySpec) error {
	var matches []string // context paths, as named (not resolved)
	for _, src := range cs.Srcs {
		p := path.Clean(src)
		if path.IsAbs(p) {
			p = strings.TrimLeft(p, "/")
		}
		if p == "" || p == "." {
			p = ""
		}
		if !local(p) && p != "" {
			return fmt.Errorf("%s is outside the build context", cut(src, 200))
		}
		if hasWildcard(p) {
			m, err := c.glob(p)
			if err != nil {
				return err
			}
			if len(m) == 0 {
				return fmt.Errorf("no file in the build context matches %s", cut(src, 200))
			}
			matches = append(matches, m...)
			continue
		}
		matches = append(matches, p)
	}
	if len(matches) > 1 && !cs.DstDir {
		return fmt.Errorf("with more than one source the destination must be a directory ending in /")
	}
	sawDir := false
	for _, m := range matches {
		real, err := c.follow(m)
		if err != nil {
			return err
		}
		host := filepath.Join(c.root, real)
		fi, err := os.Lstat(host)
		if err != nil {
			return err
		}
		if fi.IsDir() {
			sawDir = true
			if err := c.addDir(ctx, cs, host); err != nil {
				return err
			}
			continue
		}
		e, err := entryOf(host, path.Base("/"+m), fi)
		if err != nil {
			return err
		}
		if cs.Add {
			kind, err := archiveKind(host)
			if err != nil {
				return fmt.Errorf("%s: %v", cut(m, 200), err)
			}
			if kind != "" {
				e.Type = "archive"
			}
		}
		e.Single = len(matches) == 1 && !cs.DstDir && e.Type == "file"
		cs.entries = append(cs.entries, e)
	}
	if sawDir || len(cs.entries) == 1 && cs.entries[0].Type == "archive" {
		// A directory's contents or an archive: the destination is a directory.
		cs.DstDir = true
	}
	b, err := json.Marshal(cs.entries)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	cs.Hash = hex.EncodeToString(sum[:])
	return nil
}

// addDir adds the contents of the context directory host (not itself).
func (c *buildContext) addDir(ctx context.Context, cs *copySpec, host string) error {
	return filepath.WalkDir(host, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == host {
			return nil
		}
		rel, err := filepath.Rel(host, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		e, err := entryOf(p, filepath.ToSlash(rel), fi)
		if err != nil {
			return err
		}
		cs.entries = append(cs.entries, e)
		return nil
	})
}

// entryOf describes the context file host, to be copied as rel.
func entryOf(host, rel string, fi fs.FileInfo) (copyEntry, error) {
	var st unix.Stat_t
	if err := unix.Lstat(host, &st); err != nil {
		return copyEntry{}, err
	}
	e := copyEntry{Rel: rel, Mode: int64(st.Mode & 07777), host: host, mtime: fi.ModTime()}
	switch {
	case fi.IsDir():
		e.Type = "dir"
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = "symlink"
		l, err := os.Readlink(host)
		if err != nil {
			return e, err
		}
		e.Link = l
	case fi.Mode().IsRegular():
		e.Type, e.size = "file", fi.Size()
		sum, err := fileSum(host)
		if err != nil {
			return e, err
		}
		e.Sum = sum
	default:
		return e, fmt.Errorf("%s is not a file, directory or symlink", rel)
	}
	return e, nil
}

func fileSum(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func hasWildcard(p string) bool { return strings.ContainsAny(p, "*?[\\") }

// glob returns the context paths matching pattern (each path component
// matched as by path.Match), in lexical order, not looking into symlinked
// directories.
func (c *buildContext) glob(pattern string) ([]string, error) {
	if _, err := path.Match(pattern, ""); err != nil {
		return nil, fmt.Errorf("bad pattern %s", cut(pattern, 200))
	}
	depth := strings.Count(pattern, "/") + 1
	var out []string
	err := filepath.WalkDir(c.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == c.root {
			return nil
		}
		rel, _ := filepath.Rel(c.root, p)
		rel = filepath.ToSlash(rel)
		n := strings.Count(rel, "/") + 1
		if ok, _ := path.Match(pattern, rel); ok && n == depth {
			out = append(out, rel)
		}
		if d.IsDir() && n >= depth {
			return filepath.SkipDir
		}
		return nil
	})
	return out, err
}

// archiveKind says whether the file p is a tar archive ADD unpacks: "tar",
// "gzip" or "bzip2"; "" when it is not an archive. Archives compressed
// otherwise (xz, zstd) are an error rather than copied as they are.
func archiveKind(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	head := make([]byte, 6)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	var kind string
	var r io.Reader
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(f)
		if err != nil {
			return "", nil
		}
		kind, r = "gzip", zr
	case bytes.HasPrefix(head, []byte("BZh")):
		kind, r = "bzip2", bzip2.NewReader(f)
	case bytes.HasPrefix(head, []byte{0xfd, '7', 'z', 'X', 'Z', 0}),
		bytes.HasPrefix(head, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return "", errors.New("ADD unpacks tar archives that are plain, gzip- or bzip2-compressed; this one is xz or zstd: COPY it and unpack it with RUN")
	default:
		kind, r = "tar", f
	}
	block := make([]byte, 512)
	if _, err := io.ReadFull(r, block); err != nil {
		return "", nil
	}
	if string(block[257:262]) != "ustar" {
		return "", nil
	}
	return kind, nil
}
