package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Dir is a Store in a local directory: the object with key "a/b" is the
// file <root>/a/b. Puts are written to a temporary file in <root>/.tmp,
// flushed, renamed into place and the directory flushed, so a crash leaves
// either the old object or the new one, never a part (plus perhaps a
// temporary file, which OpenDir removes once it is a day old). Keys never
// start a component with '.', so .tmp is outside the key space.
//
// Directories made for keys are not removed when their last object is:
// removing one could race with a concurrent Put into it.
type Dir struct {
	root string
}

var _ Store = (*Dir)(nil)

const tmpDir = ".tmp"

// staleTmp is how old a temporary file must be before OpenDir removes it:
// far longer than any Put takes, so a Put of another process running now
// is not disturbed.
const staleTmp = 24 * time.Hour

// OpenDir opens (creating it if needed) the store rooted at dir.
func OpenDir(dir string) (*Dir, error) {
	root, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", dir, err)
	}
	if err := os.MkdirAll(filepath.Join(root, tmpDir), 0o700); err != nil {
		return nil, fmt.Errorf("open store %s: %w", root, err)
	}
	// Leftovers of Puts that crashed.
	if ents, err := os.ReadDir(filepath.Join(root, tmpDir)); err == nil {
		for _, e := range ents {
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > staleTmp {
				os.Remove(filepath.Join(root, tmpDir, e.Name()))
			}
		}
	}
	return &Dir{root: root}, nil
}

// Root is the directory the store lives in.
func (d *Dir) Root() string { return d.root }

func (d *Dir) String() string { return "file://" + d.root }

func (d *Dir) path(key string) (string, error) {
	if err := ValidKey(key); err != nil {
		return "", err
	}
	return filepath.Join(d.root, filepath.FromSlash(key)), nil
}

// classify turns a file-system error into the package's classes: a
// missing file is ErrNotFound; an I/O error or a full disk is the store
// failing (ErrUnavailable), as a 5xx would be from S3.
func classify(op, key string, err error) error {
	switch {
	case err == nil:
		return nil
	case (op == "put" || op == "create") && (errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.EISDIR)):
		// A key below another object's key, or one whose key is also a
		// directory of other keys: a file system cannot hold both.
		return fmt.Errorf("%s %s: %w: an object and a directory of objects cannot share a name in a directory store", op, key, ErrInvalidKey)
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR):
		return fmt.Errorf("%s %s: %w", op, key, ErrNotFound)
	case errors.Is(err, syscall.EIO), errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EROFS):
		return fmt.Errorf("%s %s: %w: %w", op, key, ErrUnavailable, err)
	default:
		return fmt.Errorf("%s %s: %w", op, key, err)
	}
}

var _ Creator = (*Dir)(nil)

func (d *Dir) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	return d.put(ctx, "put", key, r, size, false)
}

// Create links the object into place (link(2) does not replace an
// existing name, as rename(2) does).
func (d *Dir) Create(ctx context.Context, key string, r io.Reader, size int64) error {
	if size > MaxCreate {
		return fmt.Errorf("create %s: %d bytes, more than %d", key, size, MaxCreate)
	}
	return d.put(ctx, "create", key, r, size, true)
}

// put writes the object to a temporary file, flushes it and moves it into
// place: renamed over any object of that key, or with excl linked only if
// there is none (ErrExists).
func (d *Dir) put(ctx context.Context, op, key string, r io.Reader, size int64, excl bool) (err error) {
	p, err := d.path(key)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if size < 0 {
		return fmt.Errorf("%s %s: negative size %d", op, key, size)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s %s: %w", op, key, err)
	}
	f, err := os.CreateTemp(filepath.Join(d.root, tmpDir), "put-*")
	if err != nil {
		return classify(op, key, err)
	}
	linked := false
	defer func() {
		if err != nil {
			f.Close()
		}
		if err != nil || linked {
			os.Remove(f.Name())
		}
	}()
	// One byte more than size shows a reader that is too long.
	n, err := io.Copy(f, io.LimitReader(ctxReader{ctx, r}, size+1))
	if err != nil {
		return classify(op, key, err)
	}
	if n != size {
		return fmt.Errorf("%s %s: reader has %s bytes, size says %d", op, key, countText(n, size), size)
	}
	if err := f.Sync(); err != nil {
		return classify(op, key, err)
	}
	if err := f.Close(); err != nil {
		return classify(op, key, err)
	}
	parent := filepath.Dir(p)
	made, err := mkdirs(d.root, parent)
	if err != nil {
		return classify(op, key, err)
	}
	if excl {
		if err := os.Link(f.Name(), p); errors.Is(err, fs.ErrExist) {
			if fi, serr := os.Stat(p); serr == nil && fi.IsDir() {
				return classify(op, key, syscall.EISDIR)
			}
			return fmt.Errorf("%s %s: %w", op, key, ErrExists)
		} else if err != nil {
			return classify(op, key, err)
		}
		linked = true
	} else if err := os.Rename(f.Name(), p); err != nil {
		return classify(op, key, err)
	}
	// Flush the entry of the object and of every directory made for it.
	for _, dir := range append([]string{parent}, made...) {
		if err := syncDir(dir); err != nil {
			return classify(op, key, err)
		}
	}
	return nil
}

func countText(n, size int64) string {
	if n > size {
		return "more than " + fmt.Sprint(size)
	}
	return fmt.Sprint(n)
}

// mkdirs makes dir and its missing parents below root and returns the
// parents of those it made (whose entries must be flushed).
func mkdirs(root, dir string) (parents []string, err error) {
	var missing []string
	for p := dir; p != root && len(p) > len(root); p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil {
			break
		}
		missing = append(missing, p)
	}
	if len(missing) == 0 {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	for _, p := range missing {
		parents = append(parents, filepath.Dir(p))
	}
	return parents, nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// ctxReader stops a long copy when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func (d *Dir) open(op, key string) (*os.File, os.FileInfo, error) {
	p, err := d.path(key)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, nil, classify(op, key, err)
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = syscall.EISDIR
	}
	if err != nil {
		f.Close()
		return nil, nil, classify(op, key, err)
	}
	return f, fi, nil
}

func (d *Dir) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	f, _, err := d.open("get", key)
	if err != nil {
		return nil, err
	}
	return f, nil
}

func (d *Dir) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if off < 0 || n <= 0 {
		return nil, fmt.Errorf("get %s [%d, +%d): %w", key, off, n, ErrInvalidRange)
	}
	f, fi, err := d.open("get", key)
	if err != nil {
		return nil, err
	}
	if off >= fi.Size() {
		f.Close()
		return nil, fmt.Errorf("get %s [%d, +%d) of %d bytes: %w", key, off, n, fi.Size(), ErrInvalidRange)
	}
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(f, off, n), f}, nil
}

func (d *Dir) Stat(ctx context.Context, key string) (Info, error) {
	p, err := d.path(key)
	if err != nil {
		return Info{}, fmt.Errorf("stat: %w", err)
	}
	fi, err := os.Stat(p)
	if err == nil && !fi.Mode().IsRegular() {
		err = syscall.EISDIR
	}
	if err != nil {
		return Info{}, classify("stat", key, err)
	}
	return Info{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

func (d *Dir) Delete(ctx context.Context, key string) error {
	p, err := d.path(key)
	if err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return classify("delete", key, err)
	}
	return nil
}

// List walks the deepest directory that holds every key with the prefix,
// collects the matching keys and yields them sorted (a directory walk's
// order differs from the keys' order: "a/b" sorts after "a-c").
func (d *Dir) List(ctx context.Context, prefix string) iter.Seq2[Info, error] {
	if err := validPrefix(prefix); err != nil {
		return errSeq(fmt.Errorf("list: %w", err))
	}
	start := d.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		start = filepath.Join(d.root, filepath.FromSlash(prefix[:i]))
	}
	return func(yield func(Info, error) bool) {
		var infos []Info
		err := filepath.WalkDir(start, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				if p == start && errors.Is(err, fs.ErrNotExist) {
					return fs.SkipAll
				}
				return err
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			rel, _ := filepath.Rel(d.root, p)
			key := filepath.ToSlash(rel)
			if e.IsDir() {
				if p != start && (strings.HasPrefix(e.Name(), ".") || !strings.HasPrefix(key+"/", prefix) && !strings.HasPrefix(prefix, key+"/")) {
					return fs.SkipDir
				}
				return nil
			}
			if !e.Type().IsRegular() || strings.HasPrefix(e.Name(), ".") || !strings.HasPrefix(key, prefix) {
				return nil
			}
			fi, err := e.Info()
			if errors.Is(err, fs.ErrNotExist) {
				return nil // deleted while listing
			}
			if err != nil {
				return err
			}
			infos = append(infos, Info{Key: key, Size: fi.Size(), ModTime: fi.ModTime()})
			return nil
		})
		if err != nil {
			yield(Info{}, classify("list", prefix, err))
			return
		}
		slices.SortFunc(infos, func(a, b Info) int { return strings.Compare(a.Key, b.Key) })
		for _, in := range infos {
			if !yield(in, nil) {
				return
			}
		}
	}
}
