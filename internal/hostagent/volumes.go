package hostagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"strconv"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/volumes"
)

// Volumes (docs/volumes.md): the agent keeps them in a.vols (package
// volumes, under the store's volumes/ directory), records each sandbox's
// mounts in its sandbox.json (record.Volumes), and on every guest session
// of a sandbox that mounts any (restore: create, fork child, resume;
// greet: adoption, a reconnect) opens the session's volume stream and
// serves it (volumes.Serve) until the session ends.

// volumesDir, in the store, holds the volumes.
const volumesDir = "volumes"

// guestMounts is what the guest is asked to mount for mounts: each
// tagged by its place in the list, so that the tags of a sandbox's mounts
// stay the same across its sessions (a fork child's or a restored
// guest's daemon keeps the mounts it was captured with; a branch keeps
// its parent volume's tag).
func guestMounts(mounts []host.VolumeMount) []guestproto.VolumeMount {
	out := make([]guestproto.VolumeMount, len(mounts))
	for i, m := range mounts {
		out[i] = guestproto.VolumeMount{Tag: "vol" + strconv.Itoa(i), Path: m.Path, ReadOnly: m.ReadOnly}
	}
	return out
}

// checkMounts checks a sandbox's mounts: well formed, and each volume on
// this host (but those named in pending, about to be made).
func (a *Agent) checkMounts(mounts []host.VolumeMount, pending map[string]bool) error {
	if err := guestproto.ValidateVolumeMounts(guestMounts(mounts)); err != nil {
		var ge *guestproto.Error
		if errors.As(err, &ge) {
			err = errors.New(ge.Message)
		}
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	for _, m := range mounts {
		if !volumes.ValidID(m.Volume) {
			return fmt.Errorf("%w: volume id %q is not vol_ and 16 lowercase letters or digits", ErrInvalid, m.Volume)
		}
		if pending[m.Volume] {
			continue
		}
		if _, err := a.vols.Get(m.Volume); err != nil {
			return err
		}
	}
	return nil
}

// openVolumes makes s's guest (on client, a session that has said HELLO)
// mount s's volumes, and serves them on the stream until the session
// ends. A sandbox without volumes needs nothing. Errors: the volume is
// gone (ErrNotFound), the guest agent cannot mount volumes (ErrInvalid,
// and errors.ErrUnsupported for one too old), or could not mount
// (ErrInvalid: a bad path; or the guest's error).
func (a *Agent) openVolumes(ctx context.Context, s *sandbox, client *guestproto.Client) error {
	s.mu.Lock()
	mounts, drop := s.rec.Volumes, s.dropMounts
	s.mu.Unlock()
	if len(mounts) == 0 {
		if !drop {
			return nil
		}
		// The captured guest may have volumes mounted: have it unmount
		// them, or what touches them would wait forever.
		// Best effort: an agent without volumes mounted none, and a
		// sandbox that mounts nothing must not fail for them.
		conn, err := client.OpenVolumes(ctx, []guestproto.VolumeMount{})
		if err != nil {
			if !errors.Is(err, errors.ErrUnsupported) {
				a.log.Warn("unmount the captured sandbox's volumes", "sandbox_id", s.id(), "err", err)
			}
			return nil
		}
		conn.Close()
		return nil
	}
	served := make([]volumes.Mount, len(mounts))
	gm := guestMounts(mounts)
	for i, m := range mounts {
		root, sp, err := a.vols.Open(m.Volume)
		if err != nil {
			return fmt.Errorf("mount volume %s: %w", m.Volume, err)
		}
		served[i] = volumes.Mount{Tag: gm[i].Tag, Root: root, ReadOnly: m.ReadOnly, Space: sp}
	}
	conn, err := client.OpenVolumes(ctx, gm)
	if err != nil {
		if errors.Is(err, errors.ErrUnsupported) {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		var ge *guestproto.Error
		if errors.As(err, &ge) && ge.Code == guestproto.CodeInvalid {
			return fmt.Errorf("%w: the guest cannot mount its volumes: %v", ErrInvalid, ge.Message)
		}
		return fmt.Errorf("mount volumes in the guest: %w", err)
	}
	go a.serveVolumes(s, client, conn, served)
	return nil
}

// serveVolumes serves s's volume stream conn until it ends: the session
// (client) ends or is replaced, or s stops.
func (a *Agent) serveVolumes(s *sandbox, client *guestproto.Client, conn net.Conn, mounts []volumes.Mount) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.gone:
		case <-client.Done():
		case <-ctx.Done():
		}
		cancel()
		conn.Close()
	}()
	if err := volumes.Serve(ctx, conn, mounts); err != nil && ctx.Err() == nil {
		a.log.Warn("volume stream ended", "sandbox_id", s.id(), "err", err)
	}
}

// mountedBy lists the sandboxes of this host not stopped (nor stopping)
// that mount volume id.
func (a *Agent) mountedBy(id string) []*sandbox {
	a.mu.Lock()
	all := make([]*sandbox, 0, len(a.sandboxes))
	for _, s := range a.sandboxes {
		all = append(all, s)
	}
	a.mu.Unlock()
	var out []*sandbox
	for _, s := range all {
		s.mu.Lock()
		live := s.state != StateStopping && s.state != StateStopped
		mounts := s.rec.Volumes
		s.mu.Unlock()
		for _, m := range mounts {
			if live && m.Volume == id {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// CreateVolume makes the empty volume id of limitBytes.
func (a *Agent) CreateVolume(id string, limitBytes int64) (host.VolumeInfo, error) {
	if err := a.checkSpace(); err != nil {
		return host.VolumeInfo{}, fmt.Errorf("create volume: %w", err)
	}
	return a.vols.Create(id, limitBytes)
}

// GetVolume describes volume id.
func (a *Agent) GetVolume(id string) (host.VolumeInfo, error) { return a.vols.Get(id) }

// ListVolumes describes the host's volumes.
func (a *Agent) ListVolumes() ([]host.VolumeInfo, error) { return a.vols.List() }

// DeleteVolume deletes volume id: ErrConflict while a sandbox of this host
// that is not stopped mounts it, unless force (its guests then see every
// operation on the volume fail).
func (a *Agent) DeleteVolume(id string, force bool) error {
	a.mountMu.Lock()
	defer a.mountMu.Unlock()
	if !force {
		if by := a.mountedBy(id); len(by) > 0 {
			return fmt.Errorf("delete volume %s: %w: sandbox %s mounts it", id, ErrConflict, by[0].id())
		}
	}
	return a.vols.Delete(id)
}

// ResizeVolume grows volume id's limit to limitBytes.
func (a *Agent) ResizeVolume(id string, limitBytes int64) (host.VolumeInfo, error) {
	return a.vols.Resize(id, limitBytes)
}

// BranchVolume clones volume src into the new volume dst.
func (a *Agent) BranchVolume(src, dst string) (host.VolumeInfo, error) {
	if err := a.checkSpace(); err != nil {
		return host.VolumeInfo{}, fmt.Errorf("branch volume: %w", err)
	}
	return a.vols.Branch(src, dst)
}

// PromoteVolume makes target's tree branch's and deletes branch:
// ErrConflict while a sandbox that is not stopped mounts branch. The
// running sandboxes that mount target get a new volume session, on its
// new tree (a paused one gets it when resumed).
func (a *Agent) PromoteVolume(branch, target string) (host.VolumeInfo, error) {
	a.mountMu.Lock()
	if by := a.mountedBy(branch); len(by) > 0 {
		a.mountMu.Unlock()
		return host.VolumeInfo{}, fmt.Errorf("promote volume %s: %w: sandbox %s mounts it", branch, ErrConflict, by[0].id())
	}
	v, err := a.vols.Promote(branch, target)
	a.mountMu.Unlock()
	if err != nil {
		return v, err
	}
	for _, s := range a.mountedBy(target) {
		s.mu.Lock()
		client, ready, running := s.client, s.ready, s.state == StateRunning
		s.mu.Unlock()
		if !running || client == nil {
			continue
		}
		select {
		case <-ready:
		default:
			continue // greet opens the volumes once the guest answers
		}
		ctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
		if err := a.openVolumes(ctx, s, client); err != nil {
			a.log.Warn("remount promoted volume", "sandbox_id", s.id(), "volume_id", target, "err", err)
		}
		cancel()
	}
	return v, nil
}

// The agent's volumes as the host contract's abilities.
var (
	_ host.Volumes      = local{}
	_ host.VolumeForker = local{}
)

func (h local) CreateVolume(_ context.Context, id string, limitBytes int64) (host.VolumeInfo, error) {
	return h.a.CreateVolume(id, limitBytes)
}

func (h local) GetVolume(_ context.Context, id string) (host.VolumeInfo, error) {
	return h.a.GetVolume(id)
}

func (h local) ListVolumes(context.Context) ([]host.VolumeInfo, error) { return h.a.ListVolumes() }

func (h local) DeleteVolume(_ context.Context, id string, force bool) error {
	return h.a.DeleteVolume(id, force)
}

func (h local) ResizeVolume(_ context.Context, id string, limitBytes int64) (host.VolumeInfo, error) {
	return h.a.ResizeVolume(id, limitBytes)
}

func (h local) BranchVolume(_ context.Context, src, dst string) (host.VolumeInfo, error) {
	return h.a.BranchVolume(src, dst)
}

func (h local) PromoteVolume(_ context.Context, branch, target string) (host.VolumeInfo, error) {
	return h.a.PromoteVolume(branch, target)
}

func (h local) ListVolumeDir(_ context.Context, id, path string) ([]guestproto.FileInfo, error) {
	return h.a.vols.ListDir(id, path)
}

func (h local) StatVolumeFile(_ context.Context, id, path string) (guestproto.FileInfo, error) {
	return h.a.vols.Stat(id, path)
}

func (h local) ReadVolumeFile(_ context.Context, id, path string) (io.ReadCloser, guestproto.FileInfo, error) {
	return h.a.vols.ReadFile(id, path)
}

func (h local) WriteVolumeFile(_ context.Context, id, path string, r io.Reader, mode fs.FileMode) (int64, error) {
	return h.a.vols.WriteFile(id, path, r, mode)
}

func (h local) MkdirVolume(_ context.Context, id, path string) error {
	return h.a.vols.Mkdir(id, path)
}

func (h local) RemoveVolumeFile(_ context.Context, id, path string, recursive bool) error {
	return h.a.vols.Remove(id, path, recursive)
}

func (h local) ForkWithVolumes(ctx context.Context, id string, children []host.ForkSpec) (host.ForkResult, error) {
	return h.a.ForkWithVolumes(ctx, id, children)
}

// Volumes is the agent's volume store (the files API of the host RPC).
func (a *Agent) Volumes() *volumes.Store { return a.vols }
