package volumes

import (
	"context"
	"errors"
	"hash/fnv"
	"io"
	"io/fs"
	"net"
	"os"
	"path"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/contract/volproto"
)

// Space is a volume's byte accountant (implemented in store.go).
type Space interface {
	// Reserve accounts n more bytes, or fails with syscall.ENOSPC without
	// accounting anything when the volume would exceed its limit.
	Reserve(n int64) error
	// Release gives n bytes back.
	Release(n int64)
	// Used and Limit in bytes (statfs).
	Used() int64
	Limit() int64
}

// Mount is one volume a sandbox mounts, as the server sees it.
type Mount struct {
	Tag      string   // the guest's name for it (as in guestproto.VolumeMount)
	Root     *os.Root // the volume's data directory, opened by the store
	ReadOnly bool
	Space    Space
}

// MaxInFlight bounds the requests Serve answers at once per connection:
// with messages of at most volproto.MaxMessage bytes each way, a guest
// holds at most about 2 × MaxInFlight MiB of host memory and MaxInFlight
// host threads blocked in file system calls.
const MaxInFlight = 16

// BlockSize is the accounting unit: a regular file counts its size
// rounded up to it; a directory or a symlink counts one.
const BlockSize = 4096

// UsageOf is what the file fi counts against its volume's limit: a
// regular file its size rounded up to BlockSize, a directory or a symlink
// BlockSize, anything else nothing.
func UsageOf(fi fs.FileInfo) int64 {
	switch {
	case fi.Mode().IsRegular():
		return roundUp(fi.Size())
	case fi.IsDir(), fi.Mode()&fs.ModeSymlink != 0:
		return BlockSize
	}
	return 0
}

func roundUp(n int64) int64 {
	if n <= 0 {
		return 0
	}
	return (n + BlockSize - 1) / BlockSize * BlockSize
}

// maxFileSize bounds a file's size (offset + length of a write, a
// truncate): beyond, EFBIG.
const maxFileSize = 1 << 50

// Serve answers the guest's requests on conn until conn ends or ctx is
// done. Never trusts the guest: every path is resolved inside the
// mount's Root (no "..", absolute path or symlink leads out); a write,
// truncate or create that would exceed the volume's limit fails with
// ENOSPC before anything is written (Space.Reserve); hard links, device
// files, FIFOs and sockets cannot be made (the protocol has no such
// operations); setuid and setgid bits are stripped; a read-only mount
// refuses every change with EROFS; at most MaxInFlight requests are
// answered at once. A malformed message ends the connection with an
// error. Returns nil when conn ends cleanly.
//
// Requests are stateless by path: Serve keeps no open files between
// them, so a guest restored or forked onto a new connection goes on where
// it was. fsync (the guest's fsync, and its close: FUSE FLUSH) syncs the
// file and its directory on the host before answering.
func Serve(ctx context.Context, conn net.Conn, mounts []Mount) error {
	byTag := make(map[string]*Mount, len(mounts))
	for i := range mounts {
		byTag[mounts[i].Tag] = &mounts[i]
	}
	return volproto.Serve(ctx, conn, MaxInFlight, func(ctx context.Context, req *volproto.Request) *volproto.Response {
		m := byTag[req.Tag]
		if m == nil {
			return errResp(syscall.ESTALE)
		}
		return handle(m, req)
	})
}

func errResp(e syscall.Errno) *volproto.Response { return &volproto.Response{Errno: e} }

// errnoOf is err's errno: the system call's, EACCES for a path that
// would escape the root, EIO otherwise.
func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	switch {
	case err == nil:
		return 0
	case errors.As(err, &e):
		return e
	case errors.Is(err, fs.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, fs.ErrExist):
		return syscall.EEXIST
	case errors.Is(err, fs.ErrPermission):
		return syscall.EACCES
	}
	// os.Root's "path escapes from parent" and the like.
	return syscall.EACCES
}

// rel is a volproto path as os.Root names it.
func rel(p string) string {
	if p == "" {
		return "."
	}
	return p
}

// pathLocks serialize the accounting of changes to one path (its size
// before and after) across every connection of this process; stripes
// keyed by the root's name and the path.
var pathLocks [256]sync.Mutex

func lockIndex(m *Mount, p string) int {
	h := fnv.New32a()
	h.Write([]byte(m.Root.Name()))
	h.Write([]byte{0})
	h.Write([]byte(p))
	return int(h.Sum32() % uint32(len(pathLocks)))
}

// lockPaths locks the stripes of ps in order and returns the unlock.
func lockPaths(m *Mount, ps ...string) func() {
	idx := make([]int, 0, len(ps))
	for _, p := range ps {
		i := lockIndex(m, p)
		dup := false
		for _, j := range idx {
			dup = dup || j == i
		}
		if !dup {
			idx = append(idx, i)
		}
	}
	for a := 1; a < len(idx); a++ {
		for b := a; b > 0 && idx[b] < idx[b-1]; b-- {
			idx[b], idx[b-1] = idx[b-1], idx[b]
		}
	}
	for _, i := range idx {
		pathLocks[i].Lock()
	}
	return func() {
		for _, i := range idx {
			pathLocks[i].Unlock()
		}
	}
}

// attrOf is fi's attributes.
func attrOf(fi fs.FileInfo) volproto.Attr {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return volproto.Attr{Size: fi.Size(), Mode: uint32(fi.Mode().Perm())}
	}
	return volproto.Attr{
		Ino: st.Ino, Mode: st.Mode, Nlink: uint32(st.Nlink), UID: st.Uid, GID: st.Gid,
		Size: st.Size, Blocks: st.Blocks,
		Atime: st.Atim.Nano(), Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano(),
	}
}

func attrResp(fi fs.FileInfo) *volproto.Response {
	return &volproto.Response{HasAttr: true, Attr: attrOf(fi)}
}

// lstatResp answers with p's attributes.
func lstatResp(m *Mount, p string) *volproto.Response {
	fi, err := m.Root.Lstat(rel(p))
	if err != nil {
		return errResp(errnoOf(err))
	}
	return attrResp(fi)
}

// permBits is mode's permission bits without setuid and setgid.
func permBits(mode uint32) fs.FileMode {
	m := fs.FileMode(mode & 0o777)
	if mode&syscall.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// openFlags open a file without following a final symlink and without
// blocking on anything that is not a regular file.
const openFlags = syscall.O_NOFOLLOW | syscall.O_NONBLOCK | syscall.O_CLOEXEC

// openRegular opens p with flag and fails with EISDIR or EINVAL unless
// it is a regular file.
func openRegular(m *Mount, p string, flag int) (*os.File, fs.FileInfo, error) {
	f, err := m.Root.OpenFile(rel(p), flag|openFlags, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		if fi.IsDir() {
			return nil, nil, syscall.EISDIR
		}
		return nil, nil, syscall.EINVAL
	}
	return f, fi, nil
}

func handle(m *Mount, req *volproto.Request) *volproto.Response {
	switch req.Op {
	case volproto.OpLookup:
		return lstatResp(m, req.Path)
	case volproto.OpReaddir:
		return readdir(m, req)
	case volproto.OpRead:
		return read(m, req)
	case volproto.OpReadlink:
		target, err := m.Root.Readlink(rel(req.Path))
		if err != nil {
			return errResp(errnoOf(err))
		}
		if len(target) > volproto.MaxPath {
			return errResp(syscall.ENAMETOOLONG)
		}
		return &volproto.Response{Data: []byte(target)}
	case volproto.OpStatfs:
		return &volproto.Response{N: max(m.Space.Limit(), 0), M: max(m.Space.Used(), 0)}
	case volproto.OpFsync:
		return fsync(m, req)
	}
	if m.ReadOnly {
		return errResp(syscall.EROFS)
	}
	switch req.Op {
	case volproto.OpSetattr:
		return setattr(m, req)
	case volproto.OpWrite:
		return write(m, req)
	case volproto.OpCreate:
		return create(m, req)
	case volproto.OpMkdir:
		return mkdir(m, req)
	case volproto.OpUnlink, volproto.OpRmdir:
		return remove(m, req)
	case volproto.OpRename:
		return rename(m, req)
	case volproto.OpSymlink:
		return symlink(m, req)
	}
	return errResp(syscall.ENOSYS)
}

func read(m *Mount, req *volproto.Request) *volproto.Response {
	f, _, err := openRegular(m, req.Path, os.O_RDONLY)
	if err != nil {
		return errResp(errnoOf(err))
	}
	defer f.Close()
	buf := make([]byte, req.Size)
	n, err := f.ReadAt(buf, req.Offset)
	if err != nil && err != io.EOF {
		return errResp(errnoOf(err))
	}
	return &volproto.Response{Data: buf[:n]}
}

func write(m *Mount, req *volproto.Request) *volproto.Response {
	end := req.Offset + int64(len(req.Data))
	if end > maxFileSize {
		return errResp(syscall.EFBIG)
	}
	defer lockPaths(m, req.Path)()
	f, fi, err := openRegular(m, req.Path, os.O_WRONLY)
	if err != nil {
		return errResp(errnoOf(err))
	}
	defer f.Close()
	old := fi.Size()
	grow := roundUp(max(old, end)) - roundUp(old)
	if grow > 0 {
		if err := m.Space.Reserve(grow); err != nil {
			return errResp(syscall.ENOSPC)
		}
	}
	n, werr := f.WriteAt(req.Data, req.Offset)
	after, err := f.Stat()
	if err != nil {
		// Cannot tell what was written: keep the reservation (an
		// overcount, corrected when the volume is next walked).
		return errResp(errnoOf(err))
	}
	if d := roundUp(old) + grow - roundUp(after.Size()); d > 0 {
		m.Space.Release(d)
	}
	if werr != nil && n == 0 {
		return errResp(errnoOf(werr))
	}
	return &volproto.Response{N: int64(n), HasAttr: true, Attr: attrOf(after)}
}

// setattr sets, in order, the owner, the permission bits, the size and
// the times. A symlink's mode and times are left alone (Linux ignores a
// symlink's mode; os.Root's calls would follow it).
func setattr(m *Mount, req *volproto.Request) *volproto.Response {
	p := rel(req.Path)
	defer lockPaths(m, req.Path)()
	fi, err := m.Root.Lstat(p)
	if err != nil {
		return errResp(errnoOf(err))
	}
	link := fi.Mode()&fs.ModeSymlink != 0
	if req.Flags&volproto.SetOwner != 0 {
		uid, gid := int(req.UID), int(req.GID)
		if req.UID == ^uint32(0) {
			uid = -1
		}
		if req.GID == ^uint32(0) {
			gid = -1
		}
		if err := m.Root.Lchown(p, uid, gid); err != nil {
			return errResp(errnoOf(err))
		}
	}
	if req.Flags&volproto.SetMode != 0 && !link {
		if err := m.Root.Chmod(p, permBits(req.Mode)); err != nil {
			return errResp(errnoOf(err))
		}
	}
	if req.Flags&volproto.SetSize != 0 {
		if req.Offset > maxFileSize {
			return errResp(syscall.EFBIG)
		}
		if e := truncate(m, req.Path, req.Offset); e != 0 {
			return errResp(e)
		}
	}
	if req.Flags&(volproto.SetAtime|volproto.SetMtime|volproto.SetAtimeNow|volproto.SetMtimeNow) != 0 && !link {
		st, _ := fi.Sys().(*syscall.Stat_t)
		atime, mtime := time.Unix(0, 0), fi.ModTime()
		if st != nil {
			atime = time.Unix(0, st.Atim.Nano())
		}
		now := time.Now()
		switch {
		case req.Flags&volproto.SetAtimeNow != 0:
			atime = now
		case req.Flags&volproto.SetAtime != 0:
			atime = time.Unix(0, req.Atime)
		}
		switch {
		case req.Flags&volproto.SetMtimeNow != 0:
			mtime = now
		case req.Flags&volproto.SetMtime != 0:
			mtime = time.Unix(0, req.Mtime)
		}
		if err := m.Root.Chtimes(p, atime, mtime); err != nil {
			return errResp(errnoOf(err))
		}
	}
	return lstatResp(m, req.Path)
}

// truncate sets p's size, accounting the change; its caller holds p's
// lock.
func truncate(m *Mount, p string, size int64) syscall.Errno {
	f, fi, err := openRegular(m, p, os.O_WRONLY)
	if err != nil {
		return errnoOf(err)
	}
	defer f.Close()
	d := roundUp(size) - roundUp(fi.Size())
	if d > 0 {
		if err := m.Space.Reserve(d); err != nil {
			return syscall.ENOSPC
		}
	}
	if err := f.Truncate(size); err != nil {
		if d > 0 {
			m.Space.Release(d)
		}
		return errnoOf(err)
	}
	if d < 0 {
		m.Space.Release(-d)
	}
	return 0
}

// createMark is the extended attribute on a file or directory made by an
// exclusive create or a mkdir: the request's id, so that the same request
// re-sent (FlagRetry) after its stream ended recognises what it made.
const createMark = "user.pandastack.req"

func idBytes(id uint64) []byte {
	b := make([]byte, 8)
	for i := range 8 {
		b[i] = byte(id >> (56 - 8*i))
	}
	return b
}

// madeBy reports whether p carries req's mark.
func madeBy(m *Mount, p string, id uint64) bool {
	f, err := m.Root.OpenFile(rel(p), os.O_RDONLY|openFlags, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	buf := make([]byte, 8)
	n, err := unix.Fgetxattr(int(f.Fd()), createMark, buf)
	return err == nil && n == 8 && string(buf) == string(idBytes(id))
}

func mark(f *os.File, id uint64) {
	_ = unix.Fsetxattr(int(f.Fd()), createMark, idBytes(id), 0)
}

// chown gives what the guest made to its caller, when the host agent may
// (it runs as root); else the host's owner stays.
func chown(m *Mount, p string, req *volproto.Request) {
	if os.Geteuid() == 0 {
		_ = m.Root.Lchown(rel(p), int(req.UID), int(req.GID))
	}
}

func create(m *Mount, req *volproto.Request) *volproto.Response {
	defer lockPaths(m, req.Path)()
	flag := os.O_RDWR | os.O_CREATE
	excl := req.Flags&volproto.FlagExclusive != 0
	if excl {
		flag |= os.O_EXCL
	}
	fi, err := m.Root.Lstat(req.Path)
	existed := err == nil
	switch {
	case existed && excl:
		if req.Flags&volproto.FlagRetry != 0 && madeBy(m, req.Path, req.ID) {
			return lstatResp(m, req.Path)
		}
		return errResp(syscall.EEXIST)
	case existed && fi.IsDir():
		return errResp(syscall.EISDIR)
	case existed && !fi.Mode().IsRegular():
		// A symlink (O_NOFOLLOW: ELOOP) or anything else.
		return errResp(syscall.EEXIST)
	case existed && req.Flags&volproto.FlagTruncate != 0:
		if e := truncate(m, req.Path, 0); e != 0 {
			return errResp(e)
		}
		return lstatResp(m, req.Path)
	case existed:
		return attrResp(fi)
	}
	f, err := m.Root.OpenFile(req.Path, flag|openFlags, permBits(req.Mode))
	if err != nil {
		return errResp(errnoOf(err))
	}
	defer f.Close()
	if excl {
		mark(f, req.ID)
	}
	// The umask of the host agent must not apply: the guest's kernel
	// applied the guest's.
	_ = f.Chmod(permBits(req.Mode))
	chown(m, req.Path, req)
	fi, err = f.Stat()
	if err != nil {
		return errResp(errnoOf(err))
	}
	return attrResp(fi)
}

func mkdir(m *Mount, req *volproto.Request) *volproto.Response {
	defer lockPaths(m, req.Path)()
	if err := m.Space.Reserve(BlockSize); err != nil {
		return errResp(syscall.ENOSPC)
	}
	if err := m.Root.Mkdir(req.Path, permBits(req.Mode)); err != nil {
		m.Space.Release(BlockSize)
		if e := errnoOf(err); e == syscall.EEXIST && req.Flags&volproto.FlagRetry != 0 && madeBy(m, req.Path, req.ID) {
			return lstatResp(m, req.Path)
		}
		return errResp(errnoOf(err))
	}
	if f, err := m.Root.OpenFile(req.Path, os.O_RDONLY|openFlags, 0); err == nil {
		mark(f, req.ID)
		_ = f.Chmod(permBits(req.Mode) | fs.ModeDir)
		f.Close()
	}
	chown(m, req.Path, req)
	return lstatResp(m, req.Path)
}

func symlink(m *Mount, req *volproto.Request) *volproto.Response {
	defer lockPaths(m, req.Path)()
	if err := m.Space.Reserve(BlockSize); err != nil {
		return errResp(syscall.ENOSPC)
	}
	if err := m.Root.Symlink(req.Path2, req.Path); err != nil {
		m.Space.Release(BlockSize)
		if e := errnoOf(err); e == syscall.EEXIST && req.Flags&volproto.FlagRetry != 0 {
			if t, err := m.Root.Readlink(req.Path); err == nil && t == req.Path2 {
				return lstatResp(m, req.Path)
			}
		}
		return errResp(errnoOf(err))
	}
	chown(m, req.Path, req)
	return lstatResp(m, req.Path)
}

// remove unlinks a file or symlink (OpUnlink) or removes an empty
// directory (OpRmdir).
func remove(m *Mount, req *volproto.Request) *volproto.Response {
	defer lockPaths(m, req.Path)()
	retry := req.Flags&volproto.FlagRetry != 0
	fi, err := m.Root.Lstat(req.Path)
	if err != nil {
		if e := errnoOf(err); e == syscall.ENOENT && retry {
			return &volproto.Response{}
		}
		return errResp(errnoOf(err))
	}
	dir, err := m.Root.Open(rel(path.Dir(req.Path)))
	if err != nil {
		return errResp(errnoOf(err))
	}
	defer dir.Close()
	flags := 0
	if req.Op == volproto.OpRmdir {
		flags = unix.AT_REMOVEDIR
	}
	if err := unix.Unlinkat(int(dir.Fd()), path.Base(req.Path), flags); err != nil {
		if e := errnoOf(err); e == syscall.ENOENT && retry {
			return &volproto.Response{}
		}
		return errResp(errnoOf(err))
	}
	m.Space.Release(UsageOf(fi))
	return &volproto.Response{}
}

func rename(m *Mount, req *volproto.Request) *volproto.Response {
	defer lockPaths(m, req.Path, req.Path2)()
	retry := req.Flags&volproto.FlagRetry != 0
	if _, err := m.Root.Lstat(req.Path); err != nil {
		if errnoOf(err) == syscall.ENOENT && retry {
			if _, err := m.Root.Lstat(req.Path2); err == nil {
				return &volproto.Response{}
			}
		}
		return errResp(errnoOf(err))
	}
	target, terr := m.Root.Lstat(req.Path2)
	od, err := m.Root.Open(rel(path.Dir(req.Path)))
	if err != nil {
		return errResp(errnoOf(err))
	}
	defer od.Close()
	nd, err := m.Root.Open(rel(path.Dir(req.Path2)))
	if err != nil {
		return errResp(errnoOf(err))
	}
	defer nd.Close()
	var flags uint
	if req.Flags&volproto.FlagNoReplace != 0 {
		flags = unix.RENAME_NOREPLACE
	}
	if err := unix.Renameat2(int(od.Fd()), path.Base(req.Path), int(nd.Fd()), path.Base(req.Path2), flags); err != nil {
		return errResp(errnoOf(err))
	}
	if terr == nil {
		m.Space.Release(UsageOf(target))
	}
	return &volproto.Response{}
}

// fsync flushes p's data and its directory's entries to stable storage.
func fsync(m *Mount, req *volproto.Request) *volproto.Response {
	f, err := m.Root.OpenFile(rel(req.Path), os.O_RDONLY|openFlags, 0)
	if err != nil {
		if e := errnoOf(err); e == syscall.ELOOP {
			return &volproto.Response{} // a symlink: nothing to flush
		}
		return errResp(errnoOf(err))
	}
	err = f.Sync()
	f.Close()
	if err != nil {
		return errResp(errnoOf(err))
	}
	if req.Path != "" {
		if d, err := m.Root.Open(rel(path.Dir(req.Path))); err == nil {
			err = d.Sync()
			d.Close()
			if err != nil {
				return errResp(errnoOf(err))
			}
		}
	}
	return &volproto.Response{}
}

// readdir answers the entries of a directory from the cookie in Offset
// (the d_off of the last entry the guest has; 0: from the start) until
// the answer is full: N is the cookie to continue from and M is 1 if
// entries follow. Cookies are the file system's directory offsets, stable
// across opens (XFS, ext4), so the host keeps no open directory.
func readdir(m *Mount, req *volproto.Request) *volproto.Response {
	d, err := m.Root.Open(rel(req.Path))
	if err != nil {
		return errResp(errnoOf(err))
	}
	defer d.Close()
	fi, err := d.Stat()
	if err != nil {
		return errResp(errnoOf(err))
	}
	if !fi.IsDir() {
		return errResp(syscall.ENOTDIR)
	}
	fd := int(d.Fd())
	if _, err := unix.Seek(fd, req.Offset, io.SeekStart); err != nil {
		return errResp(errnoOf(err))
	}
	out := make([]byte, 0, 64<<10)
	buf := make([]byte, 32<<10)
	cookie := req.Offset
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return errResp(errnoOf(err))
		}
		if n == 0 {
			return &volproto.Response{Data: out, N: cookie}
		}
		for b := buf[:n]; len(b) >= 19; {
			ino := le64(b[0:])
			off := int64(le64(b[8:]))
			reclen := int(uint16(b[16]) | uint16(b[17])<<8)
			typ := b[18]
			if reclen < 19 || reclen > len(b) {
				return errResp(syscall.EIO)
			}
			name := b[19:reclen]
			for i, c := range name {
				if c == 0 {
					name = name[:i]
					break
				}
			}
			b = b[reclen:]
			nm := string(name)
			if nm == "." || nm == ".." {
				cookie = off
				continue
			}
			if len(out)+volproto.DirentSize(nm) > volproto.MaxData-64 {
				return &volproto.Response{Data: out, N: cookie, M: 1}
			}
			out = volproto.AppendDirent(out, volproto.Dirent{Name: nm, Mode: direntMode(m, req.Path, nm, typ), Ino: ino, Off: off})
			cookie = off
		}
	}
}

func le64(b []byte) uint64 {
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

// direntMode is the S_IFMT bits of a d_type (lstat when the file system
// does not say).
func direntMode(m *Mount, dir, name string, typ uint8) uint32 {
	switch typ {
	case unix.DT_REG:
		return syscall.S_IFREG
	case unix.DT_DIR:
		return syscall.S_IFDIR
	case unix.DT_LNK:
		return syscall.S_IFLNK
	case unix.DT_FIFO:
		return syscall.S_IFIFO
	case unix.DT_SOCK:
		return syscall.S_IFSOCK
	case unix.DT_CHR:
		return syscall.S_IFCHR
	case unix.DT_BLK:
		return syscall.S_IFBLK
	}
	if fi, err := m.Root.Lstat(path.Join(rel(dir), name)); err == nil {
		return attrOf(fi).Mode & syscall.S_IFMT
	}
	return syscall.S_IFREG
}
