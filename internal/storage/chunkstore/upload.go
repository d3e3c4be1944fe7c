package chunkstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/storage/objstore"
)

// Stats counts what an Upload did.
type Stats struct {
	ChunksTotal    int // chunks of all files
	ChunksDone     int // of those, handled so far (for progress)
	ChunksUploaded int // sent to the store
	ChunksShared   int // already in the store (or twice in this upload): not sent
	ZeroChunks     int // all zeros: not stored
	// ChunksDelta were stored as a patch over a base chunk (delta.go):
	// only the pages that differ were sent, counted in BytesUploaded.
	ChunksDelta int
	// ChunksUnread were known to equal their base's chunk (same disk
	// blocks: see extents.go) and not read; they count among the others.
	ChunksUnread  int
	BytesTotal    int64 // sum of the files' sizes
	BytesUploaded int64 // bytes sent: whole chunks and patches
	// How long its steps took: SetupDur until the chunks start (the
	// lease, the known sets' manifests, the extent maps, which flush the
	// files), ChunksDur the chunks, ManifestDur the manifest.
	SetupDur, ChunksDur, ManifestDur time.Duration
}

// Upload stores the files (file name in the set → path on disk) as the
// set name, replacing a set of that name, and returns its manifest. The
// files must not change while it runs. progress, if not nil, is called
// after each chunk, one call at a time. The manifest is written last: if
// Upload fails, the set is as it was (some chunks may have been stored;
// GC removes them if nothing comes to use them).
func (s *Store) Upload(ctx context.Context, name string, files map[string]string, progress func(Stats)) (*Manifest, Stats, error) {
	return s.UploadMeta(ctx, name, files, nil, progress)
}

// UploadMeta is Upload that writes meta (a JSON value of at most MaxMeta
// bytes, or nil) into the manifest as its Meta.
func (s *Store) UploadMeta(ctx context.Context, name string, files map[string]string, meta json.RawMessage, progress func(Stats)) (*Manifest, Stats, error) {
	return s.UploadWith(ctx, name, files, UploadOptions{Meta: meta}, progress)
}

// UploadOptions are the options of UploadWith.
type UploadOptions struct {
	// Meta is written into the manifest as its Meta: a JSON value of at
	// most MaxMeta bytes, or nil.
	Meta json.RawMessage
	// Bases maps a file's name to a local file the uploaded one was made
	// from (a capture's template file, with its chunk index): a chunk the
	// store lacks that differs from the base's chunk at the same offset
	// (or from zeros) in fewer than half its pages is stored as a patch of
	// those pages (a Delta), if the store holds the base chunk. The base
	// must stay as its index says while the upload runs; a chunk of it
	// that does not match its hash is not used (a base whose Seed is
	// Current is not hashed: the caller proved its index).
	// A patch is put without asking the store for it or for the chunk
	// (see chunk).
	Bases map[string]Seed
	// Known names sets in the store (a capture's template's) whose
	// objects the upload takes to be there without asking the store for
	// each: their manifests are read once the upload's lease is taken, when
	// every object a manifest names is in the store and stays there until
	// the upload ends (see GC). A set that cannot be read is ignored.
	Known []string
	// IfAbsent writes the manifest only if the store holds no set of this
	// name: otherwise the upload fails with an error wrapping
	// objstore.ErrExists and leaves the set as it was (the chunks it
	// stored are GC's, unless the set that is there names them). Hosts
	// uploading one set at once so agree on the first. A store that is no
	// objstore.Creator (or an S3 server that ignores conditional PUTs)
	// replaces the set, as without IfAbsent.
	IfAbsent bool
}

// UploadWith is Upload with options.
func (s *Store) UploadWith(ctx context.Context, name string, files map[string]string, opts UploadOptions, progress func(Stats)) (*Manifest, Stats, error) {
	meta := opts.Meta
	if err := validName(name); err != nil {
		return nil, Stats{}, fmt.Errorf("upload: %w", err)
	}
	if len(meta) > MaxMeta || (meta != nil && !json.Valid(meta)) {
		return nil, Stats{}, fmt.Errorf("upload %s: metadata of %d bytes: want valid JSON of at most %d", name, len(meta), MaxMeta)
	}
	names, err := fileNames(files)
	if err != nil {
		return nil, Stats{}, fmt.Errorf("upload %s: %w", name, err)
	}
	fds, sizes, err := openFiles(names, files)
	if err != nil {
		return nil, Stats{}, fmt.Errorf("upload %s: %w", name, err)
	}
	defer closeFiles(fds)
	m := &Manifest{Version: manifestVersion, Name: name, ChunkSize: s.cfg.ChunkSize, Meta: meta, Files: make([]File, 0, len(names))}
	var st Stats
	for i, fname := range names {
		n := (sizes[i] + s.cfg.ChunkSize - 1) / s.cfg.ChunkSize
		m.Files = append(m.Files, File{Name: fname, Size: sizes[i], Chunks: make([]string, n)})
		st.ChunksTotal += int(n)
		st.BytesTotal += sizes[i]
	}

	t0 := time.Now()
	l, err := s.acquire(ctx, "upload")
	if err != nil {
		return nil, Stats{}, fmt.Errorf("upload %s: %w", name, err)
	}
	defer l.release(ctx)
	if err := s.waitNoGC(ctx); err != nil {
		return nil, Stats{}, fmt.Errorf("upload %s: %w", name, err)
	}

	u := &uploader{s: s, st: st, progress: progress, seen: map[string]*seenChunk{}, baseIn: map[string]bool{}}
	for _, k := range opts.Known {
		if km, err := s.Manifest(ctx, k); err == nil {
			km.Objects(func(h string) { u.baseIn[h] = true })
		}
	}
	bases, _, closeBases := openBases(opts.Bases, files, s.cfg.ChunkSize)
	defer closeBases()
	u.bases = bases
	exts := make([]extentMap, len(m.Files))
	for fi, f := range m.Files {
		if b := u.bases[f.Name]; b != nil && b.ext != nil {
			exts[fi] = extentsOf(fds[fi])
		}
	}
	u.st.SetupDur = time.Since(t0)
	t1 := time.Now()
	if err := u.chunks(ctx, m.Files, fds, exts); err != nil {
		return nil, u.stats(), fmt.Errorf("upload %s: %w", name, err)
	}
	u.st.ChunksDur = time.Since(t1)
	t2 := time.Now()
	// Every chunk is durable; the lease must still protect the ones found
	// in the store until the manifest names them.
	if err := l.valid(); err != nil {
		return nil, u.stats(), fmt.Errorf("upload %s: %w", name, err)
	}
	for _, f := range m.Files {
		if len(f.Deltas) > 0 {
			m.Version = manifestVersionDelta
		}
	}
	if err := s.putManifest(ctx, m, opts.IfAbsent); err != nil {
		return nil, u.stats(), fmt.Errorf("upload %s: %w", name, err)
	}
	u.st.ManifestDur = time.Since(t2)
	return m, u.stats(), nil
}

// fileNames returns the names of files (file name → local path), sorted,
// or an error if one is not a valid file name.
func fileNames(files map[string]string) ([]string, error) {
	names := make([]string, 0, len(files))
	for n := range files {
		if err := validFileName(n); err != nil {
			return nil, err
		}
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}

// openFiles opens files[n] for each of names, in that order, and returns
// them with their sizes. Each must be a regular file. On error it leaves
// none open; else the caller closes them (closeFiles).
func openFiles(names []string, files map[string]string) (fds []*os.File, sizes []int64, err error) {
	defer func() {
		if err != nil {
			closeFiles(fds)
		}
	}()
	for _, n := range names {
		f, err := os.Open(files[n])
		if err != nil {
			return fds, nil, err
		}
		fds = append(fds, f)
		fi, err := f.Stat()
		if err != nil {
			return fds, nil, err
		}
		if !fi.Mode().IsRegular() {
			return fds, nil, fmt.Errorf("%s is not a regular file", files[n])
		}
		sizes = append(sizes, fi.Size())
	}
	return fds, sizes, nil
}

// closeFiles closes each file of fds that is not nil.
func closeFiles(fds []*os.File) {
	for _, f := range fds {
		if f != nil {
			f.Close()
		}
	}
}

// openBases opens the bases (UploadOptions.Bases, PackOptions.Bases) of
// files chunked by chunkSize, by file name. A base of a file not among
// files, of another chunk size, or that cannot be opened is left out:
// its file's chunks are diffed against zeros. used holds the seeds of the
// bases returned; closeAll closes the files openBases opened (not a
// Seed's File), once the bases are no longer read.
func openBases(seeds map[string]Seed, files map[string]string, chunkSize int64) (bases map[string]*base, used map[string]Seed, closeAll func()) {
	bases, used = map[string]*base{}, map[string]Seed{}
	var owned []*os.File
	for n, sd := range seeds {
		if _, ok := files[n]; !ok || sd.ChunkSize != chunkSize {
			continue
		}
		f, own, err := sd.open()
		if err != nil {
			continue // no base
		}
		if own {
			owned = append(owned, f)
		}
		b := &base{f: f, chunks: sd.Chunks, current: sd.Current && sd.File != nil}
		if fi, err := f.Stat(); err == nil {
			b.size, b.ext = fi.Size(), extentsOf(f)
		}
		bases[n] = b
		used[n] = sd
	}
	return bases, used, func() { closeFiles(owned) }
}

// chunks stores the chunks of files (fds, in the same order, with the
// extent maps exts of those with a base) with s.cfg.Workers workers,
// counting holes as they are skipped. It returns the first error, once
// every worker has stopped.
func (u *uploader) chunks(ctx context.Context, files []File, fds []*os.File, exts []extentMap) error {
	cs := u.s.cfg.ChunkSize
	g, gctx := errgroup.WithContext(ctx)
	jobs := make(chan job)
	g.Go(func() error {
		defer close(jobs)
		for fi, f := range files {
			for ci := range f.Chunks {
				hole, err := inHole(fds[fi], int64(ci)*cs, chunkLen(f.Size, cs, ci))
				if err != nil {
					return fmt.Errorf("%s: %w", f.Name, err)
				}
				if hole {
					u.done(func(st *Stats) { st.ZeroChunks++ })
					continue
				}
				select {
				case jobs <- job{fd: fds[fi], file: &files[fi], i: ci, ext: exts[fi]}:
				case <-gctx.Done():
					return gctx.Err()
				}
			}
		}
		return nil
	})
	for range u.s.cfg.Workers {
		g.Go(func() error {
			buf := make([]byte, cs)
			for j := range jobs {
				if err := u.chunk(gctx, j, buf); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// waitNoGC returns once no live GC lease exists (see the package doc).
func (s *Store) waitNoGC(ctx context.Context) error {
	for {
		gcs, err := s.liveLeases(ctx, "gc", false)
		if err != nil {
			return err
		}
		if len(gcs) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for garbage collection to end: %w", ctx.Err())
		case <-time.After(s.pollEvery):
		}
	}
}

// inHole reports whether [off, off+n) of f holds no data according to
// SEEK_DATA, so that it need not be read.
func inHole(f *os.File, off, n int64) (bool, error) {
	data, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	switch {
	case errors.Is(err, unix.ENXIO):
		return true, nil // no data at or after off
	case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP):
		return false, nil // no hole support: read it
	case err != nil:
		return false, err
	}
	return data >= off+n, nil
}

type job struct {
	fd   *os.File
	file *File
	i    int
	ext  extentMap // fd's, if it has a base (else nil)
}

type uploader struct {
	s        *Store
	progress func(Stats)
	bases    map[string]*base // by file name (UploadOptions.Bases)

	mu     sync.Mutex
	st     Stats
	seen   map[string]*seenChunk // hashes this upload handles already
	baseIn map[string]bool       // objects known to be in the store (base chunks, UploadOptions.Known)
}

// base is an open UploadOptions.Bases file.
type base struct {
	f      *os.File
	chunks []string
	size   int64
	ext    extentMap // nil if unknown
	// current: chunks is proven to be f's (Seed.Current): a chunk read
	// from f is not hashed to check it.
	current bool
}

// seenChunk is a chunk hash one worker of an upload handles; others that
// meet the same hash wait for it (done) and store it the same way.
type seenChunk struct {
	done  chan struct{}
	delta *Delta // how it was stored, if as a delta
}

func (u *uploader) stats() Stats {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.st
}

// done counts a handled chunk and reports progress.
func (u *uploader) done(f func(*Stats)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	f(&u.st)
	u.st.ChunksDone++
	if u.progress != nil {
		u.progress(u.st)
	}
}

var zeros = make([]byte, 64<<20)

func (u *uploader) chunk(ctx context.Context, j job, buf []byte) error {
	n := chunkLen(j.file.Size, u.s.cfg.ChunkSize, j.i)
	off := int64(j.i) * u.s.cfg.ChunkSize
	buf = buf[:n]
	read := func() error {
		if _, err := j.fd.ReadAt(buf, off); err != nil {
			return fmt.Errorf("read %s chunk %d: %w", j.file.Name, j.i, err)
		}
		return nil
	}
	var h string
	unread := false
	if b := u.bases[j.file.Name]; b != nil && j.i < len(b.chunks) && b.chunks[j.i] != "" && off+n <= b.size && sameBlocks(j.ext, b.ext, off, n) {
		h, unread = b.chunks[j.i], true // the base's own blocks: its bytes
	} else {
		if err := read(); err != nil {
			return err
		}
		if bytes.Equal(buf, zeros[:n]) {
			u.done(func(st *Stats) { st.ZeroChunks++ })
			return nil
		}
		sum := sha256.Sum256(buf)
		h = hex.EncodeToString(sum[:])
	}
	if unread {
		u.mu.Lock()
		u.st.ChunksUnread++
		u.mu.Unlock()
	}

	u.mu.Lock()
	j.file.Chunks[j.i] = h
	sc, dup := u.seen[h]
	if !dup {
		sc = &seenChunk{done: make(chan struct{})}
		u.seen[h] = sc
	}
	u.mu.Unlock()
	if dup {
		select {
		case <-sc.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		u.mu.Lock()
		if sc.delta != nil {
			u.setDeltaLocked(j, *sc.delta)
		}
		u.mu.Unlock()
		u.done(func(st *Stats) { st.ChunksShared++ })
		return nil
	}
	defer close(sc.done)
	u.mu.Lock()
	ok := u.baseIn[h]
	u.mu.Unlock()
	if !ok && !unread {
		// A chunk unlike its base's (it was read and hashed) is stored
		// as a patch if it can be, without asking the store whether it
		// holds the chunk whole: it rarely does (a chunk a sandbox
		// wrote), and a patch costs less to send again than a HEAD.
		if d, patch, err := u.delta(ctx, j, buf); err != nil {
			return err
		} else if patch != nil {
			// No HEAD of the patch either: its key is its hash, so a PUT
			// of it is idempotent, and the upload's lease keeps GC from
			// running until the manifest naming it is written.
			if err := u.s.objs.Put(ctx, chunkKey(d.Patch), bytes.NewReader(patch), int64(len(patch))); err != nil {
				return fmt.Errorf("chunk %s: %w", d.Patch, err)
			}
			u.mu.Lock()
			sc.delta = &d
			u.setDeltaLocked(j, d)
			u.mu.Unlock()
			u.done(func(st *Stats) {
				st.ChunksDelta++
				st.BytesUploaded += int64(len(patch))
			})
			return nil
		}
	}
	if !ok {
		var err error
		if ok, err = objstore.Exists(ctx, u.s.objs, chunkKey(h)); err != nil {
			return fmt.Errorf("chunk %s: %w", h, err)
		}
	}
	if ok {
		u.done(func(st *Stats) { st.ChunksShared++ })
		return nil
	}
	if unread { // needed after all: to send it
		if err := read(); err != nil {
			return err
		}
	}
	if err := u.s.objs.Put(ctx, chunkKey(h), bytes.NewReader(buf), n); err != nil {
		return fmt.Errorf("chunk %s: %w", h, err)
	}
	u.done(func(st *Stats) { st.ChunksUploaded++; st.BytesUploaded += n })
	return nil
}

func (u *uploader) setDeltaLocked(j job, d Delta) {
	if j.file.Deltas == nil {
		j.file.Deltas = map[int]Delta{}
	}
	j.file.Deltas[j.i] = d
}

// delta returns chunk j (in buf) as a patch over its base (UploadOptions.
// Bases: the base file's chunk at the same offset, or zeros), and the
// patch; a nil patch if there is no base, the base is not in the store,
// or the chunk differs from it too much.
func (u *uploader) delta(ctx context.Context, j job, buf []byte) (Delta, []byte, error) {
	b := u.bases[j.file.Name]
	if b == nil {
		return Delta{}, nil, nil
	}
	var d Delta
	if j.i < len(b.chunks) {
		d.Base = b.chunks[j.i]
	}
	baseBuf := zeros[:len(buf)]
	if d.Base != "" {
		baseBuf = make([]byte, len(buf))
		if _, err := b.f.ReadAt(baseBuf, int64(j.i)*u.s.cfg.ChunkSize); err != nil {
			return Delta{}, nil, nil // shorter than the chunk: no base
		}
		if !b.current {
			if sum := sha256.Sum256(baseBuf); hex.EncodeToString(sum[:]) != d.Base {
				return Delta{}, nil, nil // the base changed behind its index
			}
		}
	}
	patch := makePatch(buf, baseBuf)
	if patch == nil {
		return Delta{}, nil, nil
	}
	if d.Base != "" {
		u.mu.Lock()
		in := u.baseIn[d.Base]
		u.mu.Unlock()
		if !in {
			ok, err := objstore.Exists(ctx, u.s.objs, chunkKey(d.Base))
			if err != nil {
				return Delta{}, nil, fmt.Errorf("chunk %s: %w", d.Base, err)
			}
			if !ok {
				return Delta{}, nil, nil // a host without the base could not make it
			}
			u.mu.Lock()
			u.baseIn[d.Base] = true
			u.mu.Unlock()
		}
	}
	sum := sha256.Sum256(patch)
	d.Patch = hex.EncodeToString(sum[:])
	return d, patch, nil
}
