package chunkstore

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Packs. A pack is a set of files (a capture: vm.mem, vm.state,
// rootfs.ext4, its metadata) as one stream, sent from one host straight to
// another without the object store: the host that receives it holds the
// template the capture was made from, so the pack carries only what
// differs from it, exactly as an upload and a download through the store
// would move it (deltas, delta.go), but in one pass and without naming any
// chunk by its content's hash (nothing is stored, so nothing is hashed
// that need not be).
//
// Stream (little endian; crc is CRC-32C, Castagnoli):
//
//	header:  "PSPK" | u32 version (1) | u32 n | n bytes of JSON (PackHeader) | u32 crc of all before it
//	record:  u8 type | u8 file | u32 chunk | u32 n | n bytes of payload | u32 crc of all before it in the record
//	trailer: a record of type 'E', file 0, chunk 0, payload u32 count of records before it
//
// Records, per chunk of a file (a chunk absent from the stream is zeros):
//
//	'B' base:  payload the SHA-256 (32 bytes) of a chunk of the receiver's
//	           base (its template): the chunk is that chunk, taken from
//	           there (reflinked if it can be)
//	'P' patch: payload the SHA-256 of a base chunk (32 zero bytes: a chunk
//	           of zeros) then a patch of its pages ("PDP1", delta.go)
//	'W' whole: payload the chunk's bytes
//
// Every record carries its own checksum, and the trailer the count of
// records, so a stream cut short or damaged anywhere is refused (ErrPack)
// and its files are left for the caller to remove: a receiver never
// takes half a capture. The header names the digest of the sender's base
// (BaseDigest): a receiver whose base differs refuses the pack before
// reading any chunk (ErrPackBase), and the sender can go through the
// object store instead.

// ErrPack: a pack stream is truncated or corrupt.
var ErrPack = errors.New("pack stream is truncated or corrupt")

// ErrPackBase: the receiver does not hold the base (template) the pack
// was made against.
var ErrPackBase = errors.New("pack needs a base this host does not hold")

var packMagic = []byte("PSPK")

const packVersion = 1

// Record types of a pack.
const (
	recBase  byte = 'B'
	recPatch byte = 'P'
	recWhole byte = 'W'
	recEnd   byte = 'E'
)

// maxPackHeader bounds a pack header's JSON.
const maxPackHeader = MaxMeta + 1<<20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// PackHeader opens a pack: the files it holds and what the sender says
// about them.
type PackHeader struct {
	ChunkSize int64      `json:"chunk_size"`
	Files     []PackFile `json:"files"`
	// Base is the BaseDigest of the bases the sender diffed against; ""
	// if none (every chunk is whole or a patch of zeros).
	Base string `json:"base,omitempty"`
	// BaseName is the sender's name for those bases (PackOptions), ""
	// for the default the receiver knows (a capture's template).
	BaseName string `json:"base_name,omitempty"`
	// Meta is the sender's description of the set (a snapshot's
	// SnapshotInfo).
	Meta json.RawMessage `json:"meta,omitempty"`

	size int64 // of the header on the wire, when read
}

// PackFile is one file of a pack.
type PackFile struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

// PackStats counts what a pack held (the same on both sides).
type PackStats struct {
	Chunks      int   // chunks of all files
	ZeroChunks  int   // holes or zeros: not sent
	BaseChunks  int   // equal to the base's: sent as its hash
	Unread      int   // on the sender: base chunks found by their disk blocks, not read
	BytesRead   int64 // on the sender: read from the files (not the bases)
	PatchChunks int   // sent as the pages that differ from the base's
	WholeChunks int   // sent whole
	Reflinked   int   // on the receiver: base chunks (and bases of patches) reflinked
	Bytes       int64 // length of the stream
	Dur         time.Duration
	// SetupDur is the sender's time to open the files and send the
	// header (each file's extents are mapped, flushing it:
	// FIEMAP_FLAG_SYNC, when its chunks are reached).
	SetupDur time.Duration
}

// BaseDigest names a set of bases (by file name, as UploadOptions.Bases)
// by the chunk hashes they hold: two hosts whose template copies have the
// same digest hold the same bytes. "" for none.
func BaseDigest(bases map[string]Seed) string {
	if len(bases) == 0 {
		return ""
	}
	names := make([]string, 0, len(bases))
	for n := range bases {
		names = append(names, n)
	}
	slices.Sort(names)
	h := sha256.New()
	for _, n := range names {
		sd := bases[n]
		fmt.Fprintf(h, "%s %d %d\n", n, sd.ChunkSize, len(sd.Chunks))
		for _, c := range sd.Chunks {
			fmt.Fprintln(h, c)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// PackOptions are what WritePack needs besides the files.
type PackOptions struct {
	ChunkSize int64 // 0: DefaultChunkSize
	Meta      json.RawMessage
	// Bases, by file name, are the receiver's base: a chunk equal to the
	// base's chunk at the same offset is sent as its hash, one that
	// differs in a few pages as a patch over it.
	Bases map[string]Seed
	// BaseName names Bases for the receiver (PackHeader.BaseName).
	BaseName string
}

// WritePack writes files (name → local path) to w as a pack. The files
// must not change meanwhile. It returns what it sent.
func WritePack(ctx context.Context, w io.Writer, files map[string]string, opts PackOptions) (st PackStats, err error) {
	t0 := time.Now()
	cs := opts.ChunkSize
	if cs == 0 {
		cs = DefaultChunkSize
	}
	if len(opts.Meta) > MaxMeta || (opts.Meta != nil && !json.Valid(opts.Meta)) {
		return st, fmt.Errorf("write pack: metadata of %d bytes: want valid JSON of at most %d", len(opts.Meta), MaxMeta)
	}
	names, err := fileNames(files)
	if err != nil {
		return st, fmt.Errorf("write pack: %w", err)
	}
	if len(names) > 255 {
		return st, fmt.Errorf("write pack: %d files: at most 255", len(names))
	}
	fds, sizes, err := openFiles(names, files)
	if err != nil {
		return st, fmt.Errorf("write pack: %w", err)
	}
	defer closeFiles(fds)
	hdr := PackHeader{ChunkSize: cs, Meta: opts.Meta, BaseName: opts.BaseName}
	for i, n := range names {
		hdr.Files = append(hdr.Files, PackFile{Name: n, Size: sizes[i]})
	}
	bases, used, closeBases := openBases(opts.Bases, files, cs)
	defer closeBases()
	hdr.Base = BaseDigest(used)
	if hdr.Base == "" {
		hdr.BaseName = "" // none used
	}
	// The header goes out at once: the receiver checks it and prepares
	// (and may start a machine from the files that come first) while
	// the files' extents are mapped, each as its chunks are reached
	// (mapping flushes the file: a large memory image's mapping must
	// not hold back the disk's records before it).
	cw := &countWriter{w: w}
	bw := bufio.NewWriterSize(cw, packBuffer)
	pw := &packWriter{w: bw}
	if err := pw.header(hdr); err != nil {
		return st, fmt.Errorf("write pack: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return st, fmt.Errorf("write pack: %w", err)
	}
	st.SetupDur = time.Since(t0)
	prep := &packPrep{cs: cs, fds: fds, files: hdr.Files, bases: bases, exts: make([]extentMap, len(hdr.Files))}
	if err := prep.send(ctx, pw, &st); err != nil {
		return st, err
	}
	for _, f := range hdr.Files {
		st.Chunks += int((f.Size + cs - 1) / cs)
	}
	var cnt [4]byte
	binary.LittleEndian.PutUint32(cnt[:], uint32(pw.records))
	if err := pw.record(recEnd, 0, 0, cnt[:]); err != nil {
		return st, err
	}
	if err := bw.Flush(); err != nil {
		return st, fmt.Errorf("write pack: %w", err)
	}
	st.Bytes, st.Dur = cw.n, time.Since(t0)
	return st, nil
}

// packWorkers read and diff chunks for WritePack.
const packWorkers = 2

// packAhead is how many records WritePack's workers may prepare ahead of
// the one it writes.
const packAhead = 4

// packBuffer is what WritePack buffers before it writes to its writer:
// large enough for few writes, small enough that the stream flows
// (records of base chunks are small).
const packBuffer = 256 << 10

// send writes the records of every chunk of pp's files to pw, in order
// of file and chunk, and counts them in st (ZeroChunks includes the
// holes, which have no record). Chunks are read and diffed by packWorkers
// workers (work), at most packAhead ahead of the stream, and written in
// order (writeRecords): reading a chunk overlaps sending the one before.
// On error (the first of a record, a hole that cannot be told, or ctx
// ending) every goroutine has stopped when send returns.
func (pp *packPrep) send(ctx context.Context, pw *packWriter, st *PackStats) error {
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Memory: a chunk buffer per record in flight (a whole chunk's
	// record holds its buffer until written), a base buffer per worker.
	jobs := make(chan packJob)
	order := make(chan chan packRec, packAhead)
	pool := make(chan *packBufs, packWorkers+packAhead+1)
	for range cap(pool) {
		pool <- &packBufs{c: make([]byte, pp.cs)}
	}
	var wg sync.WaitGroup
	holes := 0
	var dispatchErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		holes, dispatchErr = pp.dispatch(gctx, jobs, order)
	}()
	for range packWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pp.work(gctx, jobs, pool)
		}()
	}
	err := writeRecords(ctx, pw, order, pool, st)
	cancel()
	wg.Wait()
	if err == nil {
		err = dispatchErr
	}
	if err != nil {
		return err
	}
	st.ZeroChunks += holes
	return nil
}

// dispatch hands each chunk of pp's files that is not a hole to the
// workers (jobs), in order of file and chunk, first queueing on order the
// channel its record will come back on. It maps a file's extents (if its
// base has a map) before handing out the file's first chunk, so that the
// workers see them. It returns the number of holes skipped and closes
// jobs and order; it stops early, with no error, once ctx ends, and with
// an error if it cannot tell whether a chunk is a hole.
func (pp *packPrep) dispatch(ctx context.Context, jobs chan<- packJob, order chan<- chan packRec) (holes int, err error) {
	defer close(order)
	defer close(jobs)
	cs := pp.cs
	for fi, f := range pp.files {
		if b := pp.bases[f.Name]; b != nil && b.ext != nil {
			// Before the file's first job: its workers see it.
			pp.exts[fi] = extentsOf(pp.fds[fi])
		}
		for ci := range int((f.Size + cs - 1) / cs) {
			hole, err := inHole(pp.fds[fi], int64(ci)*cs, chunkLen(f.Size, cs, ci))
			if err != nil {
				return holes, fmt.Errorf("write pack: %s: %w", f.Name, err)
			}
			if hole {
				holes++
				continue
			}
			out := make(chan packRec, 1)
			select {
			case order <- out:
			case <-ctx.Done():
				return holes, nil
			}
			select {
			case jobs <- packJob{fi: fi, ci: ci, out: out}:
			case <-ctx.Done():
				return holes, nil
			}
		}
	}
	return holes, nil
}

// work makes the record of each job until jobs is closed, each in a
// chunk buffer from pool that goes back to pool at once unless the record
// holds it (a whole chunk). Once ctx ends, each job left gets ctx's error
// as its record.
func (pp *packPrep) work(ctx context.Context, jobs <-chan packJob, pool chan *packBufs) {
	baseBuf := make([]byte, pp.cs)
	for j := range jobs {
		var bufs *packBufs
		select {
		case bufs = <-pool:
		case <-ctx.Done():
			j.out <- packRec{err: ctx.Err()}
			continue
		}
		r := pp.chunk(j.fi, j.ci, bufs, baseBuf)
		if r.bufs == nil {
			pool <- bufs
		}
		j.out <- r
	}
}

// writeRecords writes to pw the records that come through the channels
// of order, in that order, counts them in st and gives each buffer a
// record held back to pool once it is written. It returns nil once order
// is closed, else the first record's error, pw's, or ctx's once it ends.
func writeRecords(ctx context.Context, pw *packWriter, order <-chan chan packRec, pool chan<- *packBufs, st *PackStats) error {
	for out := range order {
		var r packRec
		select {
		case r = <-out:
		case <-ctx.Done():
			return ctx.Err()
		}
		if r.err != nil {
			return r.err
		}
		st.BytesRead += r.read
		if r.unread {
			st.Unread++
		}
		switch r.typ {
		case 0:
			st.ZeroChunks++
		case recBase:
			st.BaseChunks++
		case recPatch:
			st.PatchChunks++
		case recWhole:
			st.WholeChunks++
		}
		if r.typ != 0 {
			if err := pw.record(r.typ, r.fi, r.ci, r.parts...); err != nil {
				return err
			}
		}
		if r.bufs != nil {
			pool <- r.bufs
		}
	}
	return nil
}

type packJob struct {
	fi, ci int
	out    chan packRec
}

// packBufs hold one chunk read for WritePack.
type packBufs struct{ c []byte }

// packRec is one chunk's record (typ 0: zeros, none), its payload in
// parts; bufs, if not nil, hold the payload and go back to the pool once
// it is written.
type packRec struct {
	typ    byte
	fi, ci int
	parts  [][]byte
	bufs   *packBufs
	err    error
	unread bool  // a base chunk known by its blocks
	read   int64 // bytes read from the file
}

// packPrep makes the records of WritePack's chunks; safe for concurrent
// use (reads with ReadAt only).
type packPrep struct {
	cs    int64
	fds   []*os.File
	files []PackFile
	bases map[string]*base
	exts  []extentMap
}

// chunk makes the record of chunk ci of file fi, which is not a hole.
func (pp *packPrep) chunk(fi, ci int, bufs *packBufs, baseBuf []byte) packRec {
	f, cs := pp.files[fi], pp.cs
	b, ext := pp.bases[f.Name], pp.exts[fi]
	off := int64(ci) * cs
	n := chunkLen(f.Size, cs, ci)
	r := packRec{fi: fi, ci: ci}
	var baseHash string
	if b != nil && ci < len(b.chunks) && off+n <= b.size {
		baseHash = b.chunks[ci]
	}
	if baseHash != "" && sameBlocks(ext, b.ext, off, n) {
		// The base's own blocks: its bytes, unread.
		r.typ, r.parts, r.unread = recBase, [][]byte{hashBytes(baseHash)}, true
		return r
	}
	bc := zeros[:n]
	if baseHash != "" {
		bc = baseBuf[:n]
		if _, err := b.f.ReadAt(bc, off); err != nil {
			bc, baseHash = zeros[:n], ""
		} else if !b.current {
			if sum := sha256.Sum256(bc); hex.EncodeToString(sum[:]) != baseHash {
				bc, baseHash = zeros[:n], "" // the base changed behind its index
			}
		}
	}
	c := bufs.c[:n]
	var shared []extent
	if baseHash != "" {
		shared = sharedRuns(ext, b.ext, off, n)
	}
	r.read = n
	for _, e := range shared {
		r.read -= e.length
	}
	if err := readExcept(pp.fds[fi], c, off, shared, bc); err != nil {
		r.err = fmt.Errorf("write pack: read %s chunk %d: %w", f.Name, ci, err)
		return r
	}
	switch {
	case isZero(c):
	case baseHash != "" && bytes.Equal(c, bc):
		r.typ, r.parts = recBase, [][]byte{hashBytes(baseHash)}
	default:
		if patch := makePatch(c, bc); patch != nil {
			r.typ, r.parts = recPatch, [][]byte{hashBytes(baseHash), patch}
		} else {
			r.typ, r.parts, r.bufs = recWhole, [][]byte{c}, bufs
		}
	}
	return r
}

// readExcept reads [off, off+len(c)) of f into c, except the runs of
// shared (logical ranges of f inside it), which it copies from base (the
// same range of a file they share those disk blocks with): a chunk a
// sandbox changed in a few pages is read only where it changed. A
// reflinked file does not share its page cache with its original, so the
// pages it still shares would be read from disk.
func readExcept(f *os.File, c []byte, off int64, shared []extent, base []byte) error {
	pos := int64(0)
	read := func(end int64) error {
		if end > pos {
			if _, err := f.ReadAt(c[pos:end], off+pos); err != nil {
				return err
			}
		}
		return nil
	}
	for _, r := range shared {
		s, e := r.logical-off, r.logical-off+r.length
		if err := read(s); err != nil {
			return err
		}
		copy(c[s:e], base[s:e])
		pos = e
	}
	return read(int64(len(c)))
}

// hashBytes is a hex SHA-256 as its 32 bytes; zeros for "" (a chunk of
// zeros).
func hashBytes(h string) []byte {
	b := make([]byte, sha256.Size)
	if h != "" {
		hex.Decode(b, []byte(h))
	}
	return b
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

type packWriter struct {
	w       *bufio.Writer
	records int
}

func (pw *packWriter) header(h PackHeader) error {
	js, err := json.Marshal(h)
	if err != nil {
		return err
	}
	b := append([]byte(nil), packMagic...)
	b = binary.LittleEndian.AppendUint32(b, packVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(js)))
	b = append(b, js...)
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	_, err = pw.w.Write(b)
	return err
}

// record writes one record whose payload is the concatenation of parts.
func (pw *packWriter) record(typ byte, file, chunk int, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	var hdr [10]byte
	hdr[0], hdr[1] = typ, byte(file)
	binary.LittleEndian.PutUint32(hdr[2:], uint32(chunk))
	binary.LittleEndian.PutUint32(hdr[6:], uint32(n))
	crc := crc32.Update(0, castagnoli, hdr[:])
	if _, err := pw.w.Write(hdr[:]); err != nil {
		return fmt.Errorf("write pack: %w", err)
	}
	for _, p := range parts {
		crc = crc32.Update(crc, castagnoli, p)
		if _, err := pw.w.Write(p); err != nil {
			return fmt.Errorf("write pack: %w", err)
		}
	}
	var sum [4]byte
	binary.LittleEndian.PutUint32(sum[:], crc)
	if _, err := pw.w.Write(sum[:]); err != nil {
		return fmt.Errorf("write pack: %w", err)
	}
	pw.records++
	return nil
}

// ReadPackHeader reads the header of a pack from r (which ReadPack then
// reads on from). Errors match ErrPack.
func ReadPackHeader(r *bufio.Reader) (PackHeader, error) {
	var h PackHeader
	fixed := make([]byte, 12)
	if _, err := io.ReadFull(r, fixed); err != nil {
		return h, fmt.Errorf("%w: header: %w", ErrPack, err)
	}
	if !bytes.Equal(fixed[:4], packMagic) {
		return h, fmt.Errorf("%w: not a pack", ErrPack)
	}
	if v := binary.LittleEndian.Uint32(fixed[4:]); v != packVersion {
		return h, fmt.Errorf("%w: version %d, want %d", ErrPack, v, packVersion)
	}
	n := binary.LittleEndian.Uint32(fixed[8:])
	if n > maxPackHeader {
		return h, fmt.Errorf("%w: header of %d bytes", ErrPack, n)
	}
	rest := make([]byte, n+4)
	if _, err := io.ReadFull(r, rest); err != nil {
		return h, fmt.Errorf("%w: header: %w", ErrPack, err)
	}
	crc := crc32.Update(crc32.Checksum(fixed, castagnoli), castagnoli, rest[:n])
	if crc != binary.LittleEndian.Uint32(rest[n:]) {
		return h, fmt.Errorf("%w: header checksum", ErrPack)
	}
	if err := json.Unmarshal(rest[:n], &h); err != nil {
		return h, fmt.Errorf("%w: header: %w", ErrPack, err)
	}
	h.size = int64(len(fixed) + len(rest))
	if h.ChunkSize <= 0 || h.ChunkSize%pageSize != 0 || h.ChunkSize > int64(len(zeros)) {
		return h, fmt.Errorf("%w: chunk size %d", ErrPack, h.ChunkSize)
	}
	if len(h.Files) > 255 {
		return h, fmt.Errorf("%w: %d files", ErrPack, len(h.Files))
	}
	seen := map[string]bool{}
	for _, f := range h.Files {
		if err := validFileName(f.Name); err != nil || f.Size < 0 || seen[f.Name] {
			return h, fmt.Errorf("%w: file %q of %d bytes", ErrPack, f.Name, f.Size)
		}
		seen[f.Name] = true
	}
	return h, nil
}

// BaseHeld reports whether seeds (the receiver's copy of the base) are
// the base the pack was made against (its BaseDigest, by file name, is
// h.Base), or the pack needs none.
func (h PackHeader) BaseHeld(seeds []Seed) bool {
	if h.Base == "" {
		return true
	}
	byName := map[string]Seed{}
	for _, sd := range seeds {
		if _, ok := byName[filepath.Base(sd.Path)]; !ok && slices.ContainsFunc(h.Files, func(f PackFile) bool { return f.Name == filepath.Base(sd.Path) }) && sd.ChunkSize == h.ChunkSize {
			byName[filepath.Base(sd.Path)] = sd
		}
	}
	return BaseDigest(byName) == h.Base
}

// ReadPack reads the records of a pack whose header h was read from r
// (ReadPackHeader) into dir (which must exist), one file per PackFile,
// taking base chunks from seeds (the receiver's copy of the base: its
// BaseDigest, by file name, must be h.Base, else ErrPackBase before any
// file is written). Files are sparse. An error leaves files in dir for
// the caller to remove; a stream cut short, damaged, or naming a chunk
// the seeds do not hold matches ErrPack (or ErrPackBase).
func ReadPack(ctx context.Context, r *bufio.Reader, h PackHeader, dir string, seeds []Seed) (st PackStats, err error) {
	return ReadPackNotify(ctx, r, h, dir, seeds, nil)
}

// ReadPackNotify is ReadPack that calls filesDone(n), if not nil, each
// time the first n files of h.Files are complete in dir: when the first
// record of a later file arrives (a pack holds its files' records in the
// order of h.Files, which WritePack sorts by name; a record of an earlier
// file after that is ErrPack), and with len(h.Files) once the trailer
// is checked. A receiver can so use a file (the disk of a capture) while
// the next (its memory) still arrives — but only as long as the pack
// then reads without error: a sender that breaks the order is caught only
// when its late record comes, and a pack cut short or damaged after
// filesDone leaves what was said done void with the rest. filesDone runs
// on the reading goroutine: it must not block for long.
func ReadPackNotify(ctx context.Context, r *bufio.Reader, h PackHeader, dir string, seeds []Seed, filesDone func(n int)) (st PackStats, err error) {
	t0 := time.Now()
	cs := h.ChunkSize
	st.Bytes = h.size
	if !h.BaseHeld(seeds) {
		return st, fmt.Errorf("%w: this host's copy of the template differs from the sender's", ErrPackBase)
	}
	ss := openSeeds(seeds, cs)
	defer ss.close()
	fds := make([]*os.File, len(h.Files))
	defer closeFiles(fds)
	for i, f := range h.Files {
		if fds[i], err = createPackFile(dir, f); err != nil {
			return st, fmt.Errorf("read pack: %w", err)
		}
		st.Chunks += int((f.Size + cs - 1) / cs)
	}
	maxPayload := sha256.Size + maxPatch(cs)
	rd := &packReader{
		r: r, h: h, fds: fds, ss: ss, st: &st,
		payload: make([]byte, maxPayload+4), // and its CRC
		buf:     make([]byte, cs),
		sent:    map[[2]int]bool{},
	}
	for {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		typ, fi, ci, p, err := rd.next()
		if err != nil {
			return st, err
		}
		if typ == recEnd {
			if len(p) != 4 || int(binary.LittleEndian.Uint32(p)) != rd.records {
				return st, fmt.Errorf("%w: trailer: %d records received", ErrPack, rd.records)
			}
			break
		}
		rd.records++
		if err := rd.place(fi, ci, filesDone); err != nil {
			return st, err
		}
		if err := rd.write(typ, fi, ci, p); err != nil {
			return st, err
		}
	}
	st.ZeroChunks = st.Chunks - st.BaseChunks - st.PatchChunks - st.WholeChunks
	st.Dur = time.Since(t0)
	if filesDone != nil {
		filesDone(len(h.Files))
	}
	return st, nil
}

// createPackFile creates f in dir (which must not hold it yet), of f's
// size: a hole until records are written into it.
func createPackFile(dir string, f PackFile) (*os.File, error) {
	fd, err := os.OpenFile(filepath.Join(dir, f.Name), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := fd.Truncate(f.Size); err != nil {
		fd.Close()
		return nil, err
	}
	return fd, nil
}

// packReader is ReadPackNotify's state between records.
type packReader struct {
	r       *bufio.Reader
	h       PackHeader
	fds     []*os.File // of h.Files, created
	ss      *seedSet
	st      *PackStats
	payload []byte // a record's payload and CRC
	buf     []byte // a chunk
	records int    // counted so far, the trailer excepted
	current int    // the file of the last record
	sent    map[[2]int]bool
}

// next reads the next record and checks its length and checksum; it
// counts its bytes in st.Bytes. p, the payload, is valid until the next
// call. Errors match ErrPack.
func (rd *packReader) next() (typ byte, fi, ci int, p []byte, err error) {
	var hdr [10]byte
	if _, err := io.ReadFull(rd.r, hdr[:]); err != nil {
		return 0, 0, 0, nil, fmt.Errorf("%w: record %d: %w", ErrPack, rd.records, unexpected(err))
	}
	typ, fi, ci = hdr[0], int(hdr[1]), int(binary.LittleEndian.Uint32(hdr[2:]))
	n := int64(binary.LittleEndian.Uint32(hdr[6:]))
	if n > int64(len(rd.payload)-4) {
		return 0, 0, 0, nil, fmt.Errorf("%w: record %d of %d bytes", ErrPack, rd.records, n)
	}
	p = rd.payload[:n+4]
	if _, err := io.ReadFull(rd.r, p); err != nil {
		return 0, 0, 0, nil, fmt.Errorf("%w: record %d: %w", ErrPack, rd.records, unexpected(err))
	}
	crc := crc32.Update(crc32.Checksum(hdr[:], castagnoli), castagnoli, p[:n])
	if crc != binary.LittleEndian.Uint32(p[n:]) {
		return 0, 0, 0, nil, fmt.Errorf("%w: record %d: checksum", ErrPack, rd.records)
	}
	rd.st.Bytes += int64(len(hdr)) + n + 4
	return typ, fi, ci, p[:n], nil
}

// place checks that chunk ci of file fi exists and comes for the first
// time, in file order, and calls filesDone (if not nil) when it is the
// first record of a later file. Errors match ErrPack.
func (rd *packReader) place(fi, ci int, filesDone func(n int)) error {
	h, cs := rd.h, rd.h.ChunkSize
	if fi >= len(h.Files) || ci >= int((h.Files[fi].Size+cs-1)/cs) || rd.sent[[2]int{fi, ci}] {
		return fmt.Errorf("%w: record %d: chunk %d of file %d", ErrPack, rd.records, ci, fi)
	}
	if fi < rd.current {
		return fmt.Errorf("%w: record %d: chunk %d of file %d after file %d", ErrPack, rd.records, ci, fi, rd.current)
	}
	if fi > rd.current {
		rd.current = fi
		if filesDone != nil {
			filesDone(fi)
		}
	}
	rd.sent[[2]int{fi, ci}] = true
	return nil
}

// write writes chunk ci of file fi from a record of type typ and payload
// p, and counts it in st. A payload that does not fit its type matches
// ErrPack; a base chunk the seeds do not hold, ErrPackBase.
func (rd *packReader) write(typ byte, fi, ci int, p []byte) error {
	f, st := rd.h.Files[fi], rd.st
	off := int64(ci) * rd.h.ChunkSize
	c := rd.buf[:chunkLen(f.Size, rd.h.ChunkSize, ci)]
	n := int64(len(p))
	switch typ {
	case recBase:
		if n != sha256.Size {
			return fmt.Errorf("%w: record %d: base of %d bytes", ErrPack, rd.records, n)
		}
		hash := hex.EncodeToString(p)
		ok, cloned, err := rd.ss.take(rd.fds[fi], hash, off, c)
		if err != nil {
			return fmt.Errorf("read pack: %s chunk %d: %w", f.Name, ci, err)
		}
		if !ok {
			return fmt.Errorf("%w: %s chunk %d: base chunk %s not held here", ErrPackBase, f.Name, ci, hash)
		}
		st.BaseChunks++
		if cloned {
			st.Reflinked++
		}
	case recPatch:
		if n < sha256.Size {
			return fmt.Errorf("%w: record %d: patch of %d bytes", ErrPack, rd.records, n)
		}
		if err := readPatch(rd.fds[fi], rd.ss, p, off, c, st); err != nil {
			return fmt.Errorf("%s chunk %d: %w", f.Name, ci, err)
		}
		st.PatchChunks++
	case recWhole:
		if n != int64(len(c)) {
			return fmt.Errorf("%w: record %d: chunk of %d bytes, want %d", ErrPack, rd.records, n, len(c))
		}
		if err := writeSparse(rd.fds[fi], p, off); err != nil {
			return fmt.Errorf("read pack: %w", err)
		}
		st.WholeChunks++
	default:
		return fmt.Errorf("%w: record %d: type %q", ErrPack, rd.records, typ)
	}
	return nil
}

// readPatch writes a patch record's chunk at off of dst: its base (from a
// seed, reflinked if it can be; or zeros: the hole already there) with
// the patch's pages written over it. c is a buffer of the chunk's length.
func readPatch(dst *os.File, ss *seedSet, p []byte, off int64, c []byte, st *PackStats) error {
	baseHash := ""
	if !isZero(p[:sha256.Size]) {
		baseHash = hex.EncodeToString(p[:sha256.Size])
	}
	patch := p[sha256.Size:]
	if baseHash != "" {
		ok, cloned, err := ss.take(dst, baseHash, off, c)
		if err != nil {
			return fmt.Errorf("read pack: %w", err)
		}
		if !ok {
			return fmt.Errorf("%w: base chunk %s not held here", ErrPackBase, baseHash)
		}
		if cloned {
			st.Reflinked++
		}
	}
	if len(patch) < 8 || !bytes.Equal(patch[:4], patchMagic) {
		return fmt.Errorf("%w: not a patch", ErrPack)
	}
	k := int(binary.LittleEndian.Uint32(patch[4:8]))
	if k > (len(c)+pageSize-1)/pageSize || len(patch) < 8+4*k {
		return fmt.Errorf("%w: patch of %d pages for a chunk of %d bytes", ErrPack, k, len(c))
	}
	data := patch[8+4*k:]
	for j := range k {
		pg := int(binary.LittleEndian.Uint32(patch[8+4*j:]))
		po := pg * pageSize
		if po >= len(c) {
			return fmt.Errorf("%w: patch page %d beyond a chunk of %d bytes", ErrPack, pg, len(c))
		}
		n := min(pageSize, len(c)-po)
		if len(data) < n {
			return fmt.Errorf("%w: patch is short", ErrPack)
		}
		page := data[:n]
		data = data[n:]
		// Over a base every page is written (a zero page may replace
		// data); over zeros a zero page is the hole already there.
		if baseHash == "" && isZero(page) {
			continue
		}
		if _, err := dst.WriteAt(page, off+int64(po)); err != nil {
			return fmt.Errorf("read pack: %w", err)
		}
	}
	if len(data) != 0 {
		return fmt.Errorf("%w: patch is long", ErrPack)
	}
	return nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}
