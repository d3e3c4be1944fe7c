package host

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
)

// Info describes a sandbox on its host.
type Info struct {
	ID        string          `json:"id"`
	Template  string          `json:"template"`
	MemoryMiB int             `json:"memory_mib"`
	VCPUs     int             `json:"vcpus"`
	State     lifecycle.State `json:"state"`
	CreatedAt time.Time       `json:"created_at"`
	PID       int             `json:"pid"`
	Hostname  string          `json:"hostname"`
	ParentID  string          `json:"parent_id,omitempty"`
	Snapshot  string          `json:"snapshot_id,omitempty"`
	// Busy: an operation (pause, resume, snapshot, fork) holds the
	// sandbox's operation slot; what it makes may appear after this Info.
	Busy bool `json:"busy,omitempty"`
	// Stored is where a paused sandbox's capture is kept ("" while the
	// sandbox is not paused): StoredLocal (only on this host's disk: the
	// host has no object store), StoredUploading (on this host's disk,
	// being uploaded) or StoredDurable (in the object store as the set
	// paused/<id>: any host sharing the store can Resume it, even if this
	// host is lost).
	Stored string `json:"stored,omitempty"`
	// StoreError is why the last upload of the paused sandbox failed (""
	// if it did not); uploads are retried until they succeed.
	StoreError string `json:"store_error,omitempty"`
	// UploadedBytes is what the upload of a paused sandbox's capture sent
	// to the object store (bytes of the chunks it did not hold already:
	// not those the sandbox's template, or an earlier capture, shares
	// with it); 0 until it is durable, and while not paused.
	UploadedBytes int64 `json:"uploaded_bytes,omitempty"`
	// FetchedBytes is what this host read from the object store to start
	// the sandbox as it runs now: the chunks of the snapshot it was
	// created from, or of the capture it was resumed from, that no local
	// file (its template) held. 0 if it started from local files only, and
	// after a restart of the host agent.
	FetchedBytes int64 `json:"fetched_bytes,omitempty"`
	// Volumes are the volumes the sandbox mounts (kept across pause,
	// resume and restarts of the host agent).
	Volumes []VolumeMount `json:"volumes,omitempty"`
}

// CreateRequest asks for a new sandbox.
type CreateRequest struct {
	// ID is the sandbox id (ValidID); empty picks one.
	ID        string
	Template  string
	MemoryMiB int
	VCPUs     int
	// Env is the default environment of every exec in the sandbox.
	Env map[string]string
	// SnapshotID, if set, restores the snapshot instead of a template
	// (Template, MemoryMiB and VCPUs are then ignored).
	SnapshotID string
	// Owner is the tenant (API key) the sandbox belongs to. Sandboxes of
	// one owner share their template's memory pages; sandboxes of
	// different owners never share a page: each owner maps its own reflink
	// copy of the template's memory image, whose page cache is its own. ""
	// shares with every other "" (tests, benchmarks).
	Owner string
	// Progress receives bake progress if the template must be baked first
	// (a remote host reports none).
	Progress templates.Progress
	// Network is the sandbox's egress policy. The zero Policy denies
	// everything: callers that mean "online" pass network.DefaultPolicy()
	// (the API always sets one).
	Network netpolicy.Policy
	// Volumes are the volumes of this host the sandbox mounts (a create
	// from a snapshot mounts these, not the captured sandbox's). A guest
	// that cannot mount them fails the create.
	Volumes []VolumeMount
}

// VolumeMount is one volume a sandbox mounts.
type VolumeMount struct {
	Volume   string `json:"volume"` // volume id, "vol_" + 16 lowercase alnum
	Path     string `json:"path"`   // absolute guest path
	ReadOnly bool   `json:"read_only,omitempty"`
}

// VolumeInfo describes a volume on its host.
type VolumeInfo struct {
	ID         string    `json:"id"`
	LimitBytes int64     `json:"limit_bytes"`
	UsedBytes  int64     `json:"used_bytes"`
	CreatedAt  time.Time `json:"created_at"`
}

// ForkSpec is one child of a VolumeForker's fork.
type ForkSpec struct {
	ID string
	// Volumes the child mounts; nil: the parent's. Branches are cloned
	// (From → To, new volume ids) while the parent is stopped for the
	// capture, before the child starts; Volumes then names the To ids.
	Volumes  []VolumeMount
	Branches []VolumeBranch
}

// VolumeBranch is a volume cloned for a fork's child: From's tree copied
// into the new volume To.
type VolumeBranch struct{ From, To string }

// MemStats is the host memory a sandbox's VMM uses, from smaps_rollup.
type MemStats struct {
	RSSBytes     int64 `json:"rss_bytes"`
	PSSBytes     int64 `json:"pss_bytes"`     // shared pages divided among their sharers
	PrivateBytes int64 `json:"private_bytes"` // pages only this sandbox maps (what it dirtied, plus VMM heap)
	SharedBytes  int64 `json:"shared_bytes"`  // pages mapped by others too (its template's memory image, binaries)
	// Lazy describes a memory image paged in lazily from the object store
	// (docs/lazy-restore.md); nil for any other sandbox.
	Lazy *LazyMemStats `json:"lazy,omitempty"`
}

// LazyMemStats is what of a lazily paged memory image has been read and
// fetched so far. The figures are the image's, on its host: every sandbox
// of that host restored from the same snapshot or paused sandbox shares
// them, as they share its page cache.
type LazyMemStats struct {
	ImageBytes int64 `json:"image_bytes"`
	// ReadBytes is what the kernel read through the lazy file (page
	// faults, readahead).
	ReadBytes int64 `json:"read_bytes"`
	// FetchedBytes is the size of the distinct chunks taken from the
	// object store (through the host's chunk cache), by faults or the
	// background fetch; LocalBytes what reads took from this host's copy
	// of the template instead.
	FetchedBytes int64 `json:"fetched_bytes"`
	LocalBytes   int64 `json:"local_bytes"`
}

// CaptureStats describes one capture of a running sandbox.
type CaptureStats struct {
	// Paused is how long the sandbox's vCPUs were stopped.
	Paused time.Duration `json:"-"`
	// PausedMS is Paused in milliseconds.
	PausedMS float64 `json:"paused_ms"`
	// DirtyBytes is how much guest RAM the sandbox had written since its
	// restore: what the capture copied.
	DirtyBytes int64 `json:"dirty_bytes"`
	// Runs is the number of contiguous dirty ranges.
	Runs int `json:"runs"`
	// SizeBytes is the disk space a pause capture holds (allocated blocks
	// of its files); 0 for other captures.
	SizeBytes int64 `json:"size_bytes,omitempty"`
}

// ForkChild is the outcome of one child of a fork.
type ForkChild struct {
	Info Info
	Err  error
}

// ForkResult describes a fork.
type ForkResult struct {
	Children []ForkChild
	Capture  CaptureStats
}

// Shape is what the control plane knows of a captured machine: its memory
// and vCPUs, under the names its host's full machine spec gives them (so
// that a snapshot's "spec" reads the same from hosts of any version).
type Shape struct {
	MemoryMiB int `json:"MemoryMiB"`
	VCPUs     int `json:"VCPUs"`
}

// SnapshotInfo describes a durable snapshot.
type SnapshotInfo struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandbox_id"`
	Template  string `json:"template"`
	// Spec is the shape of the machine the snapshot was taken from (its
	// host records the whole machine: hostagent.SnapshotInfo).
	Spec      Shape        `json:"spec"`
	CreatedAt time.Time    `json:"created_at"`
	Capture   CaptureStats `json:"capture"`
	// SizeBytes is the disk space the snapshot holds on its own (blocks
	// not shared with its template through reflinks are not known to the
	// file system; this counts allocated blocks of its files).
	SizeBytes int64 `json:"size_bytes"`
	// Stored is where the snapshot is kept: StoredLocal (only on this
	// host's disk: the host has no object store), StoredUploading (on
	// this host's disk, being uploaded to the object store) or
	// StoredDurable (in the object store; the host's copy may be gone
	// and is fetched again on the next create from it).
	Stored string `json:"stored,omitempty"`
	// StoreError is why the last upload attempt failed ("" if it did
	// not); uploads are retried until they succeed.
	StoreError string `json:"store_error,omitempty"`
	// UploadedBytes is what this host's upload of the snapshot sent to
	// the object store (bytes of the chunks the store did not hold
	// already: not those its template shares with it); 0 until durable,
	// and for a snapshot this host fetched rather than took.
	UploadedBytes int64 `json:"uploaded_bytes,omitempty"`
	// FetchedBytes is what this host read from the object store to have
	// the snapshot (taken on another host): the chunks no local file (its
	// template) held; 0 for a snapshot this host took.
	FetchedBytes int64 `json:"fetched_bytes,omitempty"`
	// Transient marks a capture taken only to carry a sandbox to other
	// hosts (Transferer.SnapshotTransient): not sealed, removed by a
	// restart of any host that holds it, never a user's snapshot.
	Transient bool `json:"transient,omitempty"`
	// Lineage is the durable snapshot the captured sandbox's memory and
	// disk derive from (the one it, or the sandbox it was forked from,
	// was created from), "" for its template: a host that holds it can
	// be sent captures diffed against it.
	Lineage string `json:"lineage,omitempty"`
}

// The values of SnapshotInfo.Stored and Info.Stored.
const (
	StoredLocal     = "local"
	StoredUploading = "uploading"
	StoredDurable   = "durable"
)

// Resources are a host machine's CPUs and memory.
type Resources struct {
	VCPUs              int `json:"vcpus"`
	MemoryMiB          int `json:"memory_mib"`
	MemoryAvailableMiB int `json:"memory_available_mib"`
}

// LocalResources describes the machine this process runs on.
func LocalResources() Resources {
	total, avail := meminfo()
	return Resources{VCPUs: runtime.NumCPU(), MemoryMiB: total, MemoryAvailableMiB: avail}
}

// meminfo reads MemTotal and MemAvailable in MiB.
func meminfo() (total, avail int) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "MemTotal:":
			total = v >> 10
		case "MemAvailable:":
			avail = v >> 10
		}
	}
	return total, avail
}

// AnonResidentBytes is process pid's anonymous resident memory (0 if it
// is gone): /proc/PID/statm's resident pages less its shared (file and
// shmem) ones. For a VMM: its heap, translation cache and the guest pages
// it has written, not the memory image's pages it shares through the page
// cache. One small read.
func AnonResidentBytes(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return 0
	}
	resident, _ := strconv.ParseInt(f[1], 10, 64)
	shared, _ := strconv.ParseInt(f[2], 10, 64)
	return max(0, resident-shared) * int64(os.Getpagesize())
}
