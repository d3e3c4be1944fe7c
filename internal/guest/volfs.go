package guest

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/pandastack/pandastack/internal/contract/volproto"
)

// The volume file system: a go-fuse file system that forwards every
// operation, by path, to the host (volproto through the session's volume
// stream). It caches nothing itself and tells the kernel to cache no
// entry or attribute (timeouts 0) and to drop a file's pages at each open
// (no FOPEN_KEEP_CACHE): an open sees every write closed or fsynced
// before it anywhere (close-to-open consistency), as another sandbox
// mounting the volume or the files API made it.

// volFS is one mounted volume.
type volFS struct {
	client   *volproto.Client
	tag      string
	readOnly bool
	// mounting is set while the mount is being made: the kernel asks the
	// root's attributes before any volume stream can be attached (the
	// host attaches it once the OPEN is answered, after mounting), so the
	// root answers for itself then.
	mounting atomic.Bool
}

// volNode is a file, directory or symlink of a volume. Its path is where
// it sits in go-fuse's tree, which follows the kernel's lookups, renames
// and removals.
type volNode struct {
	fs.Inode
	vfs *volFS
	// hostIno is the host's inode number when the node was looked up: a
	// later lookup of the same name that finds another file makes a new
	// node.
	hostIno uint64
	// opens counts the node's open files; unlinked is set when it was
	// removed while open and renamed to a hidden name instead (see
	// sillyRename), to be removed at its last close.
	opens    atomic.Int32
	unlinked atomic.Bool
}

// sillyPrefix starts the hidden name of a file removed while open.
const sillyPrefix = ".panda-unlinked-"

// sillyRename keeps a file that is removed (or replaced by a rename)
// while open usable by who holds it open: the protocol names files by
// path, so instead of removing it the guest renames it to a hidden name
// in its directory, which its open files then use, and removes it at its
// last close (as NFS clients do). It reports whether it renamed.
func (n *volNode) sillyRename(ctx context.Context, name string) (bool, syscall.Errno) {
	c := n.GetChild(name)
	if c == nil {
		return false, 0
	}
	cn, ok := c.Operations().(*volNode)
	if !ok || cn.opens.Load() == 0 || c.StableAttr().Mode != syscall.S_IFREG {
		return false, 0
	}
	from, e := n.childPath(name)
	if e != 0 {
		return false, e
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	silly := fmt.Sprintf("%s%x", sillyPrefix, b)
	to, e := n.childPath(silly)
	if e != 0 {
		return false, e
	}
	if _, e := n.vfs.do(ctx, &volproto.Request{Op: volproto.OpRename, Path: from, Path2: to, Flags: volproto.FlagNoReplace}); e != 0 {
		return false, e
	}
	n.MvChild(name, &n.Inode, silly, true)
	cn.unlinked.Store(true)
	return true, 0
}

var (
	_ fs.NodeLookuper   = (*volNode)(nil)
	_ fs.NodeGetattrer  = (*volNode)(nil)
	_ fs.NodeSetattrer  = (*volNode)(nil)
	_ fs.NodeReaddirer  = (*volNode)(nil)
	_ fs.NodeOpener     = (*volNode)(nil)
	_ fs.NodeCreater    = (*volNode)(nil)
	_ fs.NodeMkdirer    = (*volNode)(nil)
	_ fs.NodeUnlinker   = (*volNode)(nil)
	_ fs.NodeRmdirer    = (*volNode)(nil)
	_ fs.NodeRenamer    = (*volNode)(nil)
	_ fs.NodeSymlinker  = (*volNode)(nil)
	_ fs.NodeReadlinker = (*volNode)(nil)
	_ fs.NodeStatfser   = (*volNode)(nil)
	_ fs.NodeLinker     = (*volNode)(nil)
	_ fs.NodeMknoder    = (*volNode)(nil)
	_ fs.NodeFsyncer    = (*volNode)(nil)
)

// volBlockSize is the st_blksize files report: tools (cp, dd's default
// aside) size their reads and writes by it, and a volume request costs a
// round trip to the host.
const volBlockSize = 1 << 20

// do sends req for this volume and returns the answer, or its errno
// (EINTR when ctx ended: the kernel interrupted the request).
func (v *volFS) do(ctx context.Context, req *volproto.Request) (*volproto.Response, syscall.Errno) {
	req.Tag = v.tag
	resp, err := v.client.Do(ctx, req)
	if err != nil {
		return nil, syscall.EINTR
	}
	if resp.Errno != 0 {
		return nil, resp.Errno
	}
	return resp, 0
}

// path is the node's path in the volume ("" for the root); ok is false
// for a node no longer in the tree (removed).
func (n *volNode) path() (string, bool) {
	var segs []string
	p := &n.Inode
	for !p.IsRoot() {
		name, parent := p.Parent()
		if parent == nil {
			return "", false
		}
		segs = append(segs, name)
		p = parent
	}
	size := 0
	for _, s := range segs {
		size += len(s) + 1
	}
	b := make([]byte, 0, size)
	for i := len(segs) - 1; i >= 0; i-- {
		if len(b) > 0 {
			b = append(b, '/')
		}
		b = append(b, segs[i]...)
	}
	return string(b), true
}

// childPath is the path of the entry name in directory n.
func (n *volNode) childPath(name string) (string, syscall.Errno) {
	if !volproto.ValidName(name) {
		return "", syscall.EINVAL
	}
	p, ok := n.path()
	if !ok {
		return "", syscall.ENOENT
	}
	if p == "" {
		p = name
	} else {
		p += "/" + name
	}
	if len(p) > volproto.MaxPath {
		return "", syscall.ENAMETOOLONG
	}
	return p, 0
}

// ownPath is n's path, ESTALE if n was removed.
func (n *volNode) ownPath() (string, syscall.Errno) {
	p, ok := n.path()
	if !ok {
		return "", syscall.ESTALE
	}
	return p, 0
}

func fillAttr(out *fuse.Attr, a *volproto.Attr) {
	out.Mode = a.Mode
	out.Size = uint64(a.Size)
	out.Blocks = uint64(a.Blocks)
	out.Nlink = a.Nlink
	out.Uid = a.UID
	out.Gid = a.GID
	out.Blksize = volBlockSize
	setTime := func(ns int64, sec *uint64, nsec *uint32) {
		if ns < 0 {
			ns = 0
		}
		*sec, *nsec = uint64(ns/1e9), uint32(ns%1e9)
	}
	setTime(a.Atime, &out.Atime, &out.Atimensec)
	setTime(a.Mtime, &out.Mtime, &out.Mtimensec)
	setTime(a.Ctime, &out.Ctime, &out.Ctimensec)
}

// entry fills out from a (timeouts 0: the kernel asks again each time)
// and returns the child node named name for a.
func (n *volNode) entry(ctx context.Context, name string, a *volproto.Attr, out *fuse.EntryOut) *fs.Inode {
	fillAttr(&out.Attr, a)
	out.SetEntryTimeout(0)
	out.SetAttrTimeout(0)
	typ := a.Mode & syscall.S_IFMT
	if c := n.GetChild(name); c != nil {
		if cn, ok := c.Operations().(*volNode); ok && cn.hostIno == a.Ino && c.StableAttr().Mode == typ {
			return c
		}
	}
	return n.NewInode(ctx, &volNode{vfs: n.vfs, hostIno: a.Ino}, fs.StableAttr{Mode: typ})
}

// attrOf checks that an answer that should carry attributes does.
func attrOf(resp *volproto.Response) (*volproto.Attr, syscall.Errno) {
	if !resp.HasAttr {
		return nil, syscall.EIO
	}
	return &resp.Attr, 0
}

func (n *volNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p, e := n.childPath(name)
	if e != 0 {
		return nil, e
	}
	resp, e := n.vfs.do(ctx, &volproto.Request{Op: volproto.OpLookup, Path: p})
	if e != 0 {
		return nil, e
	}
	a, e := attrOf(resp)
	if e != 0 {
		return nil, e
	}
	return n.entry(ctx, name, a, out), 0
}

func (n *volNode) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if n.IsRoot() && n.vfs.mounting.Load() {
		out.Mode = syscall.S_IFDIR | 0o755
		out.Nlink = 2
		out.SetTimeout(0)
		return 0
	}
	p, e := n.ownPath()
	if e != 0 {
		return e
	}
	resp, e := n.vfs.do(ctx, &volproto.Request{Op: volproto.OpLookup, Path: p})
	if e != 0 {
		return e
	}
	a, e := attrOf(resp)
	if e != 0 {
		return e
	}
	fillAttr(&out.Attr, a)
	out.SetTimeout(0)
	return 0
}

func (n *volNode) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	p, e := n.ownPath()
	if e != 0 {
		return e
	}
	req := &volproto.Request{Op: volproto.OpSetattr, Path: p, UID: ^uint32(0), GID: ^uint32(0)}
	if m, ok := in.GetMode(); ok {
		req.Flags |= volproto.SetMode
		req.Mode = m
	}
	if uid, ok := in.GetUID(); ok {
		req.Flags |= volproto.SetOwner
		req.UID = uid
	}
	if gid, ok := in.GetGID(); ok {
		req.Flags |= volproto.SetOwner
		req.GID = gid
	}
	if size, ok := in.GetSize(); ok {
		if size > 1<<62 {
			return syscall.EFBIG
		}
		req.Flags |= volproto.SetSize
		req.Offset = int64(size)
	}
	if in.Valid&fuse.FATTR_ATIME != 0 {
		if in.Valid&fuse.FATTR_ATIME_NOW != 0 {
			req.Flags |= volproto.SetAtimeNow
		} else {
			req.Flags |= volproto.SetAtime
			req.Atime = int64(in.Atime)*1e9 + int64(in.Atimensec)
		}
	}
	if in.Valid&fuse.FATTR_MTIME != 0 {
		if in.Valid&fuse.FATTR_MTIME_NOW != 0 {
			req.Flags |= volproto.SetMtimeNow
		} else {
			req.Flags |= volproto.SetMtime
			req.Mtime = int64(in.Mtime)*1e9 + int64(in.Mtimensec)
		}
	}
	resp, e := n.vfs.do(ctx, req)
	if e != 0 {
		return e
	}
	a, e := attrOf(resp)
	if e != 0 {
		return e
	}
	fillAttr(&out.Attr, a)
	out.SetTimeout(0)
	return 0
}

// maxDirEntries bounds a directory listing the guest holds.
const maxDirEntries = 1 << 20

func (n *volNode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	p, e := n.ownPath()
	if e != 0 {
		return nil, e
	}
	var list []fuse.DirEntry
	var cookie int64
	for {
		resp, e := n.vfs.do(ctx, &volproto.Request{Op: volproto.OpReaddir, Path: p, Offset: cookie})
		if e != 0 {
			return nil, e
		}
		ents, err := volproto.DecodeDirents(resp.Data)
		if err != nil {
			return nil, syscall.EIO
		}
		for _, d := range ents {
			if strings.HasPrefix(d.Name, sillyPrefix) {
				continue // removed while open, gone at its last close
			}
			list = append(list, fuse.DirEntry{Name: d.Name, Mode: d.Mode & syscall.S_IFMT, Ino: d.Ino})
		}
		if resp.M == 0 {
			break
		}
		if len(ents) == 0 || resp.N == cookie || len(list) > maxDirEntries {
			return nil, syscall.EIO // a host that does not advance
		}
		cookie = resp.N
	}
	return fs.NewListDirStream(list), 0
}

func (n *volNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	writable := flags&syscall.O_ACCMODE != syscall.O_RDONLY
	if writable && n.vfs.readOnly {
		return nil, 0, syscall.EROFS
	}
	if flags&syscall.O_TRUNC != 0 {
		p, e := n.ownPath()
		if e != 0 {
			return nil, 0, e
		}
		if _, e := n.vfs.do(ctx, &volproto.Request{Op: volproto.OpSetattr, Path: p, Flags: volproto.SetSize}); e != 0 {
			return nil, 0, e
		}
	}
	// No FOPEN_KEEP_CACHE: the kernel drops the file's cached pages, so
	// this open reads what was written before it.
	n.opens.Add(1)
	return &volHandle{n: n, writable: writable}, 0, 0
}

func (n *volNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	p, e := n.childPath(name)
	if e != 0 {
		return nil, nil, 0, e
	}
	req := &volproto.Request{Op: volproto.OpCreate, Path: p, Mode: mode & 0o7777}
	if flags&syscall.O_EXCL != 0 {
		req.Flags |= volproto.FlagExclusive
	}
	if flags&syscall.O_TRUNC != 0 {
		req.Flags |= volproto.FlagTruncate
	}
	setCaller(ctx, req)
	resp, e := n.vfs.do(ctx, req)
	if e != 0 {
		return nil, nil, 0, e
	}
	a, e := attrOf(resp)
	if e != 0 {
		return nil, nil, 0, e
	}
	child := n.entry(ctx, name, a, out)
	cn := child.Operations().(*volNode)
	cn.opens.Add(1)
	return child, &volHandle{n: cn, writable: true}, 0, 0
}

// setCaller makes what req creates the caller's.
func setCaller(ctx context.Context, req *volproto.Request) {
	if c, ok := fuse.FromContext(ctx); ok {
		req.UID, req.GID = c.Uid, c.Gid
	}
}

func (n *volNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p, e := n.childPath(name)
	if e != 0 {
		return nil, e
	}
	req := &volproto.Request{Op: volproto.OpMkdir, Path: p, Mode: mode & 0o7777}
	setCaller(ctx, req)
	resp, e := n.vfs.do(ctx, req)
	if e != 0 {
		return nil, e
	}
	a, e := attrOf(resp)
	if e != 0 {
		return nil, e
	}
	return n.entry(ctx, name, a, out), 0
}

func (n *volNode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p, e := n.childPath(name)
	if e != 0 {
		return nil, e
	}
	if target == "" || len(target) > volproto.MaxPath {
		return nil, syscall.ENAMETOOLONG
	}
	req := &volproto.Request{Op: volproto.OpSymlink, Path: p, Path2: target}
	setCaller(ctx, req)
	resp, e := n.vfs.do(ctx, req)
	if e != 0 {
		return nil, e
	}
	a, e := attrOf(resp)
	if e != 0 {
		return nil, e
	}
	return n.entry(ctx, name, a, out), 0
}

func (n *volNode) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	p, e := n.ownPath()
	if e != 0 {
		return nil, e
	}
	resp, e := n.vfs.do(ctx, &volproto.Request{Op: volproto.OpReadlink, Path: p})
	if e != 0 {
		return nil, e
	}
	return resp.Data, 0
}

func (n *volNode) Unlink(ctx context.Context, name string) syscall.Errno {
	if done, e := n.sillyRename(ctx, name); done || e != 0 {
		return e
	}
	return n.removeChild(ctx, volproto.OpUnlink, name)
}

func (n *volNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.removeChild(ctx, volproto.OpRmdir, name)
}

func (n *volNode) removeChild(ctx context.Context, op volproto.Op, name string) syscall.Errno {
	p, e := n.childPath(name)
	if e != 0 {
		return e
	}
	_, e = n.vfs.do(ctx, &volproto.Request{Op: op, Path: p})
	return e
}

// renameNoReplace and renameExchange are renameat2's flags.
const (
	renameNoReplace = 1
	renameExchange  = 2
)

func (n *volNode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if flags&^renameNoReplace != 0 {
		return syscall.EINVAL // RENAME_EXCHANGE, RENAME_WHITEOUT
	}
	np, ok := newParent.(*volNode)
	if !ok {
		return syscall.EXDEV
	}
	from, e := n.childPath(name)
	if e != 0 {
		return e
	}
	to, e := np.childPath(newName)
	if e != 0 {
		return e
	}
	req := &volproto.Request{Op: volproto.OpRename, Path: from, Path2: to}
	if flags&renameNoReplace != 0 {
		req.Flags |= volproto.FlagNoReplace
	} else if _, e := np.sillyRename(ctx, newName); e != 0 {
		return e
	}
	_, e = n.vfs.do(ctx, req)
	return e
}

// Link: hard links are refused (a volume's files have one path each).
func (n *volNode) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

// Mknod: device files, FIFOs and sockets are refused.
func (n *volNode) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (n *volNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	resp, e := n.vfs.do(ctx, &volproto.Request{Op: volproto.OpStatfs})
	if e != 0 {
		return e
	}
	const bs = 4096
	limit, used := uint64(resp.N), uint64(resp.M)
	free := uint64(0)
	if limit > used {
		free = (limit - used) / bs
	}
	*out = fuse.StatfsOut{
		Blocks: limit / bs, Bfree: free, Bavail: free,
		Files: 1 << 20, Ffree: 1 << 20,
		Bsize: bs, Frsize: bs, NameLen: volproto.MaxName,
	}
	return 0
}

func (n *volNode) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	p, e := n.ownPath()
	if e != 0 {
		return e
	}
	_, e = n.vfs.do(ctx, &volproto.Request{Op: volproto.OpFsync, Path: p})
	return e
}

// volHandle is an open file. It holds no host state: reads and writes
// name the file by its path.
type volHandle struct {
	n        *volNode
	writable bool
}

var (
	_ fs.FileReleaser = (*volHandle)(nil)
	_ fs.FileReader   = (*volHandle)(nil)
	_ fs.FileWriter   = (*volHandle)(nil)
	_ fs.FileFlusher  = (*volHandle)(nil)
	_ fs.FileFsyncer  = (*volHandle)(nil)
)

func (h *volHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	p, e := h.n.ownPath()
	if e != 0 {
		return nil, e
	}
	size := min(len(dest), volproto.MaxData)
	resp, e := h.n.vfs.do(ctx, &volproto.Request{Op: volproto.OpRead, Path: p, Offset: off, Size: uint32(size)})
	if e != 0 {
		return nil, e
	}
	if len(resp.Data) > size {
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(resp.Data), 0
}

func (h *volHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	p, e := h.n.ownPath()
	if e != 0 {
		return 0, e
	}
	var done uint32
	for len(data) > 0 {
		chunk := data[:min(len(data), volproto.MaxData)]
		resp, e := h.n.vfs.do(ctx, &volproto.Request{Op: volproto.OpWrite, Path: p, Offset: off, Data: chunk})
		if e != 0 {
			if done > 0 {
				return done, 0
			}
			return 0, e
		}
		if resp.N <= 0 || resp.N > int64(len(chunk)) {
			if done > 0 {
				return done, 0
			}
			return 0, syscall.EIO
		}
		done += uint32(resp.N)
		off += resp.N
		data = data[resp.N:]
	}
	return done, 0
}

// Flush (each close of the file): the host syncs the file before close
// returns, so a close acknowledges the data. Any writable open file
// flushes: the kernel may write a shared mapping's pages through another
// open file of the same inode.
func (h *volHandle) Flush(ctx context.Context) syscall.Errno {
	if !h.writable {
		return 0
	}
	p, e := h.n.ownPath()
	if e != 0 {
		return e
	}
	_, e = h.n.vfs.do(ctx, &volproto.Request{Op: volproto.OpFsync, Path: p})
	return e
}

func (h *volHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return h.n.Fsync(ctx, h, flags)
}

// Release (the last close of an open file): a file removed while open
// is removed at last.
func (h *volHandle) Release(ctx context.Context) syscall.Errno {
	if h.n.opens.Add(-1) > 0 || !h.n.unlinked.Load() {
		return 0
	}
	if p, ok := h.n.path(); ok {
		_, _ = h.n.vfs.do(ctx, &volproto.Request{Op: volproto.OpUnlink, Path: p})
	}
	return 0
}
