// Package volproto is the volume protocol: the messages a guest's volume
// file system (FUSE, in the guest agent) sends to the host that stores the
// volumes, and the host's answers, carried by the session's volume stream
// (guestproto.OpVolumes).
//
// The protocol is stateless by path: a request names a mount (its tag) and
// a path relative to the volume's root, never a host-side node or open
// file, so that a guest cloned by a fork or a restore can send the
// requests its daemon had in flight to a new host session and they still
// make sense. Requests carry ids; many may be outstanding at once and
// answers come in any order. Errors are Linux errno values.
//
// Each message is a 4-byte big-endian length followed by that many bytes
// (at most MaxMessage). Both sides treat the other as hostile: every
// message is bounded and validated (Decode*), never trusted.
//
// It depends on the standard library only.
package volproto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"syscall"
)

// Op is a request's operation.
type Op uint8

// Operations. Paths are relative to the volume root ("" is the root).
const (
	OpLookup   Op = 1  // lstat Path → Attr
	OpSetattr  Op = 2  // Flags (Set*) say which of Mode, Size (Offset), UID/GID, Atime, Mtime to set → Attr
	OpReaddir  Op = 3  // entries of Path from the cookie Offset (0: the start) → Data (Dirents), N = the next cookie, M = 1 if cut short
	OpRead     Op = 4  // Size bytes at Offset → Data (short at end of file)
	OpWrite    Op = 5  // Data at Offset → N bytes written, Attr
	OpCreate   Op = 6  // a regular file with Mode (FlagExclusive: it must not exist; FlagTruncate) → Attr
	OpMkdir    Op = 7  // Mode → Attr
	OpUnlink   Op = 8  // a file or symlink
	OpRmdir    Op = 9  // an empty directory
	OpRename   Op = 10 // Path → Path2 (FlagNoReplace: fail with EEXIST if Path2 exists)
	OpSymlink  Op = 11 // Path, a symlink to Path2 (the target, stored as is) → Attr
	OpReadlink Op = 12 // → Data (the target)
	OpFsync    Op = 13 // flush Path's data to stable storage
	OpStatfs   Op = 14 // → N = limit, M = used (bytes)
	maxOp         = OpStatfs
)

var opNames = [...]string{"", "lookup", "setattr", "readdir", "read", "write", "create", "mkdir", "unlink", "rmdir", "rename", "symlink", "readlink", "fsync", "statfs"}

func (o Op) String() string {
	if o >= 1 && o <= maxOp {
		return opNames[o]
	}
	return fmt.Sprintf("op%d", o)
}

// Request flags.
const (
	// FlagRetry marks a request re-sent because the stream it was
	// outstanding on ended: it may have been done already, and the host
	// treats the error a repetition would cause (EEXIST of what the
	// request itself created, ENOENT of what it removed) as success.
	FlagRetry uint32 = 1 << 0
	// FlagExclusive: OpCreate fails with EEXIST if the path exists.
	FlagExclusive uint32 = 1 << 1
	// FlagTruncate: OpCreate of an existing file truncates it.
	FlagTruncate uint32 = 1 << 2
	// FlagNoReplace: OpRename fails with EEXIST if the target exists.
	FlagNoReplace uint32 = 1 << 3
	// OpSetattr: which attributes to set.
	SetMode  uint32 = 1 << 8
	SetSize  uint32 = 1 << 9
	SetOwner uint32 = 1 << 10 // UID and GID (^uint32(0): unchanged)
	SetAtime uint32 = 1 << 11
	SetMtime uint32 = 1 << 12
	// SetAtimeNow and SetMtimeNow set the time to the host's now.
	SetAtimeNow uint32 = 1 << 13
	SetMtimeNow uint32 = 1 << 14
)

// Limits.
const (
	// MaxData bounds a request's or answer's Data: a write or a read moves
	// at most this much.
	MaxData = 1 << 20
	// MaxPath bounds Path and Path2 (as PATH_MAX).
	MaxPath = 4096
	// MaxName bounds one path element (as NAME_MAX).
	MaxName = 255
	// MaxTag bounds Tag.
	MaxTag = 64
	// MaxHeader bounds a message's bytes other than Data.
	MaxHeader = 16 << 10
	// MaxMessage bounds a message (without its 4-byte length).
	MaxMessage = MaxData + MaxHeader
)

// Request is one operation the guest asks of the host.
type Request struct {
	ID     uint64
	Op     Op
	Flags  uint32
	Mode   uint32 // permission bits (and, for OpSetattr, nothing else)
	UID    uint32 // the caller's (OpCreate, OpMkdir, OpSymlink) or the new owner (SetOwner)
	GID    uint32
	Offset int64  // OpRead, OpWrite; the new size of OpSetattr's SetSize
	Size   uint32 // OpRead: bytes wanted (at most MaxData)
	Atime  int64  // Unix nanoseconds (SetAtime)
	Mtime  int64  // Unix nanoseconds (SetMtime)
	Tag    string // the mount (guestproto.VolumeMount.Tag)
	Path   string
	Path2  string // OpRename's target, OpSymlink's target
	Data   []byte // OpWrite
}

// Attr is a file's attributes (lstat).
type Attr struct {
	Ino    uint64
	Mode   uint32 // type and permission bits, as syscall.Stat_t's
	Nlink  uint32
	UID    uint32
	GID    uint32
	Size   int64
	Blocks int64 // 512-byte blocks
	Atime  int64 // Unix nanoseconds
	Mtime  int64
	Ctime  int64
}

// Response is the host's answer to the request of the same ID.
type Response struct {
	ID    uint64
	Errno syscall.Errno // 0: success
	// HasAttr says Attr is set.
	HasAttr bool
	Attr    Attr
	N       int64 // OpWrite: bytes written; OpStatfs: limit
	M       int64 // OpStatfs: used; OpReaddir: 1 if more entries follow (N: the cookie to go on from)
	Data    []byte
}

// Errno values the guest accepts from the host; any other is EIO.
var knownErrno = map[syscall.Errno]bool{
	syscall.EPERM: true, syscall.ENOENT: true, syscall.EIO: true, syscall.EBADF: true,
	syscall.EACCES: true, syscall.EEXIST: true, syscall.EXDEV: true, syscall.ENOTDIR: true,
	syscall.EISDIR: true, syscall.EINVAL: true, syscall.EFBIG: true, syscall.ENOSPC: true,
	syscall.EROFS: true, syscall.EMLINK: true, syscall.ENAMETOOLONG: true, syscall.ENOTEMPTY: true,
	syscall.ELOOP: true, syscall.ESTALE: true, syscall.EDQUOT: true, syscall.EBUSY: true,
	syscall.ENOTSUP: true, syscall.EINTR: true, syscall.EAGAIN: true, syscall.ENOSYS: true,
	syscall.EOVERFLOW: true, syscall.ETXTBSY: true, syscall.ENODATA: true,
}

// KnownErrno reports whether e is an errno the protocol carries; a guest
// turns any other into EIO.
func KnownErrno(e syscall.Errno) bool { return knownErrno[e] }

// ErrMessage is the error class of malformed messages.
var ErrMessage = errors.New("malformed volume message")

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMessage, fmt.Sprintf(format, args...))
}

// ValidPath reports whether p is a volume path: "" (the root) or a clean,
// relative, slash-separated path of elements of at most MaxName bytes,
// none "." or "..", without NUL, of at most MaxPath bytes.
func ValidPath(p string) bool {
	if p == "" {
		return true
	}
	if len(p) > MaxPath || strings.IndexByte(p, 0) >= 0 || p[0] == '/' || path.Clean(p) != p || p == "." {
		return false
	}
	for el := range strings.SplitSeq(p, "/") {
		if el == ".." || el == "." || el == "" || len(el) > MaxName {
			return false
		}
	}
	return true
}

// ValidName reports whether name is one path element.
func ValidName(name string) bool {
	return name != "" && name != "." && name != ".." && len(name) <= MaxName && !strings.ContainsAny(name, "/\x00")
}

// Validate reports whether r is well-formed: a known op, a tag, valid
// paths, bounded data, and the fields its op needs.
func (r *Request) Validate() error {
	switch {
	case r.Op < 1 || r.Op > maxOp:
		return bad("unknown op %d", r.Op)
	case r.Tag == "" || len(r.Tag) > MaxTag:
		return bad("tag of %d bytes", len(r.Tag))
	case !ValidPath(r.Path):
		return bad("%s: path %q is not a clean relative path", r.Op, r.Path)
	case len(r.Data) > MaxData:
		return bad("%s: %d bytes of data", r.Op, len(r.Data))
	case r.Offset < 0:
		return bad("%s: negative offset", r.Op)
	}
	switch r.Op {
	case OpRead:
		if r.Size > MaxData {
			return bad("read of %d bytes", r.Size)
		}
	case OpRename:
		if !ValidPath(r.Path2) || r.Path == "" || r.Path2 == "" {
			return bad("rename %q to %q: not clean relative paths", r.Path, r.Path2)
		}
	case OpSymlink:
		if r.Path2 == "" || len(r.Path2) > MaxPath || strings.IndexByte(r.Path2, 0) >= 0 {
			return bad("symlink target of %d bytes", len(r.Path2))
		}
	case OpCreate, OpMkdir, OpUnlink, OpRmdir:
		if r.Path == "" {
			return bad("%s of the volume root", r.Op)
		}
	}
	if r.Op != OpWrite && len(r.Data) > 0 {
		return bad("%s carries data", r.Op)
	}
	return nil
}

// Message encoding: fixed-size fields, big-endian, then length-prefixed
// strings and data.

// AppendRequest appends r's message (length prefix included) to b.
func AppendRequest(b []byte, r *Request) []byte {
	start := len(b)
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint64(b, r.ID)
	b = append(b, byte(r.Op))
	b = binary.BigEndian.AppendUint32(b, r.Flags)
	b = binary.BigEndian.AppendUint32(b, r.Mode)
	b = binary.BigEndian.AppendUint32(b, r.UID)
	b = binary.BigEndian.AppendUint32(b, r.GID)
	b = binary.BigEndian.AppendUint32(b, r.Size)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Offset))
	b = binary.BigEndian.AppendUint64(b, uint64(r.Atime))
	b = binary.BigEndian.AppendUint64(b, uint64(r.Mtime))
	b = appendString(b, r.Tag)
	b = appendString(b, r.Path)
	b = appendString(b, r.Path2)
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Data)))
	b = append(b, r.Data...)
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// DecodeRequest decodes and validates a request message body (without
// its length prefix). Data aliases body.
func DecodeRequest(body []byte) (*Request, error) {
	d := decoder{b: body}
	r := &Request{}
	r.ID = d.u64()
	r.Op = Op(d.u8())
	r.Flags = d.u32()
	r.Mode = d.u32()
	r.UID = d.u32()
	r.GID = d.u32()
	r.Size = d.u32()
	r.Offset = int64(d.u64())
	r.Atime = int64(d.u64())
	r.Mtime = int64(d.u64())
	r.Tag = d.str(MaxTag)
	r.Path = d.str(MaxPath)
	r.Path2 = d.str(MaxPath)
	r.Data = d.bytes(MaxData)
	if err := d.end(); err != nil {
		return nil, err
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return r, nil
}

// AppendResponse appends r's message (length prefix included) to b.
func AppendResponse(b []byte, r *Response) []byte {
	start := len(b)
	b = binary.BigEndian.AppendUint32(b, 0)
	b = binary.BigEndian.AppendUint64(b, r.ID)
	b = binary.BigEndian.AppendUint32(b, uint32(r.Errno))
	if r.HasAttr {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	a := &r.Attr
	b = binary.BigEndian.AppendUint64(b, a.Ino)
	b = binary.BigEndian.AppendUint32(b, a.Mode)
	b = binary.BigEndian.AppendUint32(b, a.Nlink)
	b = binary.BigEndian.AppendUint32(b, a.UID)
	b = binary.BigEndian.AppendUint32(b, a.GID)
	for _, v := range []int64{a.Size, a.Blocks, a.Atime, a.Mtime, a.Ctime, r.N, r.M} {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.Data)))
	b = append(b, r.Data...)
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
	return b
}

// DecodeResponse decodes and validates a response body (without its
// length prefix): an errno the protocol does not carry becomes EIO, a
// negative size, count or an attribute set with an error is malformed.
// Data aliases body.
func DecodeResponse(body []byte) (*Response, error) {
	d := decoder{b: body}
	r := &Response{}
	r.ID = d.u64()
	r.Errno = syscall.Errno(d.u32())
	hasAttr := d.u8()
	a := &r.Attr
	a.Ino = d.u64()
	a.Mode = d.u32()
	a.Nlink = d.u32()
	a.UID = d.u32()
	a.GID = d.u32()
	a.Size = int64(d.u64())
	a.Blocks = int64(d.u64())
	a.Atime = int64(d.u64())
	a.Mtime = int64(d.u64())
	a.Ctime = int64(d.u64())
	r.N = int64(d.u64())
	r.M = int64(d.u64())
	r.Data = d.bytes(MaxData)
	if err := d.end(); err != nil {
		return nil, err
	}
	switch {
	case hasAttr > 1:
		return nil, bad("attribute flag %d", hasAttr)
	case a.Size < 0 || a.Blocks < 0 || r.N < 0 || r.M < 0:
		return nil, bad("negative size or count")
	case r.Errno != 0 && (hasAttr == 1 || len(r.Data) > 0):
		return nil, bad("an error with a result")
	}
	r.HasAttr = hasAttr == 1
	if r.Errno != 0 && !KnownErrno(r.Errno) {
		r.Errno = syscall.EIO
	}
	return r, nil
}

// ReadMessage reads one message and returns its body in buf when it fits
// (else in a new slice). A length over MaxMessage is malformed, and the
// stream cannot be resynchronized after it.
func ReadMessage(r io.Reader, buf []byte) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxMessage {
		return nil, bad("message of %d bytes exceeds %d", n, MaxMessage)
	}
	if int(n) > cap(buf) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}

// decoder reads fields of a message body; the first shortfall or bound
// broken sticks as err.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.err = bad("truncated message")
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if v := d.take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if v := d.take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (d *decoder) str(limit int) string {
	v := d.take(2)
	if v == nil {
		return ""
	}
	n := int(binary.BigEndian.Uint16(v))
	if n > limit {
		d.err = bad("string of %d bytes exceeds %d", n, limit)
		return ""
	}
	return string(d.take(n))
}

func (d *decoder) bytes(limit int) []byte {
	v := d.take(4)
	if v == nil {
		return nil
	}
	n := binary.BigEndian.Uint32(v)
	if n > uint32(limit) {
		d.err = bad("data of %d bytes exceeds %d", n, limit)
		return nil
	}
	if n == 0 {
		d.take(0)
		return nil
	}
	return d.take(int(n))
}

func (d *decoder) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = bad("%d trailing bytes", len(d.b))
	}
	return d.err
}

// Dirent is one directory entry of OpReaddir's Data.
type Dirent struct {
	Name string
	Mode uint32 // type bits (S_IFMT) only
	Ino  uint64
	Off  int64 // the cookie of the entry after this one
}

// AppendDirent appends e's encoding to b.
func AppendDirent(b []byte, e Dirent) []byte {
	b = appendString(b, e.Name)
	b = binary.BigEndian.AppendUint32(b, e.Mode)
	b = binary.BigEndian.AppendUint64(b, e.Ino)
	return binary.BigEndian.AppendUint64(b, uint64(e.Off))
}

// DirentSize is the encoded size of an entry named name.
func DirentSize(name string) int { return 2 + len(name) + 4 + 8 + 8 }

// DecodeDirents decodes OpReaddir's Data; a malformed entry (a name that
// is not one path element) fails it.
func DecodeDirents(data []byte) ([]Dirent, error) {
	d := decoder{b: data}
	var out []Dirent
	for len(d.b) > 0 && d.err == nil {
		var e Dirent
		e.Name = d.str(MaxName)
		e.Mode = d.u32()
		e.Ino = d.u64()
		e.Off = int64(d.u64())
		if d.err != nil {
			break
		}
		if !ValidName(e.Name) {
			return nil, bad("directory entry name %q", e.Name)
		}
		out = append(out, e)
	}
	if d.err != nil {
		return nil, d.err
	}
	return out, nil
}
