package chunkstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
)

// Seed is a local file that a download takes chunks from instead of
// fetching them: a chunk of the set whose hash is one of the seed's is
// reflinked (FICLONERANGE) from the seed, or copied where the file system
// cannot, wherever it is in the seed. Chunks are ChunkSize bytes at
// multiples of ChunkSize, as in a manifest; Chunks[i] is the hash of the
// seed's chunk i ("" if it is zeros, or unknown). A seed must stay as its
// index says while the download runs: a reflinked chunk is taken on trust
// (reading it back to check it would cost what reflinking saves), a copied
// one is checked, and fetched from the store if it does not match. A
// caller that needs certainty verifies the files afterwards (the host
// agent checks every file against its own checksums).
type Seed struct {
	Path string
	// File, if not nil, is the seed opened already (Path is then only its
	// name): a caller that checked the open file against its index passes
	// it, so that the file read is the one checked even if Path is
	// replaced meanwhile. The caller closes it.
	File      *os.File
	ChunkSize int64
	Chunks    []string
	// Current says the caller proved Chunks to be File's as it is (an
	// index tied to the file's fingerprint, checked again after File was
	// opened), so an upload that takes the seed as a base (UploadOptions.
	// Bases) uses a base chunk's bytes as what its hash names without
	// hashing them again. Without it each base chunk used is hashed and
	// not used if it does not match.
	Current bool
}

// open returns the seed's file and whether the caller must close it.
func (sd Seed) open() (*os.File, bool, error) {
	if sd.File != nil {
		return sd.File, false, nil
	}
	f, err := os.Open(sd.Path)
	return f, err == nil, err
}

// SeedOf is a seed of the local file path whose chunk hashes f lists (an
// index made by Hash, or the manifest of the file's own upload).
func SeedOf(path string, chunkSize int64, f File) Seed {
	return Seed{Path: path, ChunkSize: chunkSize, Chunks: f.Chunks}
}

// DownloadStats counts what a download did.
type DownloadStats struct {
	Chunks        int   // chunks of all files
	ZeroChunks    int   // "" in the manifest: left a hole
	ChunksFetched int   // read from the object store
	BytesFetched  int64 // their bytes
	ChunksSeeded  int   // taken from a local seed
	BytesSeeded   int64 // their bytes
	ChunksCloned  int   // of the seeded ones, reflinked rather than copied
	// ChunksDelta were made from a base and a patch (see Delta); what
	// they read from the store (patches, bases no seed held) counts in
	// BytesFetched, not in ChunksFetched.
	ChunksDelta int
}

func (d *DownloadStats) add(o DownloadStats) {
	d.Chunks += o.Chunks
	d.ZeroChunks += o.ZeroChunks
	d.ChunksFetched += o.ChunksFetched
	d.BytesFetched += o.BytesFetched
	d.ChunksSeeded += o.ChunksSeeded
	d.BytesSeeded += o.BytesSeeded
	d.ChunksCloned += o.ChunksCloned
	d.ChunksDelta += o.ChunksDelta
}

// Download restores the files of set name into dir (made if missing),
// replacing files of the same names, and returns the manifest. Files are
// sparse: a zero chunk, and a zero 4 KiB page inside a chunk, is a hole.
// Each file is written under a temporary name, flushed and renamed, so a
// file of that name is either the old one or complete. Chunks are checked
// against their hashes.
func (s *Store) Download(ctx context.Context, name, dir string) (*Manifest, error) {
	m, err := s.Manifest(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("download: %w", err)
	}
	if err := s.DownloadManifest(ctx, m, dir); err != nil {
		return nil, err
	}
	return m, nil
}

// DownloadManifest is Download of the files m lists (a manifest read
// earlier with Manifest): what the caller read in m.Meta describes exactly
// these files, even if the set was replaced since. A chunk gone from the
// store meanwhile (the set deleted, then garbage collected) fails it with
// objstore.ErrNotFound.
func (s *Store) DownloadManifest(ctx context.Context, m *Manifest, dir string) error {
	_, err := s.DownloadSeeded(ctx, m, dir, nil)
	return err
}

// DownloadSeeded is DownloadManifest that takes every chunk one of seeds
// holds from there (see Seed) and fetches only the others; seeds of
// another chunk size than m's are not used. It reports what came from
// where, also when it fails (what was done until then).
func (s *Store) DownloadSeeded(ctx context.Context, m *Manifest, dir string, seeds []Seed) (DownloadStats, error) {
	var st DownloadStats
	if err := m.check(); err != nil {
		return st, fmt.Errorf("download %s: %w", m.Name, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return st, fmt.Errorf("download %s: %w", m.Name, err)
	}
	src := openSeeds(seeds, m.ChunkSize)
	defer src.close()
	// The files at once, so that the small ones (a capture's state, its
	// root file system's few chunks of its own) and each file's flush
	// overlap the memory image's fetches rather than wait for them.
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	for _, f := range m.Files {
		g.Go(func() error {
			fst, err := s.downloadFile(gctx, m, f, dir, src)
			mu.Lock()
			st.add(fst)
			mu.Unlock()
			if err != nil {
				return fmt.Errorf("download %s: %s: %w", m.Name, f.Name, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return st, err
	}
	d, err := os.Open(dir)
	if err == nil {
		err = d.Sync()
		d.Close()
	}
	if err != nil {
		return st, fmt.Errorf("download %s: %w", m.Name, err)
	}
	return st, nil
}

// seedSet finds chunks by hash in a download's seeds.
type seedSet struct {
	files   []*os.File
	current []bool     // by files: Seed.Current
	owned   []*os.File // opened here: closed by close
	at      map[string]seedRef
}

type seedRef struct {
	file int
	off  int64
}

// openSeeds opens the seeds of chunk size cs; a seed that cannot be
// opened is skipped (its chunks are fetched).
func openSeeds(seeds []Seed, cs int64) *seedSet {
	ss := &seedSet{at: map[string]seedRef{}}
	for _, sd := range seeds {
		if sd.ChunkSize != cs || len(sd.Chunks) == 0 {
			continue
		}
		f, owned, err := sd.open()
		if err != nil {
			continue
		}
		if owned {
			ss.owned = append(ss.owned, f)
		}
		ss.files = append(ss.files, f)
		ss.current = append(ss.current, sd.Current && sd.File != nil)
		for i, h := range sd.Chunks {
			if h == "" {
				continue
			}
			if _, dup := ss.at[h]; !dup {
				ss.at[h] = seedRef{file: len(ss.files) - 1, off: int64(i) * cs}
			}
		}
	}
	return ss
}

func (ss *seedSet) close() {
	for _, f := range ss.owned {
		f.Close()
	}
}

// take writes chunk hash (n bytes) at off of dst from a seed, if one
// holds it: reflinked if it can be, else read into buf, checked and
// written. It reports whether it did and whether it reflinked.
func (ss *seedSet) take(dst *os.File, hash string, off int64, buf []byte) (ok, cloned bool, err error) {
	ref, found := ss.at[hash]
	if !found {
		return false, false, nil
	}
	src := ss.files[ref.file]
	n := int64(len(buf))
	if n%pageSize == 0 {
		err := unix.IoctlFileCloneRange(int(dst.Fd()), &unix.FileCloneRange{
			Src_fd: int64(src.Fd()), Src_offset: uint64(ref.off), Src_length: uint64(n), Dest_offset: uint64(off),
		})
		if err == nil {
			return true, true, nil
		}
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EXDEV) && !errors.Is(err, unix.EINVAL) &&
			!errors.Is(err, unix.ENOTTY) && !errors.Is(err, unix.ENOSYS) {
			return false, false, fmt.Errorf("reflink chunk %s from %s: %w", hash, src.Name(), err)
		}
	}
	if _, err := src.ReadAt(buf, ref.off); err != nil && !errors.Is(err, io.EOF) {
		return false, false, fmt.Errorf("read chunk %s from %s: %w", hash, src.Name(), err)
	}
	if sum := sha256.Sum256(buf); hex.EncodeToString(sum[:]) != hash {
		return false, false, nil // the seed changed: fetch it
	}
	return true, false, writeSparse(dst, buf, off)
}

// read reads chunk hash (len(buf) bytes) from a seed that holds it into
// buf and checks it; false if no seed holds it (or the seed changed). The
// chunk of a seed proven current (Seed.Current) is not hashed: trusted
// reports that (the caller checks what it makes of it).
func (ss *seedSet) read(hash string, buf []byte) (ok, trusted bool) {
	ref, found := ss.at[hash]
	if !found {
		return false, false
	}
	if _, err := ss.files[ref.file].ReadAt(buf, ref.off); err != nil && !errors.Is(err, io.EOF) {
		return false, false
	}
	if ss.current[ref.file] {
		return true, true
	}
	sum := sha256.Sum256(buf)
	return hex.EncodeToString(sum[:]) == hash, false
}

func (s *Store) downloadFile(ctx context.Context, m *Manifest, f File, dir string, seeds *seedSet) (st DownloadStats, err error) {
	tmp, err := os.CreateTemp(dir, "."+f.Name+".part-*")
	if err != nil {
		return st, err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := tmp.Truncate(f.Size); err != nil {
		return st, err
	}
	st.Chunks = len(f.Chunks)
	var mu sync.Mutex
	count := func(fn func(*DownloadStats)) {
		mu.Lock()
		fn(&st)
		mu.Unlock()
	}
	g, gctx := errgroup.WithContext(ctx)
	idx := make(chan int)
	g.Go(func() error {
		defer close(idx)
		for i, h := range f.Chunks {
			if h == "" {
				count(func(st *DownloadStats) { st.ZeroChunks++ })
				continue
			}
			select {
			case idx <- i:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	for range s.cfg.Workers {
		g.Go(func() error {
			buf := make([]byte, m.ChunkSize)
			for i := range idx {
				n := chunkLen(f.Size, m.ChunkSize, i)
				off := int64(i) * m.ChunkSize
				ok, cloned, err := seeds.take(tmp, f.Chunks[i], off, buf[:n])
				if err != nil {
					return err
				}
				if ok {
					count(func(st *DownloadStats) {
						st.ChunksSeeded++
						st.BytesSeeded += n
						if cloned {
							st.ChunksCloned++
						}
					})
					continue
				}
				if d, ok := f.Deltas[i]; ok {
					got, err := s.build(gctx, seeds, f.Chunks[i], d, buf[:n])
					if err != nil {
						return err
					}
					if err := writeSparse(tmp, buf[:n], off); err != nil {
						return err
					}
					count(func(st *DownloadStats) { st.ChunksDelta++; st.BytesFetched += got })
					continue
				}
				if err := s.fetch(gctx, f.Chunks[i], buf[:n]); err != nil {
					return err
				}
				if err := writeSparse(tmp, buf[:n], off); err != nil {
					return err
				}
				count(func(st *DownloadStats) { st.ChunksFetched++; st.BytesFetched += n })
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return st, err
	}
	if err := tmp.Sync(); err != nil {
		return st, err
	}
	if err := tmp.Close(); err != nil {
		return st, err
	}
	return st, os.Rename(tmp.Name(), filepath.Join(dir, f.Name))
}

// fetch reads chunk hash, of exactly len(buf) bytes, into buf and checks
// its hash.
func (s *Store) fetch(ctx context.Context, hash string, buf []byte) error {
	rc, err := s.objs.Get(ctx, chunkKey(hash))
	if err != nil {
		return fmt.Errorf("chunk %s: %w", hash, err)
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, buf); err != nil {
		return fmt.Errorf("chunk %s: %w", hash, err)
	}
	if n, _ := rc.Read(make([]byte, 1)); n > 0 {
		return fmt.Errorf("chunk %s: longer than the %d bytes the manifest says", hash, len(buf))
	}
	if sum := sha256.Sum256(buf); hex.EncodeToString(sum[:]) != hash {
		return fmt.Errorf("chunk %s: content does not match its hash", hash)
	}
	return nil
}

const pageSize = 4096

// writeSparse writes buf at off, leaving its zero pages unwritten (holes
// in a fresh file).
func writeSparse(f *os.File, buf []byte, off int64) error {
	for i := 0; i < len(buf); {
		for i < len(buf) && isZero(buf[i:min(i+pageSize, len(buf))]) {
			i += pageSize
		}
		j := i
		for j < len(buf) && !isZero(buf[j:min(j+pageSize, len(buf))]) {
			j += pageSize
		}
		if j > i {
			if _, err := f.WriteAt(buf[i:min(j, len(buf))], off+int64(i)); err != nil {
				return err
			}
		}
		i = j
	}
	return nil
}

func isZero(b []byte) bool { return bytes.Equal(b, zeros[:len(b)]) }
