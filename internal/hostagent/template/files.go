package template

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// hashCache remembers file hashes by (path, size, mtime, inode), in memory
// and in a JSON file that outlives the process, so that checking a template
// for staleness (on every create) costs a stat per input, not a read of a
// 4 GiB root filesystem, nor of the cache file.
type hashCache struct {
	path string

	mu      sync.Mutex
	entries map[string]hashEntry // nil until loaded from path
}

type hashEntry struct {
	Size  int64  `json:"size"`
	Mtime int64  `json:"mtime_ns"`
	Ino   uint64 `json:"ino"`
	Hash  string `json:"sha256"`
}

func (c *hashCache) hash(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	ino := uint64(0)
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		ino = s.Ino
	}
	key := hashEntry{Size: st.Size(), Mtime: st.ModTime().UnixNano(), Ino: ino}
	abs, _ := filepath.Abs(path)

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[string]hashEntry{}
		if c.path != "" {
			if b, err := os.ReadFile(c.path); err == nil {
				json.Unmarshal(b, &c.entries)
			}
		}
	}
	if e, ok := c.entries[abs]; ok && e.Size == key.Size && e.Mtime == key.Mtime && e.Ino == key.Ino {
		return e.Hash, nil
	}
	h, err := sparseHash(path)
	if err != nil {
		return "", err
	}
	key.Hash = h
	c.entries[abs] = key
	if c.path != "" {
		if b, err := json.Marshal(c.entries); err == nil {
			tmp := c.path + ".tmp"
			if os.WriteFile(tmp, b, 0o644) == nil {
				os.Rename(tmp, c.path)
			}
		}
	}
	return h, nil
}

// sparseHash is a SHA-256 over a file's data extents and their offsets, so
// that holes cost nothing to hash. Two files with the same bytes but
// different hole layouts may hash differently; that only causes a re-bake.
func sparseHash(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	var hdr [16]byte
	binary.BigEndian.PutUint64(hdr[:8], uint64(st.Size()))
	h.Write(hdr[:8])
	err = forEachExtent(f, st.Size(), func(off, n int64) error {
		binary.BigEndian.PutUint64(hdr[:8], uint64(off))
		binary.BigEndian.PutUint64(hdr[8:], uint64(n))
		h.Write(hdr[:])
		_, err := io.Copy(h, io.NewSectionReader(f, off, n))
		return err
	})
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// forEachExtent calls fn for each data extent of f (SEEK_DATA/SEEK_HOLE).
func forEachExtent(f *os.File, size int64, fn func(off, n int64) error) error {
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole remains
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if err := fn(data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// copySparse copies src to dst (created, must not exist) keeping holes.
func copySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	err = forEachExtent(in, st.Size(), func(off, n int64) error {
		_, err := io.Copy(io.NewOffsetWriter(out, off), io.NewSectionReader(in, off, n))
		return err
	})
	if err == nil {
		err = out.Truncate(st.Size())
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return nil
}
