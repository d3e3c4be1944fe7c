package hosttest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
)

// Methods of host.Volumes and host.VolumeForker a test can fail or hold
// (they name the volume id; ForkWithVolumes the parent's).
const (
	CreateVolume    Method = "CreateVolume"
	ResizeVolume    Method = "ResizeVolume"
	DeleteVolume    Method = "DeleteVolume"
	PromoteVolume   Method = "PromoteVolume"
	ForkWithVolumes Method = "ForkWithVolumes"
	WriteVolumeFile Method = "WriteVolumeFile"
)

// volume is a volume of the fake host: its limit and its files, by
// clean path ("/a/b"), with nil for a directory. Used bytes count each
// file's size and nothing for directories: a fake, not the real
// accounting.
type volume struct {
	info  host.VolumeInfo
	files map[string][]byte
}

// volumes is the fake host's volumes, made on first use.
type volumes struct {
	mu sync.Mutex
	m  map[string]*volume
}

var hostVolumes sync.Map // *Host -> *volumes

func (h *Host) vols() *volumes {
	v, _ := hostVolumes.LoadOrStore(h, &volumes{m: map[string]*volume{}})
	return v.(*volumes)
}

var (
	_ host.Volumes      = (*Host)(nil)
	_ host.VolumeForker = (*Host)(nil)
)

// HasVolume reports whether the host stores volume id.
func (h *Host) HasVolume(id string) bool {
	vs := h.vols()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	_, ok := vs.m[id]
	return ok
}

// VolumeFile returns the contents of file p of volume id (false: none).
func (h *Host) VolumeFile(id, p string) ([]byte, bool) {
	vs := h.vols()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	v, ok := vs.m[id]
	if !ok {
		return nil, false
	}
	b, ok := v.files[path.Clean("/"+p)]
	return b, ok && b != nil
}

// mounted reports whether a running or paused sandbox mounts volume id.
// h.mu is held.
func (h *Host) mounted(id string) bool {
	for _, sb := range h.sandboxes {
		if sb.info.State != lifecycle.Running && sb.info.State != lifecycle.Paused {
			continue
		}
		for _, m := range sb.info.Volumes {
			if m.Volume == id {
				return true
			}
		}
	}
	return false
}

func (v *volume) used() int64 {
	var n int64
	for _, b := range v.files {
		n += int64(len(b))
	}
	return n
}

func (v *volume) infoNow() host.VolumeInfo {
	i := v.info
	i.UsedBytes = v.used()
	return i
}

func (h *Host) CreateVolume(ctx context.Context, id string, limitBytes int64) (host.VolumeInfo, error) {
	if err := h.enter(ctx, CreateVolume, id); err != nil {
		return host.VolumeInfo{}, err
	}
	vs := h.vols()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if _, ok := vs.m[id]; ok {
		return host.VolumeInfo{}, fmt.Errorf("volume %s: %w", id, host.ErrConflict)
	}
	if limitBytes <= 0 {
		return host.VolumeInfo{}, fmt.Errorf("volume limit %d: %w", limitBytes, host.ErrInvalid)
	}
	v := &volume{info: host.VolumeInfo{ID: id, LimitBytes: limitBytes, CreatedAt: time.Now().UTC()}, files: map[string][]byte{"/": nil}}
	vs.m[id] = v
	return v.infoNow(), nil
}

// get returns volume id; vs.mu is held.
func (vs *volumes) get(id string) (*volume, error) {
	v, ok := vs.m[id]
	if !ok {
		return nil, fmt.Errorf("volume %s: %w", id, host.ErrNotFound)
	}
	return v, nil
}

func (h *Host) GetVolume(ctx context.Context, id string) (host.VolumeInfo, error) {
	vs := h.vols()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	v, err := vs.get(id)
	if err != nil {
		return host.VolumeInfo{}, err
	}
	return v.infoNow(), nil
}

func (h *Host) ListVolumes(ctx context.Context) ([]host.VolumeInfo, error) {
	vs := h.vols()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	var out []host.VolumeInfo
	for _, v := range vs.m {
		out = append(out, v.infoNow())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func (h *Host) DeleteVolume(ctx context.Context, id string, force bool) error {
	if err := h.enter(ctx, DeleteVolume, id); err != nil {
		return err
	}
	h.mu.Lock()
	mounted := h.mounted(id)
	h.mu.Unlock()
	vs := h.vols()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if _, err := vs.get(id); err != nil {
		return err
	}
	if mounted && !force {
		return fmt.Errorf("volume %s is mounted: %w", id, host.ErrConflict)
	}
	delete(vs.m, id)
	return nil
}

func (h *Host) ResizeVolume(ctx context.Context, id string, limitBytes int64) (host.VolumeInfo, error) {
	if err := h.enter(ctx, ResizeVolume, id); err != nil {
		return host.VolumeInfo{}, err
	}
	vs := h.vols()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	v, err := vs.get(id)
	if err != nil {
		return host.VolumeInfo{}, err
	}
	if limitBytes < v.info.LimitBytes {
		return host.VolumeInfo{}, fmt.Errorf("shrink volume %s: %w", id, host.ErrInvalid)
	}
	v.info.LimitBytes = limitBytes
	return v.infoNow(), nil
}

func (h *Host) BranchVolume(ctx context.Context, src, dst string) (host.VolumeInfo, error) {
	vs := h.vols()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	return vs.branch(src, dst)
}

// branch copies volume src into the new volume dst; vs.mu is held.
func (vs *volumes) branch(src, dst string) (host.VolumeInfo, error) {
	s, err := vs.get(src)
	if err != nil {
		return host.VolumeInfo{}, err
	}
	if _, ok := vs.m[dst]; ok {
		return host.VolumeInfo{}, fmt.Errorf("volume %s: %w", dst, host.ErrConflict)
	}
	d := &volume{info: host.VolumeInfo{ID: dst, LimitBytes: s.info.LimitBytes, CreatedAt: time.Now().UTC()}, files: map[string][]byte{}}
	for p, b := range s.files {
		d.files[p] = bytes.Clone(b)
	}
	vs.m[dst] = d
	return d.infoNow(), nil
}

func (h *Host) PromoteVolume(ctx context.Context, branch, target string) (host.VolumeInfo, error) {
	if err := h.enter(ctx, PromoteVolume, branch); err != nil {
		return host.VolumeInfo{}, err
	}
	vs := h.vols()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	b, err := vs.get(branch)
	if err != nil {
		return host.VolumeInfo{}, err
	}
	t, err := vs.get(target)
	if err != nil {
		return host.VolumeInfo{}, err
	}
	t.files = b.files
	t.info.LimitBytes = max(t.info.LimitBytes, b.info.LimitBytes)
	delete(vs.m, branch)
	return t.infoNow(), nil
}

// file returns volume id and the clean path p; vs.mu is held.
func (vs *volumes) file(id, p string) (*volume, string, error) {
	v, err := vs.get(id)
	if err != nil {
		return nil, "", err
	}
	if strings.Contains(p, "\x00") || strings.Contains("/"+p+"/", "/../") {
		return nil, "", fmt.Errorf("path %q: %w", p, host.ErrInvalid)
	}
	return v, path.Clean("/" + p), nil
}

func fileInfo(p string, b []byte) guestproto.FileInfo {
	fi := guestproto.FileInfo{Name: path.Base(p), Path: p, Size: int64(len(b)), Mode: 0o644}
	if b == nil {
		fi.IsDir, fi.Mode, fi.Size = true, 0o755, 0
	}
	return fi
}

func (h *Host) ListVolumeDir(ctx context.Context, id, p string) ([]guestproto.FileInfo, error) {
	vs := h.vols()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	v, p, err := vs.file(id, p)
	if err != nil {
		return nil, err
	}
	if b, ok := v.files[p]; !ok || b != nil {
		return nil, fmt.Errorf("directory %s: %w", p, host.ErrNotFound)
	}
	out := []guestproto.FileInfo{}
	for q, b := range v.files {
		if q != "/" && path.Dir(q) == p {
			out = append(out, fileInfo(q, b))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (h *Host) StatVolumeFile(ctx context.Context, id, p string) (guestproto.FileInfo, error) {
	vs := h.vols()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	v, p, err := vs.file(id, p)
	if err != nil {
		return guestproto.FileInfo{}, err
	}
	b, ok := v.files[p]
	if !ok {
		return guestproto.FileInfo{}, fmt.Errorf("file %s: %w", p, host.ErrNotFound)
	}
	return fileInfo(p, b), nil
}

func (h *Host) ReadVolumeFile(ctx context.Context, id, p string) (io.ReadCloser, guestproto.FileInfo, error) {
	vs := h.vols()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	v, p, err := vs.file(id, p)
	if err != nil {
		return nil, guestproto.FileInfo{}, err
	}
	b, ok := v.files[p]
	if !ok || b == nil {
		return nil, guestproto.FileInfo{}, fmt.Errorf("file %s: %w", p, host.ErrNotFound)
	}
	return io.NopCloser(bytes.NewReader(bytes.Clone(b))), fileInfo(p, b), nil
}

func (h *Host) WriteVolumeFile(ctx context.Context, id, p string, r io.Reader, mode fs.FileMode) (int64, error) {
	if err := h.enter(ctx, WriteVolumeFile, id); err != nil {
		return 0, err
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return 0, err
	}
	if data == nil {
		data = []byte{}
	}
	vs := h.vols()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	v, p, err := vs.file(id, p)
	if err != nil {
		return 0, err
	}
	if v.used()-int64(len(v.files[p]))+int64(len(data)) > v.info.LimitBytes {
		return 0, fmt.Errorf("write %s: %w", p, host.ErrNoSpace)
	}
	for d := path.Dir(p); d != "/"; d = path.Dir(d) {
		v.files[d] = nil
	}
	v.files[p] = data
	return int64(len(data)), nil
}

func (h *Host) MkdirVolume(ctx context.Context, id, p string) error {
	vs := h.vols()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	v, p, err := vs.file(id, p)
	if err != nil {
		return err
	}
	for d := p; d != "/"; d = path.Dir(d) {
		if b, ok := v.files[d]; ok && b != nil {
			return fmt.Errorf("mkdir %s: a file: %w", d, host.ErrConflict)
		}
		v.files[d] = nil
	}
	return nil
}

func (h *Host) RemoveVolumeFile(ctx context.Context, id, p string, recursive bool) error {
	vs := h.vols()
	vs.mu.Lock()
	defer vs.mu.Unlock()
	v, p, err := vs.file(id, p)
	if err != nil {
		return err
	}
	if _, ok := v.files[p]; !ok {
		return fmt.Errorf("remove %s: %w", p, host.ErrNotFound)
	}
	for q := range v.files {
		if strings.HasPrefix(q, p+"/") {
			if !recursive {
				return fmt.Errorf("remove %s: not empty: %w", p, host.ErrConflict)
			}
			delete(v.files, q)
		}
	}
	delete(v.files, p)
	return nil
}

// ForkWithVolumes is Fork whose children mount the volumes their spec
// says, their branches cloned first.
func (h *Host) ForkWithVolumes(ctx context.Context, id string, children []host.ForkSpec) (host.ForkResult, error) {
	if err := h.enter(ctx, ForkWithVolumes, id); err != nil {
		return host.ForkResult{}, err
	}
	vs := h.vols()
	vs.mu.Lock()
	for _, c := range children {
		for _, br := range c.Branches {
			if _, err := vs.branch(br.From, br.To); err != nil {
				vs.mu.Unlock()
				return host.ForkResult{}, err
			}
		}
	}
	vs.mu.Unlock()
	ids := make([]string, len(children))
	for i, c := range children {
		ids[i] = c.ID
	}
	res, err := h.Fork(ctx, id, ids)
	if err != nil {
		return res, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, c := range children {
		if sb, ok := h.sandboxes[c.ID]; ok && c.Volumes != nil && res.Children[i].Err == nil {
			sb.info.Volumes = c.Volumes
			res.Children[i].Info.Volumes = c.Volumes
		}
	}
	return res, nil
}
