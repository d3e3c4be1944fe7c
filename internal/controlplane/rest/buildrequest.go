package rest

// The request of POST /v1/templates: a JSON object (an image build, or a
// Dockerfile given as text with no context), or a multipart/form-data
// body for Dockerfile builds with a context:
//
//	spec        the JSON object (as the JSON body; not "dockerfile")
//	dockerfile  the Dockerfile's text (at most 1 MiB); optional if the
//	            context holds it (at its root as "Dockerfile", or at the
//	            spec's dockerfile_path)
//	context     a tar or gzip-compressed tar of the build context; after
//	            the spec part, so that the build is checked before its
//	            context is received (buildadmit.go)
//
// The context is streamed to a file of Config.TemplateContextDir, at most
// Config.TemplateContextMaxBytes (413 beyond) and while the disk keeps
// tmplbuild.MinFreeBytes free (507), and handed to the builder
// (tmplbuild.Spec.ContextTar), which removes it; every path that does not
// hand it over removes it here.

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane"
)

// Limits of a build request.
const (
	// MaxDockerfileBytes bounds a Dockerfile's text.
	MaxDockerfileBytes = 1 << 20
	// DefaultTemplateContextMaxBytes is the default of
	// Config.TemplateContextMaxBytes.
	DefaultTemplateContextMaxBytes = 2 << 30
	// ContextFilePattern matches the files contexts are received in
	// (filepath.Glob), in Config.TemplateContextDir.
	ContextFilePattern = "context-*.tar"
	maxBuildArgs       = 256
	maxBuildArgBytes   = 64 << 10
)

// buildSpec is the JSON object of a build request (the JSON body, or the
// spec part of a multipart one).
type buildSpec struct {
	Name      string `json:"name"`
	FromImage string `json:"from_image"`
	// Dockerfile is the Dockerfile's text (JSON bodies only; multipart
	// ones send it as the dockerfile part).
	Dockerfile *string `json:"dockerfile"`
	// DockerfilePath names the Dockerfile inside the context (multipart
	// bodies without a dockerfile part; default "Dockerfile").
	DockerfilePath string          `json:"dockerfile_path"`
	BuildArgs      json.RawMessage `json:"build_args"`
	templates.Startup
}

// buildArgName is what an ARG's name may be (as Docker's: letters,
// digits, underscores, not starting with a digit).
var buildArgName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// decodeBuildArgs checks build_args: an object of strings.
func decodeBuildArgs(raw json.RawMessage) (map[string]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, badRequest("build_args must be an object of strings, such as {\"VERSION\": \"1.2\"}")
	}
	if len(m) > maxBuildArgs {
		return nil, badRequest("build_args has %d entries; at most %d", len(m), maxBuildArgs)
	}
	out := make(map[string]string, len(m))
	size := 0
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the first bad one, the same every time
	for _, k := range keys {
		v, ok := m[k].(string)
		if !ok {
			return nil, badRequest("build_args[%q] must be a string, not %s", k, jsonKind(m[k]))
		}
		if !buildArgName.MatchString(k) {
			return nil, badRequest("build_args: %q is not an ARG name (letters, digits and _, not starting with a digit)", k)
		}
		size += len(k) + len(v)
		out[k] = v
	}
	if size > maxBuildArgBytes {
		return nil, badRequest("build_args are larger than %d bytes together", maxBuildArgBytes)
	}
	return out, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case float64:
		return "a number"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return "a string"
}

// isMultipart reports whether r's body is multipart/form-data.
func isMultipart(r *http.Request) bool {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return err == nil && mt == "multipart/form-data"
}

// buildSpecOf reads the build request of r (JSON or multipart) into a
// tmplbuild.Spec, calling check with the template's name as soon as it is
// read: before the context. On success the caller owns spec.ContextTar (if
// any) and must hand it to the builder or remove it; on error nothing is
// left.
func (s *Server) buildSpecOf(r *http.Request, check func(name string) error) (builds.Spec, error) {
	if !isMultipart(r) {
		var req buildSpec
		if err := decodeJSON(r, &req, false); err != nil {
			return builds.Spec{}, err
		}
		if err := check(req.Name); err != nil {
			return builds.Spec{}, err
		}
		if req.DockerfilePath != "" {
			return builds.Spec{}, badRequest("dockerfile_path names a file of the context: send the build as multipart/form-data with a context part")
		}
		var df []byte
		if req.Dockerfile != nil {
			df = []byte(*req.Dockerfile)
		}
		return checkBuildSpec(req, df, "")
	}
	return s.multipartBuildSpec(r, check)
}

// checkBuildSpec turns a decoded request into a Spec: exactly one of an
// image and a Dockerfile, and build arguments only with a Dockerfile.
func checkBuildSpec(req buildSpec, dockerfile []byte, contextTar string) (builds.Spec, error) {
	switch {
	case req.FromImage != "" && dockerfile != nil:
		return builds.Spec{}, badRequest("give from_image or a Dockerfile, not both")
	case req.FromImage == "" && dockerfile == nil:
		return builds.Spec{}, badRequest("nothing to build from: give from_image (an image reference such as registry.example.com/app:1.0) or a Dockerfile")
	case dockerfile != nil && len(bytes.TrimSpace(dockerfile)) == 0:
		return builds.Spec{}, badRequest("the Dockerfile is empty")
	case len(dockerfile) > MaxDockerfileBytes:
		return builds.Spec{}, badRequest("the Dockerfile is larger than %d bytes", MaxDockerfileBytes)
	case dockerfile != nil && !utf8.Valid(dockerfile):
		return builds.Spec{}, badRequest("the Dockerfile is not valid UTF-8")
	}
	args, err := decodeBuildArgs(req.BuildArgs)
	if err != nil {
		return builds.Spec{}, err
	}
	if req.FromImage != "" {
		if args != nil {
			return builds.Spec{}, badRequest("build_args are for Dockerfile builds; an image build takes none")
		}
		if err := checkImageRef(req.FromImage); err != nil {
			return builds.Spec{}, err
		}
	}
	return builds.Spec{Name: req.Name, FromImage: req.FromImage, Dockerfile: dockerfile, ContextTar: contextTar, BuildArgs: args, Startup: req.Startup}, nil
}

// multipartBuildSpec reads a multipart build request (see the top of this
// file). Parts may come in any order, each at most once, but for the
// context, which must follow the spec: check(name) runs on the spec.
func (s *Server) multipartBuildSpec(r *http.Request, check func(name string) error) (spec builds.Spec, err error) {
	maxContext := s.cfg.TemplateContextMaxBytes
	// The whole body: the context, the spec and the Dockerfile, and room
	// for the parts' headers.
	r.Body = http.MaxBytesReader(nil, r.Body, maxContext+maxJSONBody+MaxDockerfileBytes+1<<20)
	mr, err := r.MultipartReader()
	if err != nil {
		return builds.Spec{}, badRequest("read multipart body: %v", err)
	}
	var (
		req        *buildSpec
		dockerfile []byte
		contextTar string
	)
	defer func() {
		if err != nil && contextTar != "" {
			os.Remove(contextTar)
		}
	}()
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return builds.Spec{}, multipartError(err)
		}
		name := p.FormName()
		switch name {
		case "spec":
			if req != nil {
				return builds.Spec{}, badRequest("the spec part is given twice")
			}
			req = new(buildSpec)
			if err := decodeSpecPart(p, req); err != nil {
				return builds.Spec{}, err
			}
			if err := check(req.Name); err != nil {
				return builds.Spec{}, err
			}
		case "dockerfile":
			if dockerfile != nil {
				return builds.Spec{}, badRequest("the dockerfile part is given twice")
			}
			b, err := io.ReadAll(io.LimitReader(p, MaxDockerfileBytes+1))
			if err != nil {
				return builds.Spec{}, multipartError(err)
			}
			if len(b) > MaxDockerfileBytes {
				return builds.Spec{}, badRequest("the Dockerfile is larger than %d bytes", MaxDockerfileBytes)
			}
			dockerfile = b
		case "context":
			if contextTar != "" {
				return builds.Spec{}, badRequest("the context part is given twice")
			}
			if req == nil {
				return builds.Spec{}, badRequest("the context part comes before the spec part: send the spec first, so that the build is checked before its context is uploaded")
			}
			if contextTar, err = s.saveContext(p); err != nil {
				return builds.Spec{}, err
			}
		default:
			return builds.Spec{}, badRequest("unknown part %q: a build's parts are spec, dockerfile and context", name)
		}
		p.Close()
	}
	switch {
	case req == nil:
		return builds.Spec{}, badRequest("the spec part is missing: a JSON object with the template's name")
	case req.Dockerfile != nil:
		return builds.Spec{}, badRequest("the spec's dockerfile field is for JSON bodies; send the Dockerfile as the dockerfile part")
	case req.FromImage != "" && contextTar != "":
		return builds.Spec{}, badRequest("a context is for Dockerfile builds; an image build (from_image) takes none")
	case req.DockerfilePath != "" && dockerfile != nil:
		return builds.Spec{}, badRequest("give a dockerfile part or a dockerfile_path in the context, not both")
	case req.DockerfilePath != "" && contextTar == "":
		return builds.Spec{}, badRequest("dockerfile_path names a file of the context, and there is no context part")
	}
	if dockerfile == nil && contextTar != "" && req.FromImage == "" {
		name := req.DockerfilePath
		if name == "" {
			name = "Dockerfile"
		}
		if dockerfile, err = dockerfileInContext(contextTar, name); err != nil {
			return builds.Spec{}, err
		}
	}
	return checkBuildSpec(*req, dockerfile, contextTar)
}

func decodeSpecPart(p io.Reader, req *buildSpec) error {
	b, err := io.ReadAll(io.LimitReader(p, maxJSONBody+1))
	if err != nil {
		return multipartError(err)
	}
	if len(b) > maxJSONBody {
		return badRequest("the spec part is larger than %d bytes", maxJSONBody)
	}
	if !utf8.Valid(b) {
		return badRequest("the spec part is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(req); err != nil {
		return badRequest("malformed JSON in the spec part: %v", jsonErrorText(err))
	}
	if dec.More() {
		return badRequest("malformed JSON in the spec part: unexpected data after the object")
	}
	return nil
}

// multipartError is the answer to an error reading a multipart body.
func multipartError(err error) error {
	var mbe *http.MaxBytesError
	var ce *controlplane.Error
	switch {
	case errors.As(err, &mbe):
		return errorf(controlplane.TooLarge, "request body is larger than %d bytes", mbe.Limit)
	case errors.As(err, &ce):
		return ce // the key was revoked meanwhile (ctxBody)
	}
	return badRequest("read multipart body: %v", err)
}

// saveContext streams the context part to a new file of the context
// directory and returns its path; on error it leaves none.
func (s *Server) saveContext(p io.Reader) (string, error) {
	dir := s.cfg.TemplateContextDir
	if dir == "" {
		dir = os.TempDir()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("save build context: %w", err)
	}
	f, err := os.CreateTemp(dir, ContextFilePattern)
	if err != nil {
		return "", fmt.Errorf("save build context: %w", err)
	}
	keep := false
	defer func() {
		if !keep {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	max := s.cfg.TemplateContextMaxBytes
	n, err := io.Copy(&spaceWriter{w: f, dir: dir}, io.LimitReader(p, max+1))
	if err != nil {
		var mbe *http.MaxBytesError
		var ce *controlplane.Error
		switch {
		case errors.As(err, &mbe) || n > max:
			return "", contextTooLarge(max)
		case errors.Is(err, builds.ErrNoSpace):
			return "", err
		case errors.As(err, &ce):
			return "", ce // the key was revoked meanwhile (ctxBody)
		}
		return "", badRequest("read the context part: %v", err)
	}
	if n > max {
		return "", contextTooLarge(max)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("save build context: %w", err)
	}
	if err := checkTarMagic(f.Name()); err != nil {
		return "", err
	}
	keep = true
	return f.Name(), nil
}

func contextTooLarge(max int64) error {
	return errorf(controlplane.TooLarge,
		"the build context is larger than this server accepts (%s); leave files out with a .dockerignore", humanBytes(max))
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// checkTarMagic checks that the file at p starts as a gzip stream or a
// tar archive (an empty one included).
func checkTarMagic(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("check build context: %w", err)
	}
	defer f.Close()
	var b [512]byte
	n, _ := io.ReadFull(f, b[:])
	switch {
	case n >= 2 && b[0] == 0x1f && b[1] == 0x8b:
		return nil // gzip
	case n == 512 && string(b[257:262]) == "ustar":
		return nil
	case n == 512 && bytes.Count(b[:], []byte{0}) == 512:
		return nil // an empty archive
	}
	return badRequest("the context part is not a tar archive (plain or gzip-compressed)")
}

// dockerfileInContext reads the Dockerfile name (a path relative to the
// context's root) from the context tar at p.
func dockerfileInContext(p, name string) ([]byte, error) {
	clean := path.Clean(strings.TrimPrefix(name, "./"))
	if path.IsAbs(name) || clean == "." || clean == ".." || strings.HasPrefix(clean, "../") {
		return nil, badRequest("dockerfile_path %q must be a path inside the context, such as docker/Dockerfile", name)
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("read build context: %w", err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var rd io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, badRequest("the context part is not a valid gzip stream: %v", err)
		}
		defer zr.Close()
		rd = zr
	}
	tr := tar.NewReader(rd)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, badRequest("the context part is not a valid tar archive: %v", err)
		}
		if path.Clean(strings.TrimPrefix(h.Name, "/")) != clean {
			continue
		}
		if h.Typeflag != tar.TypeReg {
			return nil, badRequest("%s in the context is not a regular file", clean)
		}
		if h.Size > MaxDockerfileBytes {
			return nil, badRequest("the Dockerfile is larger than %d bytes", MaxDockerfileBytes)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, badRequest("the context part is not a valid tar archive: %v", err)
		}
		return b, nil
	}
	return nil, badRequest("no Dockerfile: the context has no %s; send a dockerfile part, or name the file with dockerfile_path", clean)
}
