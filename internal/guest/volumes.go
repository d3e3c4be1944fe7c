package guest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/volproto"
)

// volManager keeps the guest's volume mounts and the client their file
// systems share. Its zero value is ready; it lives as long as the agent,
// so a restored or forked guest keeps its mounts and the requests they
// had in flight, which its client re-sends on the next volume stream.
type volManager struct {
	mu     sync.Mutex // serializes OPENs: mounting and unmounting
	client *volproto.Client
	mounts map[string]*volMount // by guest path
}

// volMount is one mounted volume.
type volMount struct {
	guestproto.VolumeMount
	server *fuse.Server
}

// volumes serves an OpVolumes stream: it makes the guest's volume mounts
// the OPEN's, answers REPLY {}, and carries the volume protocol until
// the stream ends (the host closed it, a newer volume stream replaced
// it, the session ended) or the agent stops.
func (s *Server) volumes(ctx context.Context, st *guestproto.Stream, req *guestproto.OpenRequest) {
	if err := guestproto.ValidateVolumeMounts(req.Volumes); err != nil {
		replyErr(st, err)
		return
	}
	client, err := s.vols.apply(req.Volumes)
	if err != nil {
		replyErr(st, err)
		return
	}
	if st.Reply(guestproto.Reply{}) != nil {
		return
	}
	conn := &streamConn{st: st}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := client.Serve(conn); err != nil && st.Err() == nil && ctx.Err() == nil {
		s.log.Error("volume stream", "err", err)
	}
}

// apply mounts what mounts lists and is not mounted yet (a path whose tag
// or read-only flag changed is mounted anew) and unmounts, lazily, the
// volume mounts it does not list. It returns the client to serve.
func (m *volManager) apply(mounts []guestproto.VolumeMount) (*volproto.Client, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.client == nil {
		m.client = volproto.NewClient()
		m.mounts = make(map[string]*volMount)
	}
	want := make(map[string]guestproto.VolumeMount, len(mounts))
	for _, v := range mounts {
		want[v.Path] = v
	}
	for p, old := range m.mounts {
		if w, ok := want[p]; !ok || w != old.VolumeMount {
			detach(p)
			delete(m.mounts, p)
		}
	}
	for _, v := range mounts {
		if m.mounts[v.Path] != nil {
			continue
		}
		srv, err := mountVolume(m.client, v)
		if err != nil {
			return nil, err
		}
		m.mounts[v.Path] = &volMount{VolumeMount: v, server: srv}
	}
	return m.client, nil
}

// detach unmounts a volume lazily: processes using it keep it until they
// let go; its FUSE server ends then.
func detach(path string) {
	_ = syscall.Unmount(path, syscall.MNT_DETACH)
}

// mountVolume mounts v's file system at v.Path, creating the directory.
func mountVolume(client *volproto.Client, v guestproto.VolumeMount) (*fuse.Server, error) {
	if err := os.MkdirAll(v.Path, 0o755); err != nil {
		return nil, guestproto.Errorf(guestproto.CodeInvalid, "create the mount point %s of volume %s: %v", v.Path, v.Tag, err)
	}
	if fi, err := os.Stat(v.Path); err != nil || !fi.IsDir() {
		return nil, guestproto.Errorf(guestproto.CodeInvalid, "the mount point %s of volume %s is not a directory", v.Path, v.Tag)
	}
	vfs := &volFS{client: client, tag: v.Tag, readOnly: v.ReadOnly}
	vfs.mounting.Store(true)
	defer vfs.mounting.Store(false)
	srv, err := fs.Mount(v.Path, &volNode{vfs: vfs}, volMountOptions(v))
	if err == nil {
		raiseReadahead(v.Path)
	}
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENODEV) {
			return nil, guestproto.Errorf(guestproto.CodeInternal, "mount volume %s at %s: this guest has no FUSE (/dev/fuse): %v", v.Tag, v.Path, err)
		}
		return nil, guestproto.Errorf(guestproto.CodeInternal, "mount volume %s at %s: %v", v.Tag, v.Path, err)
	}
	return srv, nil
}

// raiseReadahead lets the kernel read ahead volproto.MaxData on the
// mount at path: FUSE caps the readahead a file system asks for at its
// backing device's, 128 KiB by default, and each read is a round trip to
// the host. Best effort: a guest without sysfs reads ahead less.
func raiseReadahead(path string) {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return
	}
	bdi := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	_ = os.WriteFile(bdi, []byte(strconv.Itoa(volproto.MaxData>>10)), 0)
}

// volMountOptions are a volume's FUSE options: no kernel caching of
// entries or attributes (close-to-open consistency across sandboxes),
// the largest requests the kernel makes (1 MiB reads, writes and
// readahead: each is a round trip to the host), every guest user may use
// it (allow_other), and nosuid, nodev.
//
// Owners and modes are kept and shown but not enforced (no
// default_permissions): a volume is shared by sandboxes whose users
// differ (root, a template's USER) and by the files API, which writes as
// the host; one sandbox's user must not be locked out of what another
// wrote. The sandbox is one tenant's; the host's confinement is what
// guards the volume.
func volMountOptions(v guestproto.VolumeMount) *fs.Options {
	var zero time.Duration
	flags := uintptr(syscall.MS_NOSUID | syscall.MS_NODEV)
	if v.ReadOnly {
		flags |= syscall.MS_RDONLY
	}
	return &fs.Options{
		MountOptions: fuse.MountOptions{
			AllowOther:         true,
			FsName:             "panda-volume-" + v.Tag,
			Name:               "pandavol",
			DirectMountStrict:  true,
			DirectMountFlags:   flags,
			MaxWrite:           volproto.MaxData,
			MaxReadAhead:       volproto.MaxData,
			MaxBackground:      64,
			DisableReadDirPlus: true,
		},
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		NullPermissions: true,
	}
}

// UnmountVolumes unmounts every volume the agent mounted (lazily where a
// volume is in use); a later OpVolumes mounts them again.
func (s *Server) UnmountVolumes() { s.vols.unmountAll() }

func (m *volManager) unmountAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for p, v := range m.mounts {
		if err := v.server.Unmount(); err != nil {
			detach(p)
		}
		delete(m.mounts, p)
	}
}

// streamConn is a volume stream as the client's connection: Close aborts
// the stream (RESET), so that a replaced or failed stream ends at once.
type streamConn struct {
	st   *guestproto.Stream
	once sync.Once
}

func (c *streamConn) Read(p []byte) (int, error)  { return c.st.Read(p) }
func (c *streamConn) Write(p []byte) (int, error) { return c.st.Write(p) }

func (c *streamConn) Close() error {
	c.once.Do(func() {
		if c.st.Err() == nil {
			c.st.Reset(guestproto.Errorf(guestproto.CodeCanceled, "volume stream replaced or ended by the guest"))
		}
	})
	return nil
}
