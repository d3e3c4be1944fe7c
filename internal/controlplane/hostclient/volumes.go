package hostclient

import (
	"context"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
)

// A remote agent's volumes (hostwire/volumes.go).
var (
	_ host.Volumes      = (*Client)(nil)
	_ host.VolumeForker = (*Client)(nil)
)

func volumePath(id string, rest ...string) string {
	p := "/volumes/" + url.PathEscape(id)
	for _, r := range rest {
		p += r
	}
	return p
}

// volumeFiles is volume id's files API.
func (c *Client) volumeFiles(id string) files { return files{c: c, base: volumePath(id)} }

// CreateVolume makes the empty volume id of limitBytes on the host.
func (c *Client) CreateVolume(ctx context.Context, id string, limitBytes int64) (host.VolumeInfo, error) {
	var v host.VolumeInfo
	err := c.call(ctx, http.MethodPost, "/volumes", nil, hostwire.VolumeRequest{ID: id, LimitBytes: limitBytes}, &v)
	return v, err
}

// GetVolume describes volume id.
func (c *Client) GetVolume(ctx context.Context, id string) (host.VolumeInfo, error) {
	var v host.VolumeInfo
	err := c.call(ctx, http.MethodGet, volumePath(id), nil, nil, &v)
	return v, err
}

// ListVolumes describes the host's volumes.
func (c *Client) ListVolumes(ctx context.Context) ([]host.VolumeInfo, error) {
	var out struct {
		Volumes []host.VolumeInfo `json:"volumes"`
	}
	err := c.call(ctx, http.MethodGet, "/volumes", nil, nil, &out)
	return out.Volumes, err
}

// DeleteVolume deletes volume id (see host.Volumes for force).
func (c *Client) DeleteVolume(ctx context.Context, id string, force bool) error {
	return c.call(ctx, http.MethodDelete, volumePath(id), url.Values{"force": {strconv.FormatBool(force)}}, nil, nil)
}

// ResizeVolume grows volume id's limit.
func (c *Client) ResizeVolume(ctx context.Context, id string, limitBytes int64) (host.VolumeInfo, error) {
	var v host.VolumeInfo
	err := c.call(ctx, http.MethodPatch, volumePath(id), nil, hostwire.VolumeRequest{LimitBytes: limitBytes}, &v)
	return v, err
}

// BranchVolume clones src into the new volume dst.
func (c *Client) BranchVolume(ctx context.Context, src, dst string) (host.VolumeInfo, error) {
	var v host.VolumeInfo
	err := c.call(ctx, http.MethodPost, volumePath(src, "/branch"), nil, hostwire.BranchRequest{To: dst}, &v)
	return v, err
}

// PromoteVolume makes target's tree branch's and deletes branch.
func (c *Client) PromoteVolume(ctx context.Context, branch, target string) (host.VolumeInfo, error) {
	var v host.VolumeInfo
	err := c.call(ctx, http.MethodPost, volumePath(branch, "/promote"), nil, hostwire.PromoteRequest{Target: target}, &v)
	return v, err
}

// ListVolumeDir lists directory path of volume id.
func (c *Client) ListVolumeDir(ctx context.Context, id, path string) ([]guestproto.FileInfo, error) {
	return c.volumeFiles(id).ListDir(ctx, path)
}

// StatVolumeFile describes path of volume id.
func (c *Client) StatVolumeFile(ctx context.Context, id, path string) (guestproto.FileInfo, error) {
	return c.volumeFiles(id).Stat(ctx, path)
}

// ReadVolumeFile streams file path of volume id down. Close the reader
// (before EOF it aborts the transfer).
func (c *Client) ReadVolumeFile(ctx context.Context, id, path string) (io.ReadCloser, guestproto.FileInfo, error) {
	return c.volumeFiles(id).ReadFile(ctx, path)
}

// WriteVolumeFile streams r up into file path of volume id.
func (c *Client) WriteVolumeFile(ctx context.Context, id, path string, r io.Reader, mode fs.FileMode) (int64, error) {
	return c.volumeFiles(id).WriteFile(ctx, path, r, mode)
}

// MkdirVolume makes directory path (and its parents) of volume id.
func (c *Client) MkdirVolume(ctx context.Context, id, path string) error {
	return c.volumeFiles(id).Mkdir(ctx, path)
}

// RemoveVolumeFile removes path of volume id.
func (c *Client) RemoveVolumeFile(ctx context.Context, id, path string, recursive bool) error {
	return c.volumeFiles(id).Remove(ctx, path, recursive)
}

// ForkWithVolumes forks sandbox id into children that say what they
// mount. An agent without volumes answers errors.ErrUnsupported.
func (c *Client) ForkWithVolumes(ctx context.Context, id string, children []host.ForkSpec) (host.ForkResult, error) {
	var out hostwire.ForkReply
	if err := c.call(ctx, http.MethodPost, sandboxPath(id, "/fork-volumes"), nil, hostwire.ForkVolumesRequest{Children: hostwire.ForkSpecsOf(children)}, &out); err != nil {
		return host.ForkResult{}, err
	}
	return forkResult(out), nil
}
