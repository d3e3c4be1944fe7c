// Package host is the one contract between the control plane and a host:
// the Host interface that the REST API (package api) drives, and the
// vocabulary both sides share — sandbox and snapshot IDs, what a host says
// about a sandbox (Info, MemStats, SnapshotInfo, ...), and the errors a
// host reports (of internal/contract/errs's classes). Two implementations exist: the host agent of this process
// (agent.Local) and a host agent in another process reached over HTTP
// (hostclient.Client); both are checked against Host at compile time.
// Sandbox states are package lifecycle's.
//
// Every method that does I/O takes a ctx first; methods without one answer
// from what the implementation already holds (Accel, TemplateParams,
// Templates).
package host

import (
	"context"
	"io"
	"io/fs"
	"net"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
)

// Host is a host agent as the control plane uses it. Methods are safe for
// concurrent use. Errors are classified with this package's sentinels
// (ErrNotFound, ErrConflict, ErrInvalid, ErrNoSpace, ErrCorrupt,
// ErrNotReady, and ErrUnavailable when a remote host cannot be reached),
// the template package's (templates.ErrNotFound, ErrInvalid) and
// guestproto's error codes; ctx ending ends the call with ctx's error.
type Host interface {
	// Create restores a new sandbox from a template or snapshot and returns
	// once its guest agent answers.
	Create(ctx context.Context, req CreateRequest) (Info, error)
	// Kill stops a sandbox and removes what it holds (ErrNotFound if there
	// is none).
	Kill(ctx context.Context, id string) error
	// Get describes a sandbox (ErrNotFound if there is none).
	Get(ctx context.Context, id string) (Info, error)
	// List describes every sandbox of the host, oldest first.
	List(ctx context.Context) ([]Info, error)
	// Guest reaches the guest agent of a running sandbox. A local host
	// reports ErrNotFound or ErrConflict (not running) here; a remote one
	// may report them from the guest operation that follows instead.
	Guest(ctx context.Context, id string) (Guest, error)
	// Memory reports a running sandbox's memory use on its host.
	Memory(ctx context.Context, id string) (MemStats, error)
	// Templates is the host's template store.
	Templates() Templates
	// TemplateParams fills in the host's defaults for a template request
	// (no I/O: a remote host's defaults are those it last reported).
	TemplateParams(name string, memoryMiB, vcpus int) templates.Params
	// Accel is the accelerator the host's sandboxes run with (no I/O).
	Accel() accel.Accel

	// Fork captures the running sandbox id once and restores one child per
	// id of childIDs from it; a child that fails is reported in its
	// ForkChild.
	Fork(ctx context.Context, id string, childIDs []string) (ForkResult, error)
	// Snapshot captures a running sandbox into the durable snapshot
	// snapshotID; the sandbox runs on.
	Snapshot(ctx context.Context, id, snapshotID string) (SnapshotInfo, error)
	// DeleteSnapshot deletes a snapshot (ErrNotFound if there is none).
	DeleteSnapshot(ctx context.Context, snapshotID string) error
	// Pause captures a running sandbox to disk and stops its VMM.
	Pause(ctx context.Context, id string) (CaptureStats, error)
	// Resume restores a paused sandbox.
	Resume(ctx context.Context, id string) (Info, error)
	// SetNetwork changes a live sandbox's egress policy.
	SetNetwork(ctx context.Context, id string, p netpolicy.Policy) error
}

// Templates is a host's template store as the control plane sees it: what
// is baked (a template's Meta, never where its files are) and baking.
// Lookup's t is nil when the shape is not baked, with staleReason saying
// why a baked one would be rebaked ("" if it is current); Bake bakes p
// (again, if stale) and returns it. Errors are templates' classes.
type Templates interface {
	Lookup(ctx context.Context, p templates.Params) (t *templates.Meta, staleReason string, err error)
	List(ctx context.Context) ([]templates.Meta, error)
	Names(ctx context.Context) ([]string, error)
	Bake(ctx context.Context, p templates.Params, progress templates.Progress) (*templates.Meta, error)
}

// Guest is a running sandbox's guest agent. Methods are safe for
// concurrent use; see guestproto.Client for their contracts.
type Guest interface {
	StartExec(ctx context.Context, req guestproto.ExecRequest) (Process, error)
	ReadFile(ctx context.Context, path string) (io.ReadCloser, guestproto.FileInfo, error)
	WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) (int64, error)
	ListDir(ctx context.Context, path string) ([]guestproto.FileInfo, error)
	Stat(ctx context.Context, path string) (guestproto.FileInfo, error)
	Mkdir(ctx context.Context, path string) error
	Remove(ctx context.Context, path string, recursive bool) error
	Rename(ctx context.Context, oldpath, newpath string) error
}

// ProcessGuest is a Guest that keeps background processes (see
// guestproto.Client for the contracts). A local host's guests are, and so
// are a remote host's (hostclient).
type ProcessGuest interface {
	StartProcess(ctx context.Context, req guestproto.ExecRequest) (guestproto.ProcInfo, error)
	ListProcesses(ctx context.Context) ([]guestproto.ProcInfo, error)
	AttachProcess(ctx context.Context, pid int, stdoutOffset, stderrOffset int64) (*guestproto.Attachment, error)
	WriteProcessStdin(ctx context.Context, pid int, p []byte) error
	CloseProcessStdin(ctx context.Context, pid int) error
	SignalProcess(ctx context.Context, pid int, signal string) error
	WaitProcess(ctx context.Context, pid int) (guestproto.ProcInfo, error)
	RemoveProcess(ctx context.Context, pid int) error
	ResizeProcess(ctx context.Context, pid, rows, cols int) error
}

// DirWatcher is the optional ability of a Guest to watch a directory
// (guestproto.Client.WatchDir). A local host's guests have it, and so do a
// remote host's.
type DirWatcher interface {
	WatchDir(ctx context.Context, path string, recursive bool) (*guestproto.DirWatch, error)
}

// Process is a command started by Guest.StartExec. Read Stdout and Stderr
// concurrently to EOF, then Wait. Cancelling StartExec's ctx kills it.
type Process interface {
	PID() int
	Stdin() io.WriteCloser
	Stdout() io.Reader
	Stderr() io.Reader
	Wait() (guestproto.ExecResult, error)
}

// GuestDialer is an optional ability of a Host: TCP connections to the
// guests of its running sandboxes (the guest's fixed address on the
// sandbox's own network, or, on a host without sandbox networking, the
// guest's loopback through its guest agent). A Host without it cannot
// reach its guests' ports.
type GuestDialer interface {
	// DialGuest opens a TCP connection to port (1-65535) of the guest of
	// the running sandbox id. The connection is the caller's to close; the
	// sandbox stopping or its network going away ends it, and may leave
	// it to fail only on its next read or write. Errors: ErrNotFound (no
	// such sandbox), ErrConflict (not running), ErrInvalid (port out of
	// range), an error matching syscall.ECONNREFUSED (errors.Is) when
	// nothing listens on the port, one matching context.DeadlineExceeded
	// when the guest does not answer in time or ctx ends,
	// errors.ErrUnsupported when the host cannot reach the guest's ports
	// (no sandbox networking, and a guest agent too old to carry
	// connections), a *guestproto.Error of CodeBusy when the guest agent
	// carries its limit of connections, ErrUnavailable when a remote host
	// cannot be reached. Safe for concurrent use.
	DialGuest(ctx context.Context, id string, port int) (net.Conn, error)
}

// SnapshotLister is an optional ability of a Host: listing the snapshots
// it holds, oldest first, so that the control plane can record one a
// crash left unrecorded.
type SnapshotLister interface {
	Snapshots(ctx context.Context) ([]SnapshotInfo, error)
}

// Transferer is an optional ability of a Host with an object store:
// captures that exist only to carry a sandbox to other hosts (a
// cross-host fork), and waiting for one to reach the store.
type Transferer interface {
	// SnapshotTransient is Snapshot for a capture the caller deletes once
	// the other hosts have restored from it: it is uploaded to the object
	// store as any snapshot, but not sealed with checksums nor flushed on
	// its host (the store's chunks are content-addressed and checked on
	// every fetch), and a restart of the host removes it, from the store
	// too (SnapshotInfo.Transient). A host that cannot take such a capture
	// takes a durable snapshot instead (Transient false).
	SnapshotTransient(ctx context.Context, id, snapshotID string) (SnapshotInfo, error)
	// AwaitStored returns snapshotID as the host describes it once it is
	// durable in the object store (Stored), or after wait if it is not by
	// then (still uploading, StoreError saying why the last attempt
	// failed). ErrNotFound if there is no such snapshot; an error matching
	// errors.ErrUnsupported from a remote host that cannot wait (an older
	// agent: list its snapshots instead).
	AwaitStored(ctx context.Context, snapshotID string, wait time.Duration) (SnapshotInfo, error)
}

// DirectTransferer is an optional ability of a Host: handing a snapshot
// (a cross-host fork's transient capture) straight to another host, as
// one stream of what differs from the template both hold (a pack:
// package chunkstore), without the object store.
type DirectTransferer interface {
	// SnapshotPack opens snapshot snapshotID, held on this host, as a
	// pack. The caller closes it; a Read that fails means the stream
	// broke (what was read is then an incomplete pack, which a receiver
	// refuses). ErrNotFound if the host does not hold the snapshot's
	// files; an error matching errors.ErrUnsupported from a remote host
	// that cannot send one (an older agent).
	SnapshotPack(ctx context.Context, snapshotID string) (io.ReadCloser, error)
	// ReceiveSnapshot reads a pack (another host's SnapshotPack) from r
	// and keeps it as snapshot snapshotID, complete or not at all: a
	// Create from snapshotID then restores from it, and DeleteSnapshot
	// removes it. SnapshotInfo.FetchedBytes is the length of the pack.
	// Errors: templates.ErrNotFound when the host lacks the capture's
	// template (or holds another bake of it), before it writes anything;
	// ErrCorrupt when the stream is cut short or damaged; ErrConflict if
	// the host has snapshotID already; errors.ErrUnsupported from an
	// older remote agent. In each case the caller may send the snapshot
	// through the object store instead.
	ReceiveSnapshot(ctx context.Context, snapshotID string, r io.Reader) (SnapshotInfo, error)
}

// PackCreator is an optional ability of a Host that is a DirectTransferer:
// receiving a pack and creating a sandbox from it in one call, so that the
// sandbox's VMM starts while the pack still arrives (a cross-host fork's
// first child on a host).
type PackCreator interface {
	// ReceiveAndCreate receives a pack of snapshot req.SnapshotID from
	// r, as ReceiveSnapshot, and creates sandbox req from it, as
	// Create. A pack that is not received returns ReceiveSnapshot's
	// errors (the caller may send it another way) and a zero
	// SnapshotInfo; one that is received is kept as snapshot
	// req.SnapshotID (its SnapshotInfo returned) even if the create then
	// fails (Create's errors).
	ReceiveAndCreate(ctx context.Context, req CreateRequest, r io.Reader) (Info, SnapshotInfo, error)
}

// PackSource is where a host fetches a snapshot's pack straight from the
// host that holds it: that host agent's URL, the CA certificate (PEM)
// its TLS certificate must verify against, and a ticket that grants
// reading that one snapshot's pack, and nothing else, until it expires.
type PackSource struct {
	URL    string `json:"url"`
	CACert string `json:"ca_cert,omitempty"`
	Ticket string `json:"ticket"`
}

// PackSourcer is an optional ability of a remote DirectTransferer: saying
// where another host can fetch a snapshot's pack from it (PackSource,
// valid for ttl); false if it cannot.
type PackSourcer interface {
	PackSource(snapshotID string, ttl time.Duration) (PackSource, bool)
}

// PackPuller is an optional ability of a PackCreator: fetching the pack
// of snapshot req.SnapshotID straight from another host (from) and
// creating sandbox req from it as it arrives, so that the pack crosses
// the network once, host to host. Errors and the SnapshotInfo are
// ReceiveAndCreate's; an error with a zero SnapshotInfo means the pack
// was not received (the host cannot reach from, say): the caller may
// send it another way.
type PackPuller interface {
	PullAndCreate(ctx context.Context, req CreateRequest, from PackSource) (Info, SnapshotInfo, error)
}

// ResourceReporter is an optional ability of a Host that runs on another
// machine: that machine's resources (an error: it cannot be reached). A
// Host without it runs on this machine (LocalResources).
type ResourceReporter interface {
	Resources(ctx context.Context) (Resources, error)
}

// NetworkReporter is a host that says whether it gives its sandboxes
// networking (no I/O: a remote host's as it last reported).
type NetworkReporter interface {
	// NetworkOff reports that the host runs without sandbox networking
	// (--network off): its guests reach nothing beyond their own
	// interface, whatever their egress policy says.
	NetworkOff() bool
}

// Volumes is an optional ability of a Host: the volumes it stores.
// Errors: ErrNotFound, ErrConflict (exists; or, for DeleteVolume without
// force, a running or paused sandbox of this host mounts it), ErrInvalid
// (bad id, a smaller limit, a path that is not clean), ErrNoSpace (over the
// limit), guestproto-style file errors mapped to these classes. Safe for
// concurrent use.
type Volumes interface {
	CreateVolume(ctx context.Context, id string, limitBytes int64) (VolumeInfo, error)
	GetVolume(ctx context.Context, id string) (VolumeInfo, error)
	ListVolumes(ctx context.Context) ([]VolumeInfo, error)
	DeleteVolume(ctx context.Context, id string, force bool) error
	ResizeVolume(ctx context.Context, id string, limitBytes int64) (VolumeInfo, error)
	// BranchVolume clones src into the new volume dst (same limit).
	BranchVolume(ctx context.Context, src, dst string) (VolumeInfo, error)
	// PromoteVolume makes target's tree branch's, then deletes branch.
	PromoteVolume(ctx context.Context, branch, target string) (VolumeInfo, error)
	// Files: paths are slash-separated, relative to the volume root
	// ("/a/b" and "a/b" alike; "" or "/" is the root).
	ListVolumeDir(ctx context.Context, id, path string) ([]guestproto.FileInfo, error)
	StatVolumeFile(ctx context.Context, id, path string) (guestproto.FileInfo, error)
	ReadVolumeFile(ctx context.Context, id, path string) (io.ReadCloser, guestproto.FileInfo, error)
	WriteVolumeFile(ctx context.Context, id, path string, r io.Reader, mode fs.FileMode) (int64, error)
	MkdirVolume(ctx context.Context, id, path string) error
	RemoveVolumeFile(ctx context.Context, id, path string, recursive bool) error
}

// VolumeForker is an optional ability of a Host: a fork whose children
// mount other volumes than their parent (branch mode).
type VolumeForker interface {
	ForkWithVolumes(ctx context.Context, id string, children []ForkSpec) (ForkResult, error)
}
