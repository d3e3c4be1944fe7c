package volumes

// Space is a volume's byte accountant (implemented in store.go by v-host).
//
// Declared here until the host-side file server (serve*.go, v-guest's
// branch) lands with it; this file is then dropped.
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
