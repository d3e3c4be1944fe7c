package lazymem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The FUSE side of the mount (the front): names, attributes, modes and
// owners, seeks, and reads passed to a backend — the FS in this process,
// or, in a holder process, the FS of the agent attached to it.

// fileInfo is what the front needs of a file: its size and which of its
// chunks hold data (nil: all).
type fileInfo struct {
	Size      int64
	ChunkSize int64
	Stored    []bool
}

// backend serves the files' content. An error wrapping os.ErrNotExist
// from lookup is ENOENT; any other error EIO.
type backend interface {
	lookup(ctx context.Context, set string) (fileInfo, error)
	read(ctx context.Context, set string, p []byte, off int64) (int, error)
}

// cacheTimeout is how long the kernel caches names and attributes: the
// files never change size or content.
const cacheTimeout = time.Hour

// front is a mounted FUSE server over a backend.
type front struct {
	dir    string
	be     backend
	log    *slog.Logger
	server *fuse.Server
	root   *rootNode

	mu    sync.Mutex
	opens int       // file handles open (a mapping holds one)
	idle  time.Time // when opens last fell to 0
}

// mountFront mounts a front at dir. It needs CAP_SYS_ADMIN (it calls
// mount(2) itself; no fusermount helper is needed or used). A mount left
// at dir by a crashed process is detached first.
func mountFront(dir string, be backend, log *slog.Logger, maxReadAhead int, debug bool) (*front, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("lazymem: mount: %w", err)
	}
	// A mount left by a crashed process answers ENOTCONN: detach it.
	unix.Unmount(dir, unix.MNT_DETACH)
	fr := &front{dir: dir, be: be, log: log, idle: time.Now()}
	fr.root = &rootNode{fr: fr}
	timeout := cacheTimeout
	neg := time.Duration(0)
	opts := &fs.Options{
		EntryTimeout:    &timeout,
		AttrTimeout:     &timeout,
		NegativeTimeout: &neg,
		MountOptions: fuse.MountOptions{
			AllowOther:        true,
			DirectMountStrict: true,
			FsName:            "panda-lazymem",
			Name:              "lazymem",
			// The kernel checks modes: a jailed QEMU runs as a user of
			// its own with the machine's group.
			Options:       []string{"default_permissions"},
			DisableXAttrs: true,
			MaxReadAhead:  max(maxReadAhead, 4096),
			Debug:         debug,
		},
	}
	// go-fuse opens /dev/fuse for a direct mount without O_CLOEXEC, so
	// every process started afterwards (each VMM) would inherit the
	// connection: a VMM could read and answer the requests for every
	// sandbox's memory file, and the connection would outlive this
	// process (a lazily restored VMM then hangs in D state on its next
	// miss instead of failing). The server is made with forks held off
	// and its descriptor marked close-on-exec before any fork can see it
	// (DirectMountStrict: NewServer itself never forks fusermount, which
	// would wait for the lock forever).
	syscall.ForkLock.Lock()
	server, err := fuse.NewServer(fs.NewNodeFS(fr.root, opts), dir, &opts.MountOptions)
	if err == nil {
		if err = closeOnExec("/dev/fuse"); err != nil {
			unix.Unmount(dir, unix.MNT_DETACH)
		}
	}
	syscall.ForkLock.Unlock()
	if err == nil {
		go server.Serve()
		err = server.WaitMount()
	}
	if err != nil {
		return nil, fmt.Errorf("lazymem: mount %s: %w", dir, err)
	}
	fr.server = server
	return fr, nil
}

// closeOnExec marks every descriptor of this process open on device
// path close-on-exec.
func closeOnExec(path string) error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || target != path {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, flags|unix.FD_CLOEXEC); err != nil {
			return fmt.Errorf("%s: close on exec: %w", path, err)
		}
	}
	return nil
}

// unmount unmounts, or if the mount is busy (a file still open or
// mapped) detaches it.
func (fr *front) unmount() error {
	// Unmount asks the kernel to unmount and waits for the serving loop
	// to end; a busy mount (a file still open) fails it, so detach then.
	if err := fr.server.Unmount(); err != nil {
		if derr := unix.Unmount(fr.dir, unix.MNT_DETACH); derr != nil && !errors.Is(derr, unix.EINVAL) {
			return fmt.Errorf("lazymem: unmount %s: %w (detach: %v)", fr.dir, err, derr)
		}
	}
	return nil
}

// idleSince is when the last open file handle was released; zero while
// one is open.
func (fr *front) idleSince() time.Time {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if fr.opens > 0 {
		return time.Time{}
	}
	return fr.idle
}

// sets lists the sets looked up so far.
func (fr *front) sets() []string {
	var out []string
	for name := range fr.root.Children() {
		if set, ok := setOf(name); ok {
			out = append(out, set)
		}
	}
	return out
}

// rootNode is the mount's root directory.
type rootNode struct {
	fs.Inode
	fr *front
	// resolving serialises first lookups.
	resolving sync.Mutex
}

var (
	_ fs.NodeLookuper  = (*rootNode)(nil)
	_ fs.NodeReaddirer = (*rootNode)(nil)
	_ fs.NodeGetattrer = (*rootNode)(nil)
)

func (r *rootNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = fuse.S_IFDIR | 0o755
	return 0
}

func (r *rootNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	set, ok := setOf(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	if ch := r.GetChild(name); ch != nil {
		ch.Operations().(*fileNode).fill(&out.Attr)
		return ch, 0
	}
	r.resolving.Lock()
	defer r.resolving.Unlock()
	if ch := r.GetChild(name); ch != nil {
		ch.Operations().(*fileNode).fill(&out.Attr)
		return ch, 0
	}
	fi, err := r.fr.be.lookup(ctx, set)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, syscall.ENOENT
		}
		r.fr.log.Error("lazy memory file: look up set", "set", set, "err", err)
		return nil, syscall.EIO
	}
	n := &fileNode{fr: r.fr, set: set, fi: fi, ino: inoOf(set), mode: 0o640}
	ch := r.NewPersistentInode(ctx, n, fs.StableAttr{Mode: fuse.S_IFREG, Ino: n.ino})
	r.AddChild(name, ch, false)
	n.fill(&out.Attr)
	return ch, 0
}

func (r *rootNode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	var ents []fuse.DirEntry
	for name := range r.Children() {
		ents = append(ents, fuse.DirEntry{Name: name, Mode: fuse.S_IFREG})
	}
	return fs.NewListDirStream(ents), 0
}

// fileNode is one set's memory file on the mount.
type fileNode struct {
	fs.Inode
	fr  *front
	set string
	fi  fileInfo
	// ino is the file's inode number, the same from lookup to getattr
	// (the kernel's i_ino, which /proc/PID/maps shows, comes from the
	// lookup; the driver finds guest RAM there by stat's st_ino) and
	// across mounts (a fingerprint of the snapshot's files holds it).
	ino uint64

	mu       sync.Mutex
	mode     uint32
	uid, gid uint32
}

var (
	_ fs.NodeGetattrer = (*fileNode)(nil)
	_ fs.NodeSetattrer = (*fileNode)(nil)
	_ fs.NodeOpener    = (*fileNode)(nil)
	_ fs.NodeReader    = (*fileNode)(nil)
	_ fs.NodeWriter    = (*fileNode)(nil)
	_ fs.NodeLseeker   = (*fileNode)(nil)
)

func (n *fileNode) fill(a *fuse.Attr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	a.Mode = fuse.S_IFREG | n.mode
	a.Size = uint64(n.fi.Size)
	a.Blocks = (uint64(n.fi.Size) + 511) / 512
	a.Blksize = 4096
	a.Nlink = 1
	a.Ino = n.ino
	a.Owner = fuse.Owner{Uid: n.uid, Gid: n.gid}
}

func (n *fileNode) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fill(&out.Attr)
	out.SetTimeout(cacheTimeout)
	return 0
}

// Setattr takes a new mode and owner (the agent gives the file to the
// machine's group) and refuses any change of size: the content is the
// set's.
func (n *fileNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok && int64(sz) != n.fi.Size {
		return syscall.EROFS
	}
	n.mu.Lock()
	if m, ok := in.GetMode(); ok {
		n.mode = m & 0o7777
	}
	if u, ok := in.GetUID(); ok {
		n.uid = u
	}
	if g, ok := in.GetGID(); ok {
		n.gid = g
	}
	n.mu.Unlock()
	n.fill(&out.Attr)
	out.SetTimeout(cacheTimeout)
	return 0
}

// Open accepts read-write opens (QEMU 7.2 opens mem-path O_RDWR for a
// private mapping too) and truncation of nothing; the kernel keeps the
// file's page cache across opens, so every machine mapping it shares
// what any of them faulted in. The handle counts the file open until the
// kernel releases it (its last descriptor and mapping gone).
func (n *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_TRUNC != 0 && n.fi.Size != 0 {
		return nil, 0, syscall.EROFS
	}
	n.fr.mu.Lock()
	n.fr.opens++
	n.fr.mu.Unlock()
	return &handle{fr: n.fr}, fuse.FOPEN_KEEP_CACHE, 0
}

func (n *fileNode) Write(ctx context.Context, fh fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	return 0, syscall.EROFS
}

func (n *fileNode) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off >= n.fi.Size {
		return fuse.ReadResultData(nil), 0
	}
	dest = dest[:min(int64(len(dest)), n.fi.Size-off)]
	got, err := n.fr.be.read(ctx, n.set, dest, off)
	if err != nil && got < len(dest) {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(dest[:got]), 0
}

// Lseek answers SEEK_DATA and SEEK_HOLE from the manifest: a zero chunk
// is a hole, so a sparse copy of the file reads only stored chunks.
func (n *fileNode) Lseek(ctx context.Context, fh fs.FileHandle, off uint64, whence uint32) (uint64, syscall.Errno) {
	if whence != unix.SEEK_DATA && whence != unix.SEEK_HOLE {
		return 0, syscall.EINVAL
	}
	o, ok := seekData(n.fi, int64(off), whence == unix.SEEK_DATA)
	if !ok {
		return 0, syscall.ENXIO
	}
	return uint64(o), 0
}

// handle is an open file of the mount.
type handle struct {
	fr   *front
	once sync.Once
}

var _ fs.FileReleaser = (*handle)(nil)

func (h *handle) Release(ctx context.Context) syscall.Errno {
	h.once.Do(func() {
		h.fr.mu.Lock()
		h.fr.opens--
		if h.fr.opens == 0 {
			h.fr.idle = time.Now()
		}
		h.fr.mu.Unlock()
	})
	return 0
}
