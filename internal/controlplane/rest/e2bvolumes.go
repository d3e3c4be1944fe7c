package rest

import (
	"context"
	"io"
	"io/fs"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/e2b"
)

// E2B's volumes over the Plane's, as the REST API serves them.

var _ e2b.Volumes = e2bBackend{}

// volume is key keyID's volume id (or name).
func (b e2bBackend) volume(ctx context.Context, keyID, id string) (catalog.Volume, error) {
	return b.s.cp.Volume(ctx, keyID, id)
}

func (b e2bBackend) CreateVolume(ctx context.Context, keyID, name string) (e2b.Volume, error) {
	key, err := b.key(ctx, keyID)
	if err != nil {
		return e2b.Volume{}, err
	}
	v, err := b.s.cp.CreateVolume(ctx, key, name, controlplane.DefaultVolumeSizeMiB)
	if err != nil {
		return e2b.Volume{}, err
	}
	return e2b.Volume{ID: v.ID, Name: v.Name}, nil
}

func (b e2bBackend) Volume(ctx context.Context, keyID, id string) (e2b.Volume, error) {
	v, err := b.volume(ctx, keyID, id)
	if err != nil {
		return e2b.Volume{}, err
	}
	return e2b.Volume{ID: v.ID, Name: v.Name}, nil
}

func (b e2bBackend) ListVolumes(ctx context.Context, keyID string) ([]e2b.Volume, error) {
	vs, err := b.s.cat.ListVolumes(ctx, keyID)
	if err != nil {
		return nil, err
	}
	out := make([]e2b.Volume, len(vs))
	for i, v := range vs {
		out[i] = e2b.Volume{ID: v.ID, Name: v.Name}
	}
	return out, nil
}

func (b e2bBackend) DeleteVolume(ctx context.Context, keyID, id string) error {
	v, err := b.volume(ctx, keyID, id)
	if err != nil {
		return err
	}
	return b.s.cp.DeleteVolume(ctx, v, false)
}

func (b e2bBackend) ListVolumeDir(ctx context.Context, keyID, id, p string) ([]guestproto.FileInfo, error) {
	v, err := b.volume(ctx, keyID, id)
	if err != nil {
		return nil, err
	}
	return b.s.cp.ListVolumeDir(ctx, v, p)
}

func (b e2bBackend) StatVolumeFile(ctx context.Context, keyID, id, p string) (guestproto.FileInfo, error) {
	v, err := b.volume(ctx, keyID, id)
	if err != nil {
		return guestproto.FileInfo{}, err
	}
	return b.s.cp.StatVolumeFile(ctx, v, p)
}

func (b e2bBackend) ReadVolumeFile(ctx context.Context, keyID, id, p string) (io.ReadCloser, guestproto.FileInfo, error) {
	v, err := b.volume(ctx, keyID, id)
	if err != nil {
		return nil, guestproto.FileInfo{}, err
	}
	return b.s.cp.ReadVolumeFile(ctx, v, p)
}

func (b e2bBackend) WriteVolumeFile(ctx context.Context, keyID, id, p string, r io.Reader, mode uint32) error {
	v, err := b.volume(ctx, keyID, id)
	if err != nil {
		return err
	}
	_, err = b.s.cp.WriteVolumeFile(ctx, v, p, r, fs.FileMode(mode))
	return err
}

func (b e2bBackend) MkdirVolume(ctx context.Context, keyID, id, p string) error {
	v, err := b.volume(ctx, keyID, id)
	if err != nil {
		return err
	}
	return b.s.cp.MkdirVolume(ctx, v, p)
}

func (b e2bBackend) RemoveVolumeFile(ctx context.Context, keyID, id, p string) error {
	v, err := b.volume(ctx, keyID, id)
	if err != nil {
		return err
	}
	return b.s.cp.RemoveVolumeFile(ctx, v, p, true)
}
