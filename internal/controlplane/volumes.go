package controlplane

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
)

// Volumes: a key's persistent directory trees. Each lives on one host,
// its home (catalog.Volume.HostID), which stores its files and serves
// them to the sandboxes that mount it, all of which run there (placement
// below), and to the files API. Its size counts in its key's disk quota;
// the number of a key's volumes is bounded too (Config.MaxVolumesPerKey).

const (
	// DefaultVolumeSizeMiB is a new volume's size when none is asked.
	DefaultVolumeSizeMiB = 1024
	// MaxVolumeSizeMiB bounds one volume's size (16 TiB).
	MaxVolumeSizeMiB = 16 << 20
	// MaxVolumeMounts bounds the volumes one sandbox mounts.
	MaxVolumeMounts = 8
	// DefaultMaxVolumesPerKey is Config.MaxVolumesPerKey's default.
	DefaultMaxVolumesPerKey = 50
	// maxVolumeName is the longest volume name.
	maxVolumeName = 63
)

// Volume modes of a fork: children mount their parent's volumes, or
// each its own branch of them.
const (
	VolumeShare  = "share"
	VolumeBranch = "branch"
)

// ValidVolumeName reports whether name is a volume name: 1 to 63 of
// lowercase letters, digits, '.', '_' and '-', starting with a letter or
// a digit. A volume id ("vol_...") is never one, so a route may take
// either.
func ValidVolumeName(name string) bool {
	if len(name) < 1 || len(name) > maxVolumeName {
		return false
	}
	for i, c := range []byte(name) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			return false
		}
	}
	return !isVolumeID(name)
}

// isVolumeID reports whether s has the form of a volume id: "vol_" and
// 16 lowercase letters and digits.
func isVolumeID(s string) bool {
	rest, ok := strings.CutPrefix(s, "vol_")
	return ok && len(rest) == 16 && host.ValidID(rest)
}

// newVolumeID returns a new volume id.
func newVolumeID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 16)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return "vol_" + string(b)
}

// branchName is the name of the branch of volume name for fork child
// childID: "<name>-<childID>", name shortened so that it stays a name.
func branchName(name, childID string) string {
	if n := maxVolumeName - len(childID) - 1; len(name) > n {
		name = strings.TrimRight(name[:n], "._-")
	}
	return name + "-" + childID
}

// CheckVolumeFilePath checks a path in a volume from a request: slash
// separated, relative to the volume's root ("/a/b" and "a/b" alike; ""
// or "/" is the root), no NUL, no "..", at most 4096 bytes. It returns
// the path cleaned, with a leading slash.
func CheckVolumeFilePath(p string) (string, error) {
	switch {
	case !utf8.ValidString(p):
		return "", Errorf(Invalid, "path is not valid UTF-8")
	case strings.ContainsRune(p, 0):
		return "", Errorf(Invalid, "path contains a NUL byte")
	case len(p) > 4096:
		return "", Errorf(Invalid, "path is longer than 4096 bytes")
	case slices.Contains(strings.Split(p, "/"), ".."):
		return "", Errorf(Invalid, "path %q must not contain \"..\"", p)
	}
	return path.Clean("/" + p), nil
}

// VolumeMountRequest is one volume a create asks to mount: by name (or
// id), at an absolute guest path.
type VolumeMountRequest struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only"`
}

// checkMountPaths checks the guest paths of a create's mounts: absolute,
// clean, not "/", not under /proc, /sys or /dev, no two the same or one
// under another; at most MaxVolumeMounts.
func checkMountPaths(ms []VolumeMountRequest) error {
	if len(ms) > MaxVolumeMounts {
		return Errorf(Invalid, "a sandbox mounts at most %d volumes, %d asked", MaxVolumeMounts, len(ms))
	}
	under := func(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") || dir == "/" }
	for i, m := range ms {
		p := m.Path
		switch {
		case p == "" || !utf8.ValidString(p) || strings.ContainsRune(p, 0) || len(p) > 1024:
			return Errorf(Invalid, "volume mount path %q is not a valid path", p)
		case !path.IsAbs(p) || path.Clean(p) != p:
			return Errorf(Invalid, "volume mount path %q must be absolute and clean (like /mnt/data)", p)
		case p == "/":
			return Errorf(Invalid, "a volume cannot be mounted at /")
		}
		for _, sys := range []string{"/proc", "/sys", "/dev"} {
			if under(p, sys) {
				return Errorf(Invalid, "a volume cannot be mounted under %s (%s)", sys, p)
			}
		}
		for _, o := range ms[:i] {
			if under(p, o.Path) || under(o.Path, p) {
				return Errorf(Invalid, "volume mount paths %s and %s overlap", o.Path, p)
			}
		}
	}
	return nil
}

// volumeHomes checks that the volumes vs (one per mount) can be mounted
// by one sandbox: all on one host (returned), and placement pl, if it
// names a host, names that one.
func volumeHomes(vs []catalog.Volume, pl scheduler.Placement) (string, error) {
	home := ""
	for i, v := range vs {
		if i == 0 {
			home = v.HostID
			continue
		}
		if v.HostID != home {
			return "", Errorf(Conflict, "volumes %s and %s live on different hosts (%s, %s): a sandbox mounts volumes of one host only",
				vs[0].Name, v.Name, home, v.HostID)
		}
	}
	if home != "" && pl.Host != "" && pl.Host != home {
		return "", Errorf(Conflict, "volume %s lives on host %s: a sandbox that mounts it runs there, not on %s", vs[0].Name, home, pl.Host)
	}
	if home != "" && pl.Spread {
		return "", Errorf(Invalid, "a sandbox that mounts volumes runs on their host: placement spread does not apply")
	}
	return home, nil
}

// resolveMounts resolves a create's mounts to key's volumes: the
// catalog's and the host's mounts, and the volumes' home ("" if none).
func (p *Plane) resolveMounts(ctx context.Context, keyID string, ms []VolumeMountRequest, pl scheduler.Placement) ([]catalog.VolumeMount, []host.VolumeMount, string, error) {
	if len(ms) == 0 {
		return nil, nil, "", nil
	}
	if err := checkMountPaths(ms); err != nil {
		return nil, nil, "", err
	}
	var vs []catalog.Volume
	var cms []catalog.VolumeMount
	var hms []host.VolumeMount
	for _, m := range ms {
		v, err := p.Volume(ctx, keyID, m.Name)
		if err != nil {
			return nil, nil, "", err
		}
		for _, o := range vs {
			if o.ID == v.ID {
				return nil, nil, "", Errorf(Invalid, "volume %s is mounted twice", v.Name)
			}
		}
		vs = append(vs, v)
		cms = append(cms, catalog.VolumeMount{VolumeID: v.ID, Path: m.Path, ReadOnly: m.ReadOnly})
		hms = append(hms, host.VolumeMount{Volume: v.ID, Path: m.Path, ReadOnly: m.ReadOnly})
	}
	home, err := volumeHomes(vs, pl)
	if err != nil {
		return nil, nil, "", err
	}
	return cms, hms, home, nil
}

// placeOnHome places a sandbox that mounts volumes on their home host,
// as user-facing errors that say why it cannot run there.
func (p *Plane) placeOnHome(ctx context.Context, req scheduler.Request, home string) (host.Host, string, error) {
	req.Placement = scheduler.Placement{Host: home}
	h, id, err := p.placeOne(ctx, req)
	if err == nil {
		return h, id, nil
	}
	var e *Error
	if errors.As(err, &e) {
		switch {
		case e.Kind == NotFound:
			return nil, "", &Error{Kind: Unavailable, Err: err,
				Msg: fmt.Sprintf("the host of the volumes (%s) is no longer in the fleet", home)}
		case e.Kind == Conflict || e.Kind == Unavailable:
			return nil, "", &Error{Kind: Unavailable, Err: err,
				Msg: fmt.Sprintf("the host of the volumes (%s) cannot take this sandbox now: %s", home, e.Msg)}
		}
	}
	return nil, "", err
}

// volumesOf returns host id's Volumes ability.
func (p *Plane) volumesOf(hostID string) (host.Volumes, error) {
	h, err := p.on(hostID)
	if errors.Is(err, ErrUnknownHost) {
		return nil, &Error{Kind: Unavailable, Err: err, Msg: fmt.Sprintf("the volume's host %s is no longer in the fleet", hostID)}
	}
	if err != nil {
		return nil, err
	}
	hv, ok := h.(host.Volumes)
	if !ok {
		return nil, Errorf(NotImplemented, "host %s does not store volumes (its agent is older than this server)", hostID)
	}
	return hv, nil
}

// Volume is key keyID's volume by name or id: a NotFound error, the same
// whether it does not exist or is another key's.
func (p *Plane) Volume(ctx context.Context, keyID, nameOrID string) (catalog.Volume, error) {
	var v catalog.Volume
	var err error
	switch {
	case isVolumeID(nameOrID):
		v, err = p.cat.GetVolume(ctx, nameOrID)
		if err == nil && v.KeyID != keyID {
			err = catalog.ErrNotFound
		}
	case ValidVolumeName(nameOrID):
		v, err = p.cat.VolumeByName(ctx, keyID, nameOrID)
	default:
		err = catalog.ErrNotFound
	}
	if errors.Is(err, catalog.ErrNotFound) {
		return catalog.Volume{}, Errorf(NotFound, "volume %q not found", nameOrID)
	}
	if err != nil {
		return catalog.Volume{}, fmt.Errorf("get volume: %w", err)
	}
	return v, nil
}

// CreateVolume makes key's new volume name of sizeMiB (0: the default)
// on a host the scheduler chooses: reserved in the catalog against the
// key's quota, then made on the host (the record goes if that fails).
func (p *Plane) CreateVolume(ctx context.Context, key catalog.Key, name string, sizeMiB int) (catalog.Volume, error) {
	if !ValidVolumeName(name) {
		return catalog.Volume{}, Errorf(Invalid, "volume name %q is invalid: 1 to 63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit (not vol_ and 16 characters: the form of an id)", name)
	}
	if sizeMiB == 0 {
		sizeMiB = DefaultVolumeSizeMiB
	}
	if sizeMiB < 1 || sizeMiB > MaxVolumeSizeMiB {
		return catalog.Volume{}, Errorf(Invalid, "size_mib must be between 1 and %d", MaxVolumeSizeMiB)
	}
	cs, err := p.place(ctx, scheduler.Request{})
	if err != nil {
		return catalog.Volume{}, err
	}
	v := catalog.Volume{ID: newVolumeID(), KeyID: key.ID, Name: name, HostID: cs[0].Host, SizeMiB: sizeMiB, CreatedAt: p.now()}
	hv, err := p.volumesOf(v.HostID)
	if err != nil {
		return catalog.Volume{}, err
	}
	if err := p.reserveVolumes(ctx, key, []catalog.Volume{v}); err != nil {
		return catalog.Volume{}, err
	}
	info, err := hv.CreateVolume(ctx, v.ID, int64(sizeMiB)<<20)
	if err != nil {
		p.dropVolumeRecord(ctx, v.ID)
		return catalog.Volume{}, fmt.Errorf("create volume %s: %w", name, err)
	}
	v.UsedBytes = info.UsedBytes
	p.log.Info("volume created", "volume_id", v.ID, "name", name, "key_id", key.ID, "host_id", v.HostID, "size_mib", sizeMiB)
	return v, nil
}

// reserveVolumes records new volumes against key's quota, their host
// claimed meanwhile (it cannot be forgotten while they are recorded).
func (p *Plane) reserveVolumes(ctx context.Context, key catalog.Key, vs []catalog.Volume) error {
	release, err := p.claimHost(vs[0].HostID)
	if err != nil {
		return err
	}
	defer release()
	err = p.cat.CreateVolumes(ctx, vs, p.Limits(key))
	if errors.Is(err, catalog.ErrConflict) {
		return Errorf(Conflict, "a volume named %s already exists", vs[0].Name)
	}
	if err != nil {
		return fmt.Errorf("reserve volume: %w", err)
	}
	return nil
}

// dropVolumeRecord removes the record of a volume its host did not make.
func (p *Plane) dropVolumeRecord(ctx context.Context, id string) {
	if err := p.cat.DeleteVolume(context.WithoutCancel(ctx), id); err != nil && !errors.Is(err, catalog.ErrNotFound) {
		p.log.Error("remove record of failed volume", "volume_id", id, "err", err)
	}
}

// ListVolumes returns key keyID's volumes, oldest first, their used bytes
// as their hosts report them (as last recorded where a host cannot say).
func (p *Plane) ListVolumes(ctx context.Context, keyID string) ([]catalog.Volume, error) {
	vs, err := p.cat.ListVolumes(ctx, keyID)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	used := map[string]int64{}
	asked := map[string]bool{}
	for _, v := range vs {
		if asked[v.HostID] {
			continue
		}
		asked[v.HostID] = true
		hv, err := p.volumesOf(v.HostID)
		if err != nil {
			continue
		}
		infos, err := hv.ListVolumes(ctx)
		if err != nil {
			p.log.Warn("list volumes of host", "host_id", v.HostID, "err", err)
			continue
		}
		for _, in := range infos {
			used[in.ID] = in.UsedBytes
		}
	}
	for i := range vs {
		if n, ok := used[vs[i].ID]; ok {
			vs[i] = p.recordUsed(ctx, vs[i], n)
		}
	}
	return vs, nil
}

// RefreshVolume returns v with its used bytes as its host reports them
// (as last recorded if it cannot say).
func (p *Plane) RefreshVolume(ctx context.Context, v catalog.Volume) catalog.Volume {
	hv, err := p.volumesOf(v.HostID)
	if err != nil {
		return v
	}
	info, err := hv.GetVolume(ctx, v.ID)
	if err != nil {
		p.log.Warn("get volume of host", "volume_id", v.ID, "host_id", v.HostID, "err", err)
		return v
	}
	return p.recordUsed(ctx, v, info.UsedBytes)
}

// recordUsed records volume v's used bytes n if they changed.
func (p *Plane) recordUsed(ctx context.Context, v catalog.Volume, n int64) catalog.Volume {
	if v.UsedBytes == n {
		return v
	}
	v.UsedBytes = n
	if _, err := p.cat.UpdateVolume(ctx, v.ID, catalog.Limits{}, func(x *catalog.Volume) error {
		x.UsedBytes = n
		return nil
	}); err != nil && !errors.Is(err, catalog.ErrNotFound) {
		p.log.Warn("record volume usage", "volume_id", v.ID, "err", err)
	}
	return v
}

// MountedBy returns the ids of key's sandboxes, not stopped, that mount
// volume v, oldest first.
func (p *Plane) MountedBy(ctx context.Context, v catalog.Volume) ([]string, error) {
	sbs, err := p.cat.ListSandboxes(ctx, catalog.SandboxFilter{KeyID: v.KeyID, States: LiveStates})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	ids := []string{}
	for _, sb := range sbs {
		for _, m := range sb.Volumes {
			if m.VolumeID == v.ID {
				ids = append(ids, sb.ID)
				break
			}
		}
	}
	return ids, nil
}

// ResizeVolume grows key's volume v to sizeMiB: in the catalog against the
// key's quota, then on its host (the record is set back if that fails).
// A smaller size is Invalid; the same size changes nothing.
func (p *Plane) ResizeVolume(ctx context.Context, key catalog.Key, v catalog.Volume, sizeMiB int) (catalog.Volume, error) {
	switch {
	case sizeMiB < 1 || sizeMiB > MaxVolumeSizeMiB:
		return v, Errorf(Invalid, "size_mib must be between 1 and %d", MaxVolumeSizeMiB)
	case sizeMiB < v.SizeMiB:
		return v, Errorf(Invalid, "volume %s is %d MiB: a volume can only grow", v.Name, v.SizeMiB)
	case sizeMiB == v.SizeMiB:
		return v, nil
	}
	hv, err := p.volumesOf(v.HostID)
	if err != nil {
		return v, err
	}
	old := v.SizeMiB
	grown, err := p.cat.UpdateVolume(ctx, v.ID, p.Limits(key), func(x *catalog.Volume) error {
		if sizeMiB < x.SizeMiB {
			return Errorf(Conflict, "volume %s was resized to %d MiB meanwhile", x.Name, x.SizeMiB)
		}
		old, x.SizeMiB = x.SizeMiB, sizeMiB
		return nil
	})
	if errors.Is(err, catalog.ErrNotFound) {
		return v, Errorf(NotFound, "volume %q not found", v.Name)
	}
	if err != nil {
		return v, fmt.Errorf("resize volume %s: %w", v.Name, err)
	}
	info, err := hv.ResizeVolume(ctx, v.ID, int64(sizeMiB)<<20)
	if err != nil {
		if _, rerr := p.cat.UpdateVolume(context.WithoutCancel(ctx), v.ID, catalog.Limits{}, func(x *catalog.Volume) error {
			if x.SizeMiB == sizeMiB {
				x.SizeMiB = old
			}
			return nil
		}); rerr != nil {
			p.log.Error("set back the size of a volume its host did not resize", "volume_id", v.ID, "err", rerr)
		}
		return v, fmt.Errorf("resize volume %s: %w", v.Name, err)
	}
	p.log.Info("volume resized", "volume_id", v.ID, "size_mib", sizeMiB)
	return p.recordUsed(ctx, grown, info.UsedBytes), nil
}

// DeleteVolume deletes key's volume v: its files on its host, then its
// record. While a sandbox that is not stopped mounts it, it is a
// Conflict unless force (the host then deletes it under those sandboxes,
// whose mount stays, empty and failing). A volume whose host left the
// fleet for good loses only its record.
func (p *Plane) DeleteVolume(ctx context.Context, v catalog.Volume, force bool) error {
	if !force {
		ids, err := p.MountedBy(ctx, v)
		if err != nil {
			return err
		}
		if len(ids) > 0 {
			return Errorf(Conflict, "volume %s is mounted by sandbox %s: stop it first, or delete with force", v.Name, strings.Join(ids, ", "))
		}
	}
	hv, err := p.volumesOf(v.HostID)
	switch {
	case errors.Is(err, ErrUnknownHost):
	case err != nil:
		return err
	default:
		err := hv.DeleteVolume(ctx, v.ID, force)
		if errors.Is(err, host.ErrConflict) {
			return Errorf(Conflict, "volume %s is mounted by a sandbox on its host: stop it first, or delete with force", v.Name)
		}
		if err != nil && !errors.Is(err, host.ErrNotFound) {
			return fmt.Errorf("delete volume %s: %w", v.Name, err)
		}
	}
	if err := p.cat.DeleteVolume(context.WithoutCancel(ctx), v.ID); err != nil && !errors.Is(err, catalog.ErrNotFound) {
		return fmt.Errorf("delete volume %s: %w", v.Name, err)
	}
	p.log.Info("volume deleted", "volume_id", v.ID, "host_id", v.HostID, "force", force)
	return nil
}

// PromoteVolume makes branch's parent volume hold branch's files, and
// deletes branch; it returns the parent. A volume with no parent is
// Invalid; a branch mounted by a sandbox that is not stopped is a
// Conflict (it would lose its volume).
func (p *Plane) PromoteVolume(ctx context.Context, branch catalog.Volume) (catalog.Volume, error) {
	if branch.ParentID == "" {
		return catalog.Volume{}, Errorf(Invalid, "volume %s was not branched from another volume: there is nothing to promote it to", branch.Name)
	}
	parent, err := p.cat.GetVolume(ctx, branch.ParentID)
	if errors.Is(err, catalog.ErrNotFound) || (err == nil && parent.KeyID != branch.KeyID) {
		return catalog.Volume{}, Errorf(Invalid, "the volume %s was branched from is deleted", branch.Name)
	}
	if err != nil {
		return catalog.Volume{}, fmt.Errorf("get volume: %w", err)
	}
	if parent.HostID != branch.HostID {
		return catalog.Volume{}, Errorf(Conflict, "volume %s lives on host %s and its parent %s on host %s", branch.Name, branch.HostID, parent.Name, parent.HostID)
	}
	ids, err := p.MountedBy(ctx, branch)
	if err != nil {
		return catalog.Volume{}, err
	}
	if len(ids) > 0 {
		return catalog.Volume{}, Errorf(Conflict, "volume %s is mounted by sandbox %s: stop it before promoting the volume", branch.Name, strings.Join(ids, ", "))
	}
	hv, err := p.volumesOf(branch.HostID)
	if err != nil {
		return catalog.Volume{}, err
	}
	info, err := hv.PromoteVolume(ctx, branch.ID, parent.ID)
	if err != nil {
		return catalog.Volume{}, fmt.Errorf("promote volume %s: %w", branch.Name, err)
	}
	// The parent takes the branch's size if it grew: the branch's size
	// is freed at once, so the key holds no more than before.
	ctx = context.WithoutCancel(ctx)
	parent, err = p.cat.UpdateVolume(ctx, parent.ID, catalog.Limits{}, func(x *catalog.Volume) error {
		x.UsedBytes = info.UsedBytes
		if n := catalog.MiBCeil(info.LimitBytes); n > x.SizeMiB {
			x.SizeMiB = n
		}
		return nil
	})
	if err != nil {
		return catalog.Volume{}, fmt.Errorf("record promoted volume: %w", err)
	}
	if err := p.cat.DeleteVolume(ctx, branch.ID); err != nil && !errors.Is(err, catalog.ErrNotFound) {
		return catalog.Volume{}, fmt.Errorf("delete promoted branch: %w", err)
	}
	p.log.Info("volume promoted", "volume_id", branch.ID, "parent_id", parent.ID, "host_id", parent.HostID)
	return parent, nil
}

// volumeFileError is err of a file operation on volume v as users see
// it: a write over the limit says so.
func volumeFileError(v catalog.Volume, p string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, host.ErrNoSpace):
		return &Error{Kind: NoSpace, Err: err, Msg: fmt.Sprintf("volume %s is full (its size is %d MiB): delete files, or resize it", v.Name, v.SizeMiB)}
	case errors.Is(err, host.ErrNotFound):
		return &Error{Kind: NotFound, Err: err, Msg: fmt.Sprintf("%s: no such file or directory in volume %s", p, v.Name)}
	}
	return err
}

// volumeFile checks path p of volume v and returns v's host.
func (p *Plane) volumeFile(v catalog.Volume, fp string) (host.Volumes, string, error) {
	fp, err := CheckVolumeFilePath(fp)
	if err != nil {
		return nil, "", err
	}
	hv, err := p.volumesOf(v.HostID)
	return hv, fp, err
}

// ListVolumeDir lists directory fp of volume v.
func (p *Plane) ListVolumeDir(ctx context.Context, v catalog.Volume, fp string) ([]guestproto.FileInfo, error) {
	hv, fp, err := p.volumeFile(v, fp)
	if err != nil {
		return nil, err
	}
	fis, err := hv.ListVolumeDir(ctx, v.ID, fp)
	return fis, volumeFileError(v, fp, err)
}

// StatVolumeFile describes fp of volume v (a symlink itself).
func (p *Plane) StatVolumeFile(ctx context.Context, v catalog.Volume, fp string) (guestproto.FileInfo, error) {
	hv, fp, err := p.volumeFile(v, fp)
	if err != nil {
		return guestproto.FileInfo{}, err
	}
	fi, err := hv.StatVolumeFile(ctx, v.ID, fp)
	return fi, volumeFileError(v, fp, err)
}

// ReadVolumeFile opens regular file fp of volume v for reading.
func (p *Plane) ReadVolumeFile(ctx context.Context, v catalog.Volume, fp string) (io.ReadCloser, guestproto.FileInfo, error) {
	hv, fp, err := p.volumeFile(v, fp)
	if err != nil {
		return nil, guestproto.FileInfo{}, err
	}
	rc, fi, err := hv.ReadVolumeFile(ctx, v.ID, fp)
	return rc, fi, volumeFileError(v, fp, err)
}

// WriteVolumeFile writes r to fp of volume v (created or replaced, its
// parents made), synced before it returns: the bytes written.
func (p *Plane) WriteVolumeFile(ctx context.Context, v catalog.Volume, fp string, r io.Reader, mode fs.FileMode) (int64, error) {
	hv, fp, err := p.volumeFile(v, fp)
	if err != nil {
		return 0, err
	}
	if fp == "/" {
		return 0, Errorf(Invalid, "path is the volume's root, a directory")
	}
	n, err := hv.WriteVolumeFile(ctx, v.ID, fp, r, mode)
	return n, volumeFileError(v, fp, err)
}

// MkdirVolume makes directory fp of volume v and its parents.
func (p *Plane) MkdirVolume(ctx context.Context, v catalog.Volume, fp string) error {
	hv, fp, err := p.volumeFile(v, fp)
	if err != nil {
		return err
	}
	return volumeFileError(v, fp, hv.MkdirVolume(ctx, v.ID, fp))
}

// RemoveVolumeFile removes fp of volume v (a directory's contents too if
// recursive); the root cannot be removed.
func (p *Plane) RemoveVolumeFile(ctx context.Context, v catalog.Volume, fp string, recursive bool) error {
	hv, fp, err := p.volumeFile(v, fp)
	if err != nil {
		return err
	}
	if fp == "/" {
		return Errorf(Invalid, "refusing to remove the volume's root")
	}
	return volumeFileError(v, fp, hv.RemoveVolumeFile(ctx, v.ID, fp, recursive))
}
