package guestproto

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path"
	"strings"
)

// Volumes (OpVolumes): the guest agent mounts a FUSE file system at each
// volume's guest path and forwards its operations, by path, over one
// stream to the host, which serves them from the volume's directory tree
// (the bytes on the stream are internal/contract/volproto messages).

// OpVolumes attaches the session's volume stream: OPEN {volumes} → the
// agent makes sure each path is a FUSE mount of its volume (mounting
// missing ones, creating the directory; unmounting, lazily, volume mounts
// not in the list) and answers REPLY {} (or an error: a bad path, FUSE
// unavailable); then DATA both ways carries volproto's messages until
// either side ends the stream. A new OpVolumes stream replaces the
// session's previous one.
const OpVolumes Op = "volumes"

// FeatureVolumes: the agent serves OpVolumes.
const FeatureVolumes = "volumes"

// MaxVolumeMounts bounds the mounts of one OpVolumes request.
const MaxVolumeMounts = 16

// MaxVolumeTagLen bounds VolumeMount.Tag.
const MaxVolumeTagLen = 64

// VolumeMount is one volume the guest mounts.
type VolumeMount struct {
	// Tag is the host's name for the mount (1 to MaxVolumeTagLen bytes of
	// letters, digits, '_', '-' and '.'); the guest echoes it in its
	// requests.
	Tag string `json:"tag"`
	// Path is the absolute, clean guest path the volume is mounted at
	// (not "/").
	Path string `json:"path"`
	// ReadOnly mounts the volume read-only.
	ReadOnly bool `json:"read_only,omitempty"`
}

// ValidateVolumeMounts reports an *Error of CodeInvalid unless mounts
// are at most MaxVolumeMounts well-formed mounts with distinct tags and
// paths, none inside another.
func ValidateVolumeMounts(mounts []VolumeMount) error {
	if len(mounts) > MaxVolumeMounts {
		return Errorf(CodeInvalid, "%d volume mounts, more than the %d allowed", len(mounts), MaxVolumeMounts)
	}
	for i, m := range mounts {
		if err := validTag(m.Tag); err != nil {
			return err
		}
		if m.Path == "" || len(m.Path) > 4096 || !path.IsAbs(m.Path) || path.Clean(m.Path) != m.Path || m.Path == "/" || strings.ContainsRune(m.Path, 0) {
			return Errorf(CodeInvalid, "volume path %q is not an absolute, clean path other than /", m.Path)
		}
		for _, o := range mounts[:i] {
			if o.Tag == m.Tag {
				return Errorf(CodeInvalid, "volume tag %q appears twice", m.Tag)
			}
			if o.Path == m.Path || strings.HasPrefix(m.Path, o.Path+"/") || strings.HasPrefix(o.Path, m.Path+"/") {
				return Errorf(CodeInvalid, "volume paths %q and %q overlap", o.Path, m.Path)
			}
		}
	}
	return nil
}

func validTag(t string) error {
	if t == "" || len(t) > MaxVolumeTagLen {
		return Errorf(CodeInvalid, "volume tag %q is not 1 to %d bytes", t, MaxVolumeTagLen)
	}
	for _, r := range t {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return Errorf(CodeInvalid, "volume tag %q has a character other than letters, digits, '_', '-' and '.'", t)
		}
	}
	return nil
}

// OpenVolumes makes the guest mount mounts (and only them: volume mounts
// of an earlier call that are not in mounts are unmounted, lazily) and
// returns the volume stream: the connection on which the guest's FUSE
// daemon sends volproto requests and the host answers them (see
// internal/hostagent/volumes.Serve). It returns once the guest has
// mounted every volume. As for DialPort, ctx bounds the opening only; the
// connection lives until it is closed, or this Client is.
//
// One volume stream per session: a new OpenVolumes replaces the previous
// one (the guest ends it); the guest's daemon holds its requests while no
// stream is attached and re-sends those that were outstanding on the
// stream that ended.
//
// Errors: a *Error of CodeInvalid for bad mounts (ValidateVolumeMounts,
// sent nothing; or the guest could not create a mount's directory), of
// CodeInternal when the guest could not mount (no FUSE in its kernel); one
// matching errors.ErrUnsupported, sent nothing, when the agent does not
// list FeatureVolumes (it was started before volumes existed). The
// connection behaves as DialPort's.
func (c *Client) OpenVolumes(ctx context.Context, mounts []VolumeMount) (net.Conn, error) {
	what := "open volumes"
	if err := ValidateVolumeMounts(mounts); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if c.established.Load() && !c.volumes.Load() {
		return nil, fmt.Errorf("%s: %w: this sandbox's guest agent is too old to mount volumes; recreate the sandbox from a current template",
			what, errors.ErrUnsupported)
	}
	if mounts == nil {
		mounts = []VolumeMount{}
	}
	s, err := c.openStream(ctx, &OpenRequest{Op: OpVolumes, Volumes: mounts}, 1, true)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if _, err := c.waitFrame(s, s.reply, "REPLY"); err != nil {
		s.detach()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	s.setDeadline(0, nil)
	s.mu.Lock()
	stop := s.stop
	s.stop = nil
	s.mu.Unlock()
	if stop != nil && !stop() {
		return nil, fmt.Errorf("%s: %w", what, ctx.Err())
	}
	dc := &dialConn{s: s, local: dialAddr(fmt.Sprintf("stream %d", s.id)), remote: dialAddr("volumes")}
	dc.rd.init()
	dc.wd.init()
	return dc, nil
}
