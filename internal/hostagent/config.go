package hostagent

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"runtime"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/hostagent/network"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
)

// Config configures an Agent.
type Config struct {
	// DataDir holds everything the agent keeps: the store volume
	// (templates, sandboxes) and run directories.
	DataDir string
	// ImagesDir holds the outputs of `make setup` (default DataDir/images).
	ImagesDir string
	// RunDir holds per-sandbox sockets (default DataDir/run). Keep it
	// short: unix socket paths are limited to 108 bytes.
	RunDir string
	// Accel is auto (probe KVM once, cache the answer), kvm or tcg.
	Accel accel.Accel
	// Driver starts and adopts the sandboxes' VMMs and bakes' (required;
	// qemu.New in production). The agent does not close it.
	Driver vmm.Driver
	// VolumeSize is the size of the XFS image made when DataDir cannot
	// reflink (0: automatic).
	VolumeSize int64
	// AdoptMount: see volume.Options.AdoptMount.
	AdoptMount bool
	// MinFreeBytes is the free space below which creates fail with
	// ErrNoSpace (default 256 MiB).
	MinFreeBytes int64
	// MaxConcurrentStarts bounds the VMMs being restored at once (creates,
	// fork children, resumes); more wait their turn, so that a burst of
	// creates queues instead of thrashing the CPUs until restores time out
	// (default 2 per CPU, at least 4).
	MaxConcurrentStarts int
	// DefaultTemplate, DefaultMemoryMiB and DefaultVCPUs fill in create
	// requests that leave them out.
	DefaultTemplate  string
	DefaultMemoryMiB int
	DefaultVCPUs     int
	// OnExit, if set, is called (from its own goroutine) when a sandbox's
	// VMM exits without being killed through the agent.
	OnExit func(id string, err error)
	// Dial, if set, opens a TCP connection to port of the guest of sandbox
	// id, which is running (DialGuest checks that first): the sandbox
	// network's dialer. Its errors are returned wrapped: a refused
	// connection must match syscall.ECONNREFUSED and a timeout
	// context.DeadlineExceeded (errors.Is), as net.Dialer's do. Nil:
	// DialGuest dials over Network if set, else through the sandbox's
	// guest agent (the host has no network to its guests).
	Dial func(ctx context.Context, id string, port int) (net.Conn, error)
	// Network, if set, gives every sandbox a network namespace of its own
	// joined to the host, with the sandbox's egress policy, DNS and NAT
	// (its owner runs, detaches and closes it); DialGuest then dials
	// through it unless Dial is set. Nil: every sandbox's guest reaches
	// its gateway and nothing beyond (guestnet.Isolated).
	Network *network.Manager
	// BakeNetwork, with Network, lets bakes reach the network under this
	// policy (a template's set-up may install packages); nil: bakes get
	// an isolated namespace with no way out.
	BakeNetwork *netpolicy.Policy
	// Store, if set, keeps snapshots and paused sandboxes durable in an
	// object store shared with other hosts: each new snapshot and each
	// pause is uploaded in the background; a create from a snapshot whose
	// files this host lost, or never had, downloads it (store.go), and so
	// does a resume of a paused sandbox this host does not hold
	// (paused.go). Nil: both live only on this host's disk. The agent
	// does not close it.
	Store *chunkstore.Store
	// StoreRetry is the wait after a failed upload or store delete before
	// the next attempt, doubling up to 32 times this (default 2 s).
	StoreRetry time.Duration
	// Lazy, if set (with Store), restores snapshots and paused sandboxes
	// this host does not hold with their memory paged in on first touch
	// instead of downloaded first (lazy.go, docs/lazy-restore.md).
	Lazy   *LazyConfig
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.ImagesDir == "" {
		c.ImagesDir = filepath.Join(c.DataDir, "images")
	}
	if c.RunDir == "" {
		c.RunDir = filepath.Join(c.DataDir, "run")
	}
	if c.Accel == "" {
		c.Accel = accel.Auto
	}
	if c.MinFreeBytes == 0 {
		c.MinFreeBytes = 256 << 20
	}
	if c.MaxConcurrentStarts == 0 {
		c.MaxConcurrentStarts = max(4, 2*runtime.NumCPU())
	}
	if c.DefaultTemplate == "" {
		c.DefaultTemplate = "base"
	}
	if c.DefaultMemoryMiB == 0 {
		c.DefaultMemoryMiB = 1024
	}
	if c.DefaultVCPUs == 0 {
		c.DefaultVCPUs = 1
	}
	if c.StoreRetry == 0 {
		c.StoreRetry = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}
