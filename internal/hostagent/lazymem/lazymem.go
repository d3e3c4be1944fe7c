// Package lazymem serves guest memory images that live in the object
// store as regular files on a FUSE mount, so that QEMU can map one
// (memory-backend-file, share=off) and start before the image is on the
// host: a page the guest touches is read through the mount, and the chunk
// holding it is fetched then, through the per-host chunk cache
// (chunkstore.Open), once for every machine of the host.
//
// One FS is one mount per host, at Config.Dir. Its root holds one file
// per set, named by Name(set) ("snapshots%2Fabc.mem"), looked up on
// demand: the first lookup asks Config.Resolve for the set's Image (its
// manifest, read from the store) and the file then stays for the life of
// the mount. Every machine mapping the same file shares its page cache
// (the files are opened with FOPEN_KEEP_CACHE), as local restores share a
// memory image's page cache through hard links.
//
// The files are read-only in content but accept what QEMU 7.2 and the
// host agent do to a memory file: an O_RDWR open (QEMU opens mem-path
// read-write even for a private mapping), and chown/chmod (the agent
// gives the file to the machine's group). Writes, truncation and
// fallocate fail; a private mapping's writes never reach the file. The
// mount has allow_other with default_permissions: the kernel checks the
// file's mode against a jailed QEMU's user and group, as on a disk.
//
// Working sets. Each file records which chunks the kernel read (page
// faults of machines, and reads), in first-touch order, for
// Image.RecordFor after its first read, then hands them to
// Image.OnRecorded: the agent stores that list next to the set's manifest
// (SaveWorkingSet) and the next lazy restore of the set on any host
// prefetches it (Image.Prefetch) in the background as soon as the file is
// looked up, while the machine starts. With Image.FetchAll, the remaining
// chunks follow one at a time whenever the machines have paused faulting
// for a moment, so that they stop depending on the store soon without
// slowing their start.
//
// Errors: a read the store fails is retried for Config.RetryFor (the
// faulting vCPU waits) before it fails with EIO, which QEMU takes as
// SIGBUS; a chunk gone from the store fails at once.
//
// Lifetime: a machine mapping a file needs the mount (and this process)
// for as long as it runs — a page the kernel evicts is read again through
// it, and with the mount gone that read fails and QEMU gets SIGBUS. Close
// unmounts: call it after the machines using the mount are gone. Mount
// detaches a stale mount a crashed process left at Dir before mounting.
package lazymem

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/storage/objstore"
)

// Source is the content of one lazy file. *chunkstore.Reader is one.
// ReadAtContext must be safe for concurrent use and return io.EOF (or
// short) only at the end of the file.
type Source interface {
	Size() int64
	ReadAtContext(ctx context.Context, p []byte, off int64) (int, error)
}

// Image is what the FS needs to serve one set's memory file.
type Image struct {
	Source    Source
	ChunkSize int64
	// Local holds the chunks this host has already (in a seed: the set's
	// template), by index: they are read from there, never fetched.
	Local map[int]LocalChunk
	// Close, if set, is called when the FS closes (it releases Local's
	// files).
	Close func()
	// Stored says which chunks are fetched from the store (false: a chunk
	// of zeros, which costs nothing); nil means all. Used by FetchAll.
	Stored []bool
	// Prefetch lists chunks to fetch in the background, in order, from
	// the moment the file is looked up (a recorded working set).
	Prefetch []int
	// FetchAll fetches every stored chunk after Prefetch, in the
	// background.
	FetchAll bool
	// RecordFor is how long after the file's first read the chunks read
	// are recorded; 0 records nothing. OnRecorded gets them then, in
	// first-touch order (called once, from its own goroutine).
	RecordFor  time.Duration
	OnRecorded func(chunks []int)
}

// LocalChunk is where a chunk of a file is on this host: Off in File.
type LocalChunk struct {
	File io.ReaderAt
	Off  int64
}

// Locator is a Source that can say where a chunk is on this host: the
// path of a file holding exactly that chunk, fetched there first if it
// was not; "" for a chunk of zeros. *chunkstore.Reader is one.
type Locator interface {
	ChunkPath(ctx context.Context, i int) (string, error)
}

// ChunkLoc is where one chunk of a file is on this host: Len bytes at Off
// of File (open, the FS's: not to be closed) or of the file at Path;
// neither is a chunk of zeros.
type ChunkLoc struct {
	File     *os.File
	Path     string
	Off, Len int64
}

// Resolver returns the Image of set name; an error wrapping fs.ErrNotExist
// (os.ErrNotExist) makes the lookup ENOENT, any other EIO.
type Resolver func(ctx context.Context, name string) (*Image, error)

// Config configures an FS.
type Config struct {
	// Dir is the mount point (made if missing).
	Dir     string
	Resolve Resolver
	Log     *slog.Logger
	// Workers is how many chunks the background fetch of one file
	// fetches at once; default 4.
	Workers int
	// RetryFor is how long a read the store fails (but for a missing
	// chunk) is retried before the machine faulting gets an error;
	// default 2 minutes.
	RetryFor time.Duration
	// MaxReadAhead bounds the kernel's readahead on the files (each
	// page fault of a machine reads this much around the page); default
	// 128 KiB, at least 4 KiB.
	MaxReadAhead int
	// Debug logs every FUSE request.
	Debug bool
	// Holder, if set, is the executable of the holder process that
	// serves the mount (holder.go): one whose main calls HolderMain
	// first (panda itself). Mount attaches to the holder already serving
	// Dir, or starts one. Empty: the mount is served by this process.
	Holder string
	// AgentWait is how long the holder holds a read while no process
	// serves the files (the agent restarting) before it fails it (EIO:
	// SIGBUS in the machine); default 5 minutes.
	AgentWait time.Duration
	// HolderIdle is how long a holder with no process attached and no
	// file open waits before it unmounts and exits; default 1 minute.
	HolderIdle time.Duration
}

// FS is a host's lazy memory files: the mount (Config.Dir) and what
// serves its reads. Its methods are safe for concurrent use.
//
// The FUSE server is either in this process (Config.Holder empty: the
// files die with it) or in a holder process (Config.Holder, holder.go)
// that keeps the mount and asks this process for the files' content over
// a unix socket: a machine restored lazily then outlives this process,
// its page-cache misses waiting until the next one attaches.
type FS struct {
	cfg   Config
	front *front // the in-process FUSE server, or nil
	// holder is the link to the holder process (nil without one); a lost
	// link is made again (watchHolder).
	hmu    sync.Mutex
	holder *holder
	ctx    context.Context // of the background fetches; cancelled by Close
	cancel context.CancelFunc

	mu    sync.Mutex
	files map[string]*file // by set name
	// resolving serialises first lookups of one name.
	resolving sync.Mutex

	closeOnce sync.Once
	closeErr  error
	bg        sync.WaitGroup
}

// Name is the file name of set name in the mount's root: the set name
// path-escaped ("snapshots/abc" is "snapshots%2Fabc.mem").
func Name(set string) string { return url.PathEscape(set) + ".mem" }

// SetOf is the set whose file is named name (Name's inverse).
func SetOf(name string) (string, bool) {
	esc, ok := strings.CutSuffix(name, ".mem")
	if !ok {
		return "", false
	}
	set, err := url.PathUnescape(esc)
	return set, err == nil && set != ""
}

// setOf is the inverse of Name.
func setOf(file string) (string, bool) {
	base, ok := strings.CutSuffix(file, ".mem")
	if !ok || base == "" {
		return "", false
	}
	s, err := url.PathUnescape(base)
	if err != nil || Name(s) != file {
		return "", false
	}
	return s, true
}

// Mount mounts a new FS at cfg.Dir, or with cfg.Holder attaches to the
// holder process serving it (starting one if none does). It needs
// CAP_SYS_ADMIN.
func Mount(cfg Config) (*FS, error) {
	if cfg.Dir == "" || cfg.Resolve == nil {
		return nil, errors.New("lazymem: mount: Dir and Resolve are required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.MaxReadAhead <= 0 {
		cfg.MaxReadAhead = 128 << 10
	}
	if cfg.RetryFor <= 0 {
		cfg.RetryFor = 2 * time.Minute
	}
	cfg.MaxReadAhead = max(cfg.MaxReadAhead, 4096)
	ctx, cancel := context.WithCancel(context.Background())
	f := &FS{cfg: cfg, ctx: ctx, cancel: cancel, files: map[string]*file{}}
	var err error
	if cfg.Holder != "" {
		var h *holder
		if h, err = attachHolder(f, true); err == nil {
			f.setLink(h)
		}
	} else {
		f.front, err = mountFront(cfg.Dir, f, cfg.Log, cfg.MaxReadAhead, cfg.Debug)
	}
	if err != nil {
		cancel()
		f.bg.Wait()
		return nil, err
	}
	return f, nil
}

// Path is the path of set name's memory file on the mount.
func (f *FS) Path(name string) string { return f.cfg.Dir + "/" + Name(name) }

// Close stops the background fetches and unmounts; if the mount is busy
// (a file still open or mapped), it detaches it (MNT_DETACH: it leaves
// the namespace at once, and its users' next misses fail). With a holder
// process, the holder unmounts and exits, and Close waits for it.
// Idempotent.
func (f *FS) Close() error {
	f.closeOnce.Do(func() {
		f.cancel()
		f.bg.Wait()
		if f.front != nil {
			f.closeErr = f.front.unmount()
		}
		if h := f.link(); h != nil {
			f.closeErr = h.shutdown()
		}
		f.closeImages()
	})
	return f.closeErr
}

// Leave stops serving the files and lets a holder process keep the mount
// for the next FS of this host to attach (Mount with the same Config):
// the machines mapping the files run on, and their page-cache misses
// wait for it. Without a holder it is Close. Idempotent, and Close after
// it does nothing.
func (f *FS) Leave() error {
	if f.cfg.Holder == "" {
		return f.Close()
	}
	f.closeOnce.Do(func() {
		f.cancel()
		f.bg.Wait()
		if h := f.link(); h != nil {
			h.leave()
		}
		f.closeImages()
	})
	return f.closeErr
}

// Held reports whether a holder process serves the mount (so that the
// machines mapping its files outlive this process).
func (f *FS) Held() bool { return f.cfg.Holder != "" }

// link is the current link to the holder process.
func (f *FS) link() *holder {
	f.hmu.Lock()
	defer f.hmu.Unlock()
	return f.holder
}

// setLink makes h the link to the holder process and watches it.
func (f *FS) setLink(h *holder) {
	f.hmu.Lock()
	f.holder = h
	f.hmu.Unlock()
	f.bg.Add(1)
	go func() {
		defer f.bg.Done()
		f.watchHolder(h)
	}()
}

// watchHolder links f to its holder again if link h ends while f is
// open (the holder may have dropped it; it waits for an agent): a few
// dials over about three seconds. A holder that does not answer is
// gone (Broken).
func (f *FS) watchHolder(h *holder) {
	select {
	case <-h.done:
	case <-f.ctx.Done():
		return
	}
	if f.ctx.Err() != nil {
		return // Close or Leave ended it
	}
	wait := 100 * time.Millisecond
	for try := 0; try < 5; try++ {
		nh, err := attachHolder(f, false)
		if err == nil {
			f.cfg.Log.Warn("lazy memory files: the link to their holder ended; linked again", "pid", nh.pid)
			f.setLink(nh)
			return
		}
		select {
		case <-f.ctx.Done():
			return
		case <-time.After(wait):
		}
		wait *= 2
	}
	f.cfg.Log.Error("lazy memory files: their holder is gone (its machines fail at their next page-cache miss)", "dir", f.cfg.Dir)
}

// Broken reports whether the link to the holder process is gone (the
// holder died: the kernel aborted its mount, and the machines mapping
// its files fail at their next miss). The caller Leaves the FS and
// mounts a new one for new restores.
func (f *FS) Broken() bool {
	h := f.link()
	if h == nil {
		return f.cfg.Holder != ""
	}
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

func (f *FS) closeImages() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, n := range f.files {
		if n.im.Close != nil {
			n.im.Close()
		}
	}
}

// Stats are the counts of one file.
type Stats struct {
	Size int64
	// BytesRead is what the kernel read through the mount (page faults,
	// reads, its readahead); ChunksTouched how many chunks that touched.
	BytesRead     int64
	ChunksTouched int
	// PagesRead is how many distinct 4 KiB pages the kernel read.
	PagesRead int
	// LocalBytes is what reads took from this host's copies (Image.Local)
	// rather than from the store.
	LocalBytes int64
	// Prefetched is how many chunks the background fetch got so far.
	Prefetched int
	// SourceBytes is the size of the distinct chunks this file took from
	// its Source (the object store, through the host's chunk cache), by
	// reads or the background fetch: what of the image had to come from
	// elsewhere so far.
	SourceBytes int64
}

// Stats returns the counts of set name's file, if it was looked up.
func (f *FS) Stats(name string) (Stats, bool) {
	n := f.get(name)
	if n == nil {
		return Stats{}, false
	}
	return n.stats(), true
}

// Touched returns the chunks of set name's file that the kernel read, in
// first-touch order (recorded or not).
func (f *FS) Touched(name string) []int {
	n := f.get(name)
	if n == nil {
		return nil
	}
	return n.touchedList()
}

// FetchAll fetches every stored chunk of set name's file that is not in
// the chunk cache yet, and returns when all are (or at the first error).
// Call it before the set leaves the store while machines may map its
// file. A set never looked up needs nothing.
func (f *FS) FetchAll(ctx context.Context, name string) error {
	n := f.get(name)
	if n == nil {
		return nil
	}
	work := make(chan int)
	errc := make(chan error, f.cfg.Workers)
	var wg sync.WaitGroup
	for range f.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b [1]byte
			for i := range work {
				if _, err := n.im.Source.ReadAtContext(ctx, b[:], int64(i)*n.im.ChunkSize); err != nil {
					errc <- fmt.Errorf("fetch chunk %d of %s: %w", i, name, err)
					return
				}
			}
		}()
	}
	var err error
	all := fetchOrder(&Image{Stored: n.im.Stored, Local: n.im.Local, FetchAll: true}, len(n.touched))
feed:
	for _, i := range all {
		select {
		case work <- i:
		case err = <-errc:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errc:
		default:
		}
	}
	return err
}

// Layout returns where every chunk of set name's file is on this host,
// fetching those that are not (into the chunk cache): for a copy of the
// file made of its chunks' files (reflinked where the file system can)
// rather than read through the mount. errors.ErrUnsupported if a chunk
// can be read only through the Source or Local's reader (no Locator, no
// *os.File). The FS must stay open while the locations are used.
func (f *FS) Layout(ctx context.Context, name string) ([]ChunkLoc, error) {
	n, err := f.open(ctx, name)
	if err != nil {
		return nil, err
	}
	loc, isLoc := n.im.Source.(Locator)
	cs := n.im.ChunkSize
	out := make([]ChunkLoc, len(n.touched))
	for i := range out {
		ln := min(cs, n.size-int64(i)*cs)
		if lc, ok := n.im.Local[i]; ok {
			of, ok := lc.File.(*os.File)
			if !ok {
				return nil, fmt.Errorf("chunk %d of %s: local, not a file: %w", i, name, errors.ErrUnsupported)
			}
			out[i] = ChunkLoc{File: of, Off: lc.Off, Len: ln}
			continue
		}
		if n.im.Stored != nil && (i >= len(n.im.Stored) || !n.im.Stored[i]) {
			out[i] = ChunkLoc{Len: ln}
			continue
		}
		if !isLoc {
			return nil, fmt.Errorf("chunk %d of %s: %w", i, name, errors.ErrUnsupported)
		}
		p, err := loc.ChunkPath(ctx, i)
		if err != nil {
			return nil, fmt.Errorf("chunk %d of %s: %w", i, name, err)
		}
		if p != "" {
			n.tookFromSource(i)
		}
		out[i] = ChunkLoc{Path: p, Len: ln}
	}
	return out, nil
}

func (f *FS) get(name string) *file {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.files[name]
}

// open returns set's file, resolving it on first use (and starting its
// background fetch).
func (f *FS) open(ctx context.Context, set string) (*file, error) {
	if n := f.get(set); n != nil {
		return n, nil
	}
	f.resolving.Lock()
	defer f.resolving.Unlock()
	if n := f.get(set); n != nil {
		return n, nil
	}
	if f.ctx.Err() != nil {
		return nil, errors.New("lazymem: closed")
	}
	im, err := f.cfg.Resolve(ctx, set)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			f.cfg.Log.Error("lazy memory file: resolve set", "set", set, "err", err)
		}
		return nil, err
	}
	n := newFile(f, set, im)
	f.mu.Lock()
	f.files[set] = n
	f.mu.Unlock()
	n.startBackground()
	return n, nil
}

// lookup is the backend's: set's file, resolved.
func (f *FS) lookup(ctx context.Context, set string) (fileInfo, error) {
	n, err := f.open(ctx, set)
	if err != nil {
		return fileInfo{}, err
	}
	return fileInfo{Size: n.size, ChunkSize: n.im.ChunkSize, Stored: n.im.Stored}, nil
}

// read is the backend's: a read of the kernel through the mount.
func (f *FS) read(ctx context.Context, set string, p []byte, off int64) (int, error) {
	n, err := f.open(ctx, set)
	if err != nil {
		return 0, err
	}
	if off >= n.size {
		return 0, nil
	}
	p = p[:min(int64(len(p)), n.size-off)]
	n.touch(off, int64(len(p)))
	got, err := n.readRetrying(ctx, p, off)
	if err != nil && got < len(p) {
		f.cfg.Log.Error("lazy memory file: read", "set", set, "offset", off, "len", len(p), "err", err)
		return got, err
	}
	return got, nil
}

// file is one set's memory file: what serves its content.
type file struct {
	fs   *FS
	set  string
	im   *Image
	size int64

	mu        sync.Mutex
	touched   []bool
	order     []int // first-touch order
	firstRead time.Time
	lastRead  time.Time
	bytesRead int64
	// localBytes is what reads took from Local.
	localBytes int64
	pages      []uint64 // bitmap of the 4 KiB pages read
	nPages     int      // bits set in pages
	// fromSource marks the chunks taken from the Source; sourceBytes
	// sums their sizes.
	fromSource  []bool
	sourceBytes int64

	prefetched int
}

func newFile(f *FS, set string, im *Image) *file {
	size := im.Source.Size()
	chunks := int((size + im.ChunkSize - 1) / im.ChunkSize)
	return &file{fs: f, set: set, im: im, size: size, touched: make([]bool, chunks), fromSource: make([]bool, chunks),
		pages: make([]uint64, (size+4095)/4096/64+1)}
}

// readAt reads from Local where it holds the chunks, else from the
// Source.
func (n *file) readAt(ctx context.Context, p []byte, off int64) (int, error) {
	if len(n.im.Local) == 0 {
		got, err := n.im.Source.ReadAtContext(ctx, p, off)
		if got > 0 {
			for i := off / n.im.ChunkSize; i <= (off+int64(got)-1)/n.im.ChunkSize; i++ {
				n.tookFromSource(int(i))
			}
		}
		return got, err
	}
	cs := n.im.ChunkSize
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		i := int(pos / cs)
		m := min(len(p)-done, int(int64(i+1)*cs-pos))
		dst := p[done : done+m]
		var err error
		var got int
		if lc, ok := n.im.Local[i]; ok {
			got, err = lc.File.ReadAt(dst, lc.Off+pos-int64(i)*cs)
			n.mu.Lock()
			n.localBytes += int64(got)
			n.mu.Unlock()
		} else {
			got, err = n.im.Source.ReadAtContext(ctx, dst, pos)
			if got > 0 {
				n.tookFromSource(i)
			}
		}
		done += got
		if err != nil && got < len(dst) {
			return done, err
		}
	}
	return done, nil
}

// tookFromSource records that chunk i came from the Source.
func (n *file) tookFromSource(i int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if i < 0 || i >= len(n.fromSource) || n.fromSource[i] {
		return
	}
	if n.im.Stored != nil && (i >= len(n.im.Stored) || !n.im.Stored[i]) {
		return // a zero chunk: nothing is fetched for it
	}
	n.fromSource[i] = true
	n.sourceBytes += min(n.im.ChunkSize, n.size-int64(i)*n.im.ChunkSize)
}

// readRetrying reads from the Source, retrying failures other than a
// missing chunk for up to Config.RetryFor: a read that fails is a SIGBUS
// in the machine that faulted (QEMU dies), a read that waits only stalls
// its vCPU, so a store that is briefly down must not kill machines.
func (n *file) readRetrying(ctx context.Context, dest []byte, off int64) (int, error) {
	deadline := time.Now().Add(n.fs.cfg.RetryFor)
	wait := 100 * time.Millisecond
	for {
		got, err := n.readAt(ctx, dest, off)
		if err == nil || got == len(dest) || errors.Is(err, objstore.ErrNotFound) || ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			return got, err
		}
		n.fs.cfg.Log.Warn("lazy memory file: read failed, retrying", "set", n.set, "offset", off, "err", err, "retry_in_ms", wait.Milliseconds())
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return got, err
		case <-n.fs.ctx.Done():
			return got, err
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// seekData is lseek's SEEK_DATA (data) or SEEK_HOLE (!data) from off in
// a file whose chunks fi.Stored says are data; false is ENXIO.
func seekData(fi fileInfo, off int64, data bool) (int64, bool) {
	size := fi.Size
	if off < 0 || off >= size {
		return 0, false
	}
	cs := fi.ChunkSize
	for i := off / cs; i*cs < size; i++ {
		stored := fi.Stored == nil || (int(i) < len(fi.Stored) && fi.Stored[i])
		if stored == data {
			return max(off, i*cs), true
		}
	}
	if data {
		return 0, false
	}
	return size, true // the implicit hole at the end
}

// touch records a kernel read of [off, off+length).
func (n *file) touch(off, length int64) {
	cs := n.im.ChunkSize
	n.mu.Lock()
	n.bytesRead += length
	for p := off >> 12; p <= (off+length-1)>>12 && int(p>>6) < len(n.pages); p++ {
		if bit := uint64(1) << (p & 63); n.pages[p>>6]&bit == 0 {
			n.pages[p>>6] |= bit
			n.nPages++
		}
	}
	now := time.Now()
	first := n.firstRead.IsZero()
	if first {
		n.firstRead = now
	}
	n.lastRead = now
	for i := off / cs; i <= (off+length-1)/cs && int(i) < len(n.touched); i++ {
		if !n.touched[i] {
			n.touched[i] = true
			n.order = append(n.order, int(i))
		}
	}
	n.mu.Unlock()
	if first && n.im.RecordFor > 0 && n.im.OnRecorded != nil {
		n.fs.bg.Add(1)
		go func() {
			defer n.fs.bg.Done()
			select {
			case <-time.After(n.im.RecordFor):
			case <-n.fs.ctx.Done():
				return
			}
			n.im.OnRecorded(n.touchedList())
		}()
	}
}

func (n *file) touchedList() []int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]int(nil), n.order...)
}

func (n *file) stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return Stats{Size: n.size, BytesRead: n.bytesRead, ChunksTouched: len(n.order), PagesRead: n.nPages, LocalBytes: n.localBytes, Prefetched: n.prefetched, SourceBytes: n.sourceBytes}
}

// startBackground fetches Prefetch with Config.Workers at once, then
// (FetchAll) every other stored chunk one at a time, each only once the
// machines have read nothing through the file for quietFor (and have read
// something): the rest must not delay the faults of a machine starting.
// It stops at Close.
func (n *file) startBackground() {
	order := fetchOrder(n.im, len(n.touched))
	if len(order) == 0 {
		return
	}
	nPre := len(fetchOrder(&Image{Stored: n.im.Stored, Local: n.im.Local, Prefetch: n.im.Prefetch}, len(n.touched)))
	ctx := n.fs.ctx
	fetch := func(i int) {
		var b [1]byte // one byte fetches the whole chunk into the cache
		if _, err := n.im.Source.ReadAtContext(ctx, b[:], int64(i)*n.im.ChunkSize); err != nil {
			if ctx.Err() == nil {
				n.fs.cfg.Log.Warn("lazy memory file: background fetch", "set", n.set, "chunk", i, "err", err)
			}
			return
		}
		n.mu.Lock()
		n.prefetched++
		n.mu.Unlock()
		n.tookFromSource(i)
	}
	n.fs.bg.Add(1)
	go func() {
		defer n.fs.bg.Done()
		work := make(chan int)
		var wg sync.WaitGroup
		for range n.fs.cfg.Workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range work {
					fetch(i)
				}
			}()
		}
	feed:
		for _, i := range order[:nPre] {
			select {
			case work <- i:
			case <-ctx.Done():
				break feed
			}
		}
		close(work)
		wg.Wait()
		for _, i := range order[nPre:] {
			if !n.waitQuiet(ctx) {
				return
			}
			fetch(i)
		}
	}()
}

// quietFor is how long machines must have read nothing through a file
// before its background fetch takes the next chunk of the rest.
const quietFor = 200 * time.Millisecond

// waitQuiet waits until the file was read at least once and not in the
// last quietFor; false if ctx ended first.
func (n *file) waitQuiet(ctx context.Context) bool {
	for {
		n.mu.Lock()
		last := n.lastRead
		n.mu.Unlock()
		wait := quietFor
		if !last.IsZero() {
			wait = quietFor - time.Since(last)
			if wait <= 0 {
				return true
			}
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return false
		}
	}
}

// fetchOrder is the order of a background fetch of im's chunks (of n):
// Prefetch (valid, stored, each once), then with FetchAll the other
// stored chunks in file order.
func fetchOrder(im *Image, n int) []int {
	seen := make([]bool, n)
	stored := func(i int) bool {
		_, local := im.Local[i]
		return !local && (im.Stored == nil || (i < len(im.Stored) && im.Stored[i]))
	}
	var out []int
	for _, i := range im.Prefetch {
		if i >= 0 && i < n && !seen[i] && stored(i) {
			seen[i] = true
			out = append(out, i)
		}
	}
	if im.FetchAll {
		for i := range n {
			if !seen[i] && stored(i) {
				out = append(out, i)
			}
		}
	}
	return out
}

// inoOf is the inode number of set's file: a hash of its name, above 1
// (the root) and below 2^63.
func inoOf(set string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(set))
	return h.Sum64()>>1 | 2
}
