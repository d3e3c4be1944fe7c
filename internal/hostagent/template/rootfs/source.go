package rootfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The guests' platform.
const (
	wantOS   = "linux"
	wantArch = "amd64"
)

// source is one resolved image and how to name it in messages.
type source struct {
	src    string // as the user gave it
	img    v1.Image
	remote bool // layers come over the network ("pulling", not "reading")
	// creds ends the hint of a registry's refusal (remoteError).
	creds string
}

// unsupported names the transports of skopeo-style references that FromImage
// recognises but cannot read, so that "containers-storage:x" gets a clear
// error instead of an odd reference parse.
var unsupported = []string{"oci-archive", "docker-daemon", "containers-storage", "dir", "ostree", "sif", "tarball"}

const wantForms = "want a registry reference (registry:5000/repo:tag, name@sha256:...), oci:DIR, docker-archive:FILE, an OCI layout directory or a .tar from docker save"

// open resolves src to one linux/amd64 image.
func open(ctx context.Context, src string, opts Options) (*source, error) {
	switch {
	case strings.HasPrefix(src, "oci:"):
		return openLayout(src, strings.TrimPrefix(src, "oci:"))
	case strings.HasPrefix(src, "docker-archive:"):
		return openArchive(src, strings.TrimPrefix(src, "docker-archive:"))
	case strings.HasPrefix(src, "docker://"):
		return openRemote(ctx, src, strings.TrimPrefix(src, "docker://"), opts)
	}
	if i := strings.IndexByte(src, ':'); i > 0 && slices.Contains(unsupported, src[:i]) {
		return nil, errorf(ErrInvalid, nil, "unsupported image source %q: %s", src, wantForms)
	}
	fi, err := os.Stat(src)
	switch {
	case err == nil && fi.IsDir():
		if _, err := os.Stat(filepath.Join(src, "index.json")); err != nil {
			return nil, errorf(ErrInvalid, err, "%s is a directory but not an OCI image layout (it has no index.json)", src)
		}
		return openLayout(src, src)
	case err == nil && fi.Mode().IsRegular() && strings.HasSuffix(src, ".tar"):
		return openArchive(src, src)
	case looksLikePath(src):
		if err == nil {
			return nil, errorf(ErrInvalid, nil, "unsupported image source %s: %s", src, wantForms)
		}
		return nil, errorf(ErrNotFound, err, "image %s not found: no such file or directory", src)
	}
	return openRemote(ctx, src, src, opts)
}

// looksLikePath tells file names from registry references, which never start
// with "/" or "." nor end in ".tar".
func looksLikePath(s string) bool {
	return strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".tar")
}

func openRemote(ctx context.Context, src, refStr string, opts Options) (*source, error) {
	var nameOpts []name.Option
	if opts.Insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	ref, err := name.ParseReference(refStr, nameOpts...)
	if err != nil {
		return nil, errorf(ErrInvalid, err, "bad image reference %q: %v", refStr, err)
	}
	ropts := []remote.Option{remote.WithContext(ctx), remote.WithUserAgent("pandastack")}
	creds := "credentials (docker login)"
	if opts.Pull != nil {
		ropts = append(ropts, opts.Pull.options()...)
		if opts.Pull.Keychain == nil {
			creds = "credentials, and pulls here are anonymous"
		}
	} else {
		ropts = append(ropts, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	}
	fail := func(err error) error { return remoteError(ctx, src, creds, err) }
	desc, err := remote.Get(ref, ropts...)
	if err != nil {
		return nil, fail(err)
	}
	var img v1.Image
	switch {
	case desc.MediaType.IsIndex():
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, fail(err)
		}
		img, err = pick(src, idx)
		if err != nil {
			return nil, fail(err)
		}
	case desc.MediaType.IsImage():
		img, err = desc.Image()
		if err != nil {
			return nil, fail(err)
		}
		if err := checkPlatform(src, img); err != nil {
			return nil, fail(err)
		}
	default:
		// Its media type only in the detail: the registry's words.
		return nil, errorf(ErrBadImage, fmt.Errorf("media type %.100q", desc.MediaType), "image %s: bad manifest: the registry's answer is not a container image", src)
	}
	return &source{src: src, img: img, remote: true, creds: creds}, nil
}

// remoteError turns the failure of a request to a registry into an error
// of one class with a message naming the reference (the user's words) and
// nothing the registry sent: no body, no error text of its own, not even
// a header. userErrors (ours) are kept. creds ends the hint of a refusal
// ("...it needs <creds>").
func remoteError(ctx context.Context, src, creds string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ue *userError
	if errors.As(err, &ue) {
		return err
	}
	if re, ok := errorsAsRefused(err); ok {
		return errorf(ErrRefused, err, "image %s: refused: its registry is at %s; this server pulls only from public addresses, unless its operator allows more (registry_allow_nets, registry_allow_hosts)", src, re.Class)
	}
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusNotFound:
			return errorf(ErrNotFound, err, "image %s not found in its registry", src)
		case http.StatusUnauthorized, http.StatusForbidden:
			return errorf(ErrDenied, err, "image %s: unauthorized: the registry refused access (HTTP %d): the image may not exist, or it needs %s", src, te.StatusCode, creds)
		}
		for _, d := range te.Errors {
			switch d.Code {
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode:
				return errorf(ErrNotFound, err, "image %s not found in its registry", src)
			case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
				return errorf(ErrDenied, err, "image %s: unauthorized: the registry refused access: the image may not exist, or it needs %s", src, creds)
			}
		}
		if te.StatusCode >= 500 {
			return errorf(ErrUnreachable, err, "image %s: registry unreachable: it answered HTTP %d", src, te.StatusCode)
		}
		return errorf(ErrBadImage, err, "image %s: bad manifest: the registry answered HTTP %d", src, te.StatusCode)
	}
	var ue2 *url.Error
	var oe *net.OpError
	var de *net.DNSError
	switch {
	case errors.As(err, &de):
		return errorf(ErrUnreachable, err, "image %s: registry unreachable: its name does not resolve", src)
	case errors.As(err, &ue2), errors.As(err, &oe), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		return errorf(ErrUnreachable, err, "image %s: registry unreachable", src)
	}
	return errorf(ErrBadImage, err, "image %s: bad manifest: the registry's answer is not a valid image", src)
}

func openLayout(src, dir string) (*source, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, errorf(ErrNotFound, err, "image %s not found: no OCI layout (index.json) in %s", src, dir)
	}
	if err != nil {
		return nil, errorf(ErrInvalid, err, "read OCI layout %s: %v", dir, err)
	}
	img, err := pick(src, idx)
	if err != nil {
		return nil, err
	}
	return &source{src: src, img: img}, nil
}

func openArchive(src, file string) (*source, error) {
	if _, err := os.Stat(file); err != nil {
		return nil, errorf(ErrNotFound, err, "image %s not found: no such file", src)
	}
	img, err := tarball.ImageFromPath(file, nil)
	if err != nil {
		return nil, errorf(ErrInvalid, err, "read docker archive %s (made by docker save, holding one image): %v", file, err)
	}
	if err := checkPlatform(src, img); err != nil {
		return nil, err
	}
	return &source{src: src, img: img}, nil
}

// pick returns idx's linux/amd64 image, looking into nested indexes. An image
// listed without a platform counts if its config says linux/amd64 (or says
// nothing): OCI layouts often list their one image so.
func pick(src string, idx v1.ImageIndex) (v1.Image, error) {
	var others []string
	img, err := pickIn(src, idx, &others, 0)
	if err != nil || img != nil {
		return img, err
	}
	if len(others) == 0 {
		return nil, errorf(ErrNotFound, nil, "image %s holds no images", src)
	}
	slices.Sort(others)
	others = slices.Compact(others)
	return nil, errorf(ErrPlatform, nil, "image %s has no %s/%s variant (it has %s); guests are %s/%s",
		src, wantOS, wantArch, strings.Join(others, ", "), wantOS, wantArch)
}

func pickIn(src string, idx v1.ImageIndex, others *[]string, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, errorf(ErrInvalid, nil, "image %s: indexes nested too deep", src)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read the index of %s: %w", src, err)
	}
	// Images with a matching platform first, then the unlabelled ones.
	for _, d := range m.Manifests {
		if d.MediaType.IsImage() && d.Platform != nil && d.Platform.OS == wantOS && d.Platform.Architecture == wantArch {
			img, err := idx.Image(d.Digest)
			if err != nil {
				return nil, fmt.Errorf("read image %s of %s: %w", d.Digest, src, err)
			}
			return img, nil
		}
	}
	for _, d := range m.Manifests {
		switch {
		case d.MediaType.IsImage() && d.Platform == nil:
			img, err := idx.Image(d.Digest)
			if err != nil {
				return nil, fmt.Errorf("read image %s of %s: %w", d.Digest, src, err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				return nil, fmt.Errorf("read the config of %s: %w", src, err)
			}
			if platformOK(cf) {
				return img, nil
			}
			*others = append(*others, platformOf(cf))
		case d.MediaType.IsImage() && d.Platform.OS != "unknown": // not an attestation
			*others = append(*others, d.Platform.String())
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, fmt.Errorf("read index %s of %s: %w", d.Digest, src, err)
			}
			img, err := pickIn(src, child, others, depth+1)
			if err != nil || img != nil {
				return img, err
			}
		}
	}
	return nil, nil
}

func checkPlatform(src string, img v1.Image) error {
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("read the config of %s: %w", src, err)
	}
	if !platformOK(cf) {
		return errorf(ErrPlatform, nil, "image %s is for %s; guests are %s/%s", src, platformOf(cf), wantOS, wantArch)
	}
	return nil
}

// platformOK accepts linux/amd64 and configs that name no platform.
func platformOK(cf *v1.ConfigFile) bool {
	return cf.Architecture == "" || (cf.OS == wantOS || cf.OS == "") && cf.Architecture == wantArch
}

func platformOf(cf *v1.ConfigFile) string {
	p := cf.OS + "/" + cf.Architecture
	if cf.Variant != "" {
		p += "/" + cf.Variant
	}
	return p
}

// config is the image's run settings.
func (s *source) config(ctx context.Context) (Config, error) {
	cf, err := s.img.ConfigFile()
	if err != nil {
		return Config{}, s.fail(ctx, fmt.Errorf("read the config of %s: %w", s.src, err))
	}
	d, err := s.img.Digest()
	if err != nil {
		return Config{}, s.fail(ctx, fmt.Errorf("digest of %s: %w", s.src, err))
	}
	return Config{
		Digest:     d.String(),
		Env:        cf.Config.Env,
		WorkingDir: cf.Config.WorkingDir,
		User:       cf.Config.User,
		Entrypoint: cf.Config.Entrypoint,
		Cmd:        cf.Config.Cmd,
	}, nil
}

// apply applies the image's layers, bottom first, onto t.
func (s *source) apply(ctx context.Context, t *tree, progress func(string)) error {
	layers, err := s.img.Layers()
	if err != nil {
		return s.layerError(ctx, "list the layers", err)
	}
	verb := "reading"
	if s.remote {
		verb = "pulling"
	}
	for i, l := range layers {
		what := fmt.Sprintf("layer %d/%d", i+1, len(layers))
		size, err := l.Size()
		if err != nil {
			return s.layerError(ctx, what, err)
		}
		progress(fmt.Sprintf("%s %s (%s)", verb, what, mib(size)))
		rc, err := l.Uncompressed()
		if err != nil {
			return s.layerError(ctx, what, err)
		}
		err = t.applyLayer(ctx, rc)
		if err == nil {
			// Read to the end so that the digest is checked.
			_, err = io.Copy(io.Discard, rc)
		}
		if cerr := rc.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return s.layerError(ctx, what, err)
		}
	}
	return nil
}

// layerError keeps classified errors (their messages are for users) and
// names the image and layer in the others.
func (s *source) layerError(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ue *userError
	if errors.As(err, &ue) {
		return errorf(ue.class, err, "image %s, %s: %s", s.src, what, ue.msg)
	}
	if s.remote {
		// What came over the network: by class, never its text.
		return remoteError(ctx, s.src, s.creds, err)
	}
	return fmt.Errorf("image %s, %s: %w", s.src, what, err)
}

// fail is err as remoteError says for an image from a registry, as it is
// for others.
func (s *source) fail(ctx context.Context, err error) error {
	if s.remote {
		return remoteError(ctx, s.src, s.creds, err)
	}
	return err
}
