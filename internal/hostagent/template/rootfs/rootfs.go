// Package rootfs builds guest root filesystems: ext4 images made from a
// user's OCI image (a registry reference, an OCI layout directory or a
// `docker save` archive), laid out like the ones scripts/setup.sh builds.
//
// FromImage owns the whole build: it resolves the source to one linux/amd64
// image, applies its layers in order onto a private directory tree (whiteouts,
// hard links, owners, modes, times and extended attributes as the layers say,
// no path leaving the tree), adds what every guest needs (/run, /tmp, /work,
// /etc/hosts) and hands the tree to mkfs.ext4 -d. Nothing is mounted. The
// guest agent and /init come from the initramfs, so the image needs nothing
// of PandaStack's.
package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/pandastack/pandastack/internal/contract/errs"
)

// Error classes. FromImage's errors carry one of them (test with errors.Is)
// and a message written for the user who named the image.
var (
	// ErrNotFound: no such image (registry 404, missing file or directory).
	ErrNotFound = errs.New(errs.NotFound, "image not found")
	// ErrDenied: the registry refused the request (HTTP 401 or 403).
	ErrDenied = errs.New(errs.Forbidden, "access denied")
	// ErrInvalid: a malformed reference, an unsupported kind of source, or an
	// image whose layers cannot be applied safely (a path leaving the tree).
	ErrInvalid = errs.New(errs.Invalid, "invalid image")
	// ErrPlatform: the image has no linux/amd64 variant.
	ErrPlatform = errs.New(errs.Invalid, "wrong platform")
	// ErrTooLarge: the files do not fit in the size asked for or allowed.
	ErrTooLarge = errs.New(errs.Invalid, "image too large")
	// ErrRefused: the registry's address is one a Pull may not reach
	// (loopback, private, link-local, the host's own networks...).
	ErrRefused = errs.New(errs.Forbidden, "registry address refused")
	// ErrUnreachable: the registry could not be reached, or it broke off
	// (DNS, connection, TLS, a reset or cut answer).
	ErrUnreachable = errs.New(errs.Unavailable, "registry unreachable")
	// ErrBadImage: the registry answered with something that is not a
	// valid image (a manifest, index, config or layer that does not
	// parse or match its digest), or with an unexpected HTTP status.
	ErrBadImage = errs.New(errs.Invalid, "bad image manifest")
)

// Detail returns what lies under one of FromImage's classified errors (a
// registry's own answer, a network error), for the operator's log: its
// Error text is written for users and never holds what a registry sent.
// nil if err is not one.
func Detail(err error) error {
	var ue *userError
	if errors.As(err, &ue) {
		return ue.err
	}
	return nil
}

// Options tune FromImage. The zero value is usable.
type Options struct {
	// SizeMiB is the ext4 image's size. 0 sizes it from the files: what they
	// need plus headroom for what sandboxes write (the file is sparse, so
	// free space costs no disk).
	SizeMiB int
	// MaxSizeMiB caps the image's size, and the bytes written while
	// extracting; 0 means no cap. A tree that does not fit is ErrTooLarge.
	MaxSizeMiB int
	// Insecure allows plain HTTP to any registry. Without it, registries on
	// loopback or private addresses (127.0.0.1, localhost, 10.x, ...) are
	// still tried over HTTPS first and then HTTP (go-containerregistry's
	// rule); all others are HTTPS only.
	Insecure bool
	// Label is the file system's label (at most 16 bytes); default "rootfs".
	Label string
	// TempDir holds the flattened tree while building; default: out's
	// directory, so a big image needs no room in /tmp.
	TempDir string
	// Progress, if set, is called with a line for each step ("pulling layer
	// 2/5 (12.3 MiB)", "making ext4 (256 MiB)"). Called from FromImage's
	// goroutine only.
	Progress func(string)
	// Pull, if set, is how registries are reached: only public addresses
	// (and its allow-lists), with its credentials (none by default). A
	// server pulling the images its users name must set it. nil: the
	// operator's own pull (panda rootfs build): any address, credentials
	// from the Docker config.
	Pull *Pull
}

// Config is what the image says about running it: the template's defaults
// for commands.
type Config struct {
	// Digest is the manifest digest of the image used ("sha256:..."); for a
	// multi-platform index, that of its linux/amd64 image.
	Digest     string
	Env        []string
	WorkingDir string
	User       string
	Entrypoint []string
	Cmd        []string
}

// FromImage builds an ext4 root filesystem at out from the image src and
// returns the image's config.
//
// src is a registry reference ("registry:5000/repo:tag", "name@sha256:...",
// optionally prefixed "docker://"; reached as opts.Pull says, or else with
// credentials from the Docker config via authn.DefaultKeychain, else
// anonymous), "oci:DIR" or a directory holding
// an OCI layout (index.json), or "docker-archive:FILE" or a ".tar" file made
// by `docker save` (one image in it). A multi-platform index yields its
// linux/amd64 image. A registry's failures are reported by class
// (ErrRefused, ErrUnreachable, ErrDenied, ErrNotFound, ErrBadImage), with
// messages that never hold what the registry sent (Detail has it).
//
// The image is written to a temporary file next to out and renamed over out
// at the end; on any error out is untouched and no temporary file or
// directory is left. Building needs root: the tree's files get the owners
// the layers give them.
func FromImage(ctx context.Context, src string, out string, opts Options) (Config, error) {
	if err := opts.validate(); err != nil {
		return Config{}, err
	}
	if os.Geteuid() != 0 {
		return Config{}, errors.New("building a root filesystem needs root: its files get the owners the image gives them")
	}
	progress := opts.Progress
	if progress == nil {
		progress = func(string) {}
	}

	img, err := open(ctx, src, opts)
	if err != nil {
		return Config{}, err
	}
	cfg, err := img.config(ctx)
	if err != nil {
		return Config{}, err
	}

	tmpDir := opts.TempDir
	if tmpDir == "" {
		tmpDir = filepath.Dir(out)
	}
	// The tree sits in a directory only root may enter: it holds the
	// image's setuid programs, which other users of the host must not run.
	work, err := os.MkdirTemp(tmpDir, "."+filepath.Base(out)+".tree-")
	if err != nil {
		return Config{}, fmt.Errorf("make the temporary tree: %w", err)
	}
	defer os.RemoveAll(work)
	treeDir := filepath.Join(work, "root")
	if err := os.Mkdir(treeDir, 0o755); err != nil {
		return Config{}, fmt.Errorf("make the temporary tree: %w", err)
	}
	// Not the umask's mode (panda up runs with 077): copyRoot makes the
	// guest's / what the tree root is, and a 0700 / locks every user but
	// root out of the guest.
	if err := os.Chmod(treeDir, 0o755); err != nil {
		return Config{}, fmt.Errorf("make the temporary tree: %w", err)
	}

	t, err := newTree(treeDir, int64(opts.MaxSizeMiB)<<20)
	if err != nil {
		return Config{}, err
	}
	defer t.close()
	if err := img.apply(ctx, t, progress); err != nil {
		return Config{}, err
	}
	if err := t.finish(); err != nil {
		return Config{}, fmt.Errorf("image %s: %w", src, err)
	}

	label := opts.Label
	if label == "" {
		label = "rootfs"
	}
	if err := makeExt4(ctx, treeDir, out, label, opts, progress); err != nil {
		var ue *userError
		if errors.As(err, &ue) {
			return Config{}, errorf(ue.class, err, "image %s: %s", src, ue.msg)
		}
		return Config{}, err
	}
	return cfg, nil
}

func (o Options) validate() error {
	if o.SizeMiB < 0 || o.MaxSizeMiB < 0 {
		return errorf(ErrInvalid, nil, "sizes cannot be negative")
	}
	if o.SizeMiB > 0 && o.MaxSizeMiB > 0 && o.SizeMiB > o.MaxSizeMiB {
		return errorf(ErrTooLarge, nil, "a size of %d MiB is over the limit of %d MiB", o.SizeMiB, o.MaxSizeMiB)
	}
	if len(o.Label) > 16 {
		return errorf(ErrInvalid, nil, "label %q is longer than 16 bytes", o.Label)
	}
	return nil
}

// userError is an error of one class whose message is written for users;
// err, if set, is the underlying cause (kept for errors.As, not shown).
type userError struct {
	class error
	msg   string
	err   error
}

func (e *userError) Error() string { return e.msg }

func (e *userError) Is(target error) bool { return target == e.class }

func (e *userError) Unwrap() error { return e.err }

func errorf(class error, cause error, format string, args ...any) error {
	return &userError{class: class, msg: fmt.Sprintf(format, args...), err: cause}
}

// mib formats a byte count for progress lines and messages: "12.3 MiB", or
// KiB under one MiB.
func mib(n int64) string {
	v, unit := float64(n)/(1<<20), " MiB"
	if n < 1<<20 {
		v, unit = float64(n)/(1<<10), " KiB"
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", v), ".0") + unit
}
