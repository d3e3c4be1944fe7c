package pandastack

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/pandastack/pandastack/sdk/go/internal/wire"
)

// DefaultVolumeSizeMiB is the size a volume gets when CreateVolume is
// given 0.
const DefaultVolumeSizeMiB = 1024

// Volume is a persistent volume: a directory tree of its own, with a size
// limit, that sandboxes mount (CreateOptions.Volumes) and the API reads and
// writes (Client.VolumeFiles) whether or not a sandbox runs. See
// docs/volumes.md.
type Volume struct {
	ID   string `json:"id"`   // "vol_" and 16 lowercase letters and digits
	Name string `json:"name"` // unique among the key's volumes
	// SizeMiB is the limit: writes beyond it fail (ENOSPC in a sandbox,
	// ErrInsufficientStorage through the API).
	SizeMiB   int       `json:"size_mib"`
	UsedBytes int64     `json:"used_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// Parent is the name of the volume this one was branched from (a fork
	// with VolumeMode "branch"); "" if none.
	Parent string `json:"parent,omitempty"`
	// MountedBy are the ids of the sandboxes (not stopped) that mount it.
	MountedBy []string `json:"mounted_by"`
}

// VolumeMount is a volume a sandbox mounts: in CreateOptions.Volumes, and
// in SandboxInfo.Volumes.
type VolumeMount struct {
	Name     string `json:"name"` // the volume's name (or, on create, its id)
	Path     string `json:"path"` // absolute path in the sandbox
	ReadOnly bool   `json:"read_only,omitempty"`
}

// Volume modes of ForkOptions.VolumeMode.
const (
	// VolumeShare: the children mount the parent's volumes (the default).
	VolumeShare = "share"
	// VolumeBranch: each child mounts a copy of each of the parent's
	// volumes, a new volume named "<volume>-<child id>" whose Parent is the
	// original, cloned while the parent is stopped for the fork. It
	// outlives the child until deleted or promoted (PromoteVolume).
	VolumeBranch = "branch"
)

// CreateVolume creates the empty volume name of sizeMiB MiB (0:
// DefaultVolumeSizeMiB). A name is 1 to 63 of a-z, 0-9, '.', '_' and '-',
// starting with a letter or digit. Errors: ErrConflict (the key has a
// volume of that name), ErrQuotaExceeded (volume count or disk quota),
// ErrInvalid (a bad name or size).
func (c *Client) CreateVolume(ctx context.Context, name string, sizeMiB int) (Volume, error) {
	if sizeMiB < 0 {
		return Volume{}, newError(0, CodeInvalid, "volume size must be positive (MiB)")
	}
	var v Volume
	err := c.doJSON(ctx, http.MethodPost, path("volumes"), nil, wire.CreateVolumeJSONRequestBody{Name: name, SizeMib: optional(sizeMiB)}, &v)
	return v, err
}

// Volumes lists the key's volumes.
func (c *Client) Volumes(ctx context.Context) ([]Volume, error) {
	var out struct {
		Volumes []Volume `json:"volumes"`
	}
	if err := c.doJSON(ctx, http.MethodGet, path("volumes"), nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Volumes, nil
}

// GetVolume returns the volume name (a name or an id); ErrNotFound if the
// key has none such.
func (c *Client) GetVolume(ctx context.Context, name string) (Volume, error) {
	if err := checkID("volume", name); err != nil {
		return Volume{}, err
	}
	var v Volume
	err := c.doJSON(ctx, http.MethodGet, path("volumes", name), nil, nil, &v)
	return v, err
}

// ResizeVolume grows the volume's limit to sizeMiB; a smaller size is
// ErrInvalid (volumes only grow).
func (c *Client) ResizeVolume(ctx context.Context, name string, sizeMiB int) (Volume, error) {
	if err := checkID("volume", name); err != nil {
		return Volume{}, err
	}
	if sizeMiB < 1 {
		return Volume{}, newError(0, CodeInvalid, "volume size must be positive (MiB)")
	}
	var v Volume
	err := c.doJSON(ctx, http.MethodPatch, path("volumes", name), nil, wire.ResizeVolumeJSONRequestBody{SizeMib: sizeMiB}, &v)
	return v, err
}

// DeleteVolume deletes the volume and its files. While a sandbox that is
// not stopped mounts it, that is ErrConflict unless force (the sandboxes
// then see its files vanish).
func (c *Client) DeleteVolume(ctx context.Context, name string, force bool) error {
	if err := checkID("volume", name); err != nil {
		return err
	}
	var q url.Values
	if force {
		q = url.Values{"force": {"true"}}
	}
	return c.doJSON(ctx, http.MethodDelete, path("volumes", name), q, nil, nil)
}

// PromoteVolume makes the branch name's files its parent's: the parent
// volume (Volume.Parent) now holds the branch's tree and the branch is
// deleted. It returns the parent. A volume without a parent is ErrInvalid.
func (c *Client) PromoteVolume(ctx context.Context, name string) (Volume, error) {
	if err := checkID("volume", name); err != nil {
		return Volume{}, err
	}
	var v Volume
	err := c.doJSON(ctx, http.MethodPost, path("volumes", name, "promote"), nil, nil, &v)
	return v, err
}

// VolumeFiles are the files of one volume, through the API: the same calls
// as a Sandbox's files, served from the volume's own storage. Paths are
// relative to the volume's root ("/a/b" and "a/b" alike; "/" is the root);
// none leaves the volume. A write returns once the data is on the host's
// disk, so a sandbox that opens the file afterwards sees it; one that would
// take the volume over its limit fails (ErrInsufficientStorage) before
// anything is written.
type VolumeFiles struct {
	f fileAPI
}

// VolumeFiles returns the files of the volume name (a name or an id). It
// sends nothing: a missing volume is ErrNotFound from the first call.
func (c *Client) VolumeFiles(name string) *VolumeFiles {
	return &VolumeFiles{f: fileAPI{c: c, owner: "volume", route: "volumes", id: name}}
}

// WriteFile uploads r to p, creating parent directories; as
// Sandbox.WriteFile.
func (v *VolumeFiles) WriteFile(ctx context.Context, p string, r io.Reader, mode os.FileMode) (FileInfo, error) {
	return v.f.write(ctx, p, r, mode)
}

// ReadFile downloads the file at p; read the content and close it.
func (v *VolumeFiles) ReadFile(ctx context.Context, p string) (io.ReadCloser, error) {
	return v.f.read(ctx, p)
}

// ListFiles lists the directory p, sorted by name.
func (v *VolumeFiles) ListFiles(ctx context.Context, p string) ([]FileInfo, error) {
	return v.f.list(ctx, p)
}

// Stat describes the file at p, without following a final symlink.
func (v *VolumeFiles) Stat(ctx context.Context, p string) (FileInfo, error) {
	return v.f.stat(ctx, p)
}

// Mkdir creates the directory p and its parents (like mkdir -p).
func (v *VolumeFiles) Mkdir(ctx context.Context, p string) (FileInfo, error) {
	return v.f.mkdir(ctx, p)
}

// Remove removes the file or directory p; a non-empty directory needs
// recursive.
func (v *VolumeFiles) Remove(ctx context.Context, p string, recursive bool) error {
	return v.f.remove(ctx, p, recursive)
}
