package volumes

import (
	"context"
	"net"
	"os"
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

// Serve answers the guest's requests on conn until conn ends or ctx is
// done. Never trusts the guest: confinement, quota, refused ops as above;
// bounded concurrency per connection (a guest cannot exhaust host threads
// or memory). Returns nil when conn ends cleanly.
func Serve(ctx context.Context, conn net.Conn, mounts []Mount) error {
	panic("volumes.Serve: not yet")
}
