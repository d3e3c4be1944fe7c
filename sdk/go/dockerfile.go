package pandastack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
)

// WithBuildArg sets the Dockerfile's ARG key to value (Dockerfile builds
// only; repeatable, the last value of a key wins).
func WithBuildArg(key, value string) BuildOption {
	return func(r *buildRequest) {
		if r.BuildArgs == nil {
			r.BuildArgs = map[string]string{}
		}
		r.BuildArgs[key] = value
	}
}

// WithDockerfilePath names the Dockerfile inside the build context (a
// path relative to its root, such as "docker/Dockerfile.prod"), for a
// Dockerfile build given no Dockerfile text. Default: "Dockerfile".
func WithDockerfilePath(p string) BuildOption {
	return func(r *buildRequest) { r.DockerfilePath = p }
}

// WithContextProgress calls progress as the build context is sent: after
// each file tarred, with the counts so far (the last call has the
// totals).
func WithContextProgress(progress func(ContextStats)) BuildOption {
	return func(r *buildRequest) { r.contextProgress = progress }
}

// StartDockerfileBuild starts building template name from a Dockerfile
// and returns the build, queued. dockerfile is the Dockerfile's text; ""
// to use the one in the context (WithDockerfilePath, default
// "Dockerfile" at its root). contextDir is the build context, a directory
// sent as a gzip-compressed tar archive streamed from disk (see
// WriteContextTar: .dockerignore applies, symlinks are not followed); ""
// for none (the Dockerfile then cannot COPY local files). opts may set
// build arguments (WithBuildArg) and the template's start and ready
// commands. A server that does not run Dockerfile builds answers an
// *Error with Code "not_implemented" (HTTP 501). Any key (the template is its own, private until an admin key publishes it).
func (c *Client) StartDockerfileBuild(ctx context.Context, name, dockerfile, contextDir string, opts ...BuildOption) (TemplateBuild, error) {
	in := &buildRequest{Name: name}
	for _, o := range opts {
		o(in)
	}
	if contextDir == "" {
		if dockerfile == "" {
			return TemplateBuild{}, newError(0, CodeInvalid, "a Dockerfile build needs the Dockerfile's text or a context directory holding it")
		}
		if in.DockerfilePath != "" {
			return TemplateBuild{}, newError(0, CodeInvalid, "WithDockerfilePath names a file of the context, and there is no context directory")
		}
		in.Dockerfile = &dockerfile
		var out TemplateBuild
		err := c.doJSON(ctx, http.MethodPost, path("templates"), nil, in.body(), &out)
		return out, err
	}
	if err := checkContextDir(contextDir); err != nil {
		return TemplateBuild{}, err
	}
	spec, err := json.Marshal(in.body())
	if err != nil {
		return TemplateBuild{}, fmt.Errorf("encode request: %w", err)
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	werr := make(chan error, 1)
	go func() {
		err := writeBuildParts(mw, spec, dockerfile, contextDir, in.contextProgress)
		pw.CloseWithError(err)
		werr <- err
	}()
	req, err := c.newRequest(ctx, http.MethodPost, path("templates"), nil, pr, mw.FormDataContentType())
	if err != nil {
		pr.CloseWithError(err)
		<-werr
		return TemplateBuild{}, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.send(req)
	// The server may answer before reading the whole body (a refusal):
	// the writer is then told to stop.
	pr.CloseWithError(errAnswered)
	wErr := <-werr
	if err != nil {
		var apiErr *Error
		if !errors.As(err, &apiErr) && wErr != nil && !errors.Is(wErr, errAnswered) {
			return TemplateBuild{}, fmt.Errorf("send build context: %w", wErr)
		}
		return TemplateBuild{}, err
	}
	defer resp.Body.Close()
	var out TemplateBuild
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return TemplateBuild{}, fmt.Errorf("decode answer of POST /v1/templates: %w", err)
	}
	return out, nil
}

var errAnswered = errors.New("the server answered")

// writeBuildParts writes the parts of a multipart build request: spec,
// dockerfile (if not ""), context.
func writeBuildParts(mw *multipart.Writer, spec []byte, dockerfile, contextDir string, progress func(ContextStats)) error {
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="spec"`)
	h.Set("Content-Type", "application/json")
	w, err := mw.CreatePart(h)
	if err != nil {
		return err
	}
	if _, err := w.Write(spec); err != nil {
		return err
	}
	if dockerfile != "" {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="dockerfile"; filename="Dockerfile"`)
		h.Set("Content-Type", "text/plain; charset=utf-8")
		if w, err = mw.CreatePart(h); err != nil {
			return err
		}
		if _, err := io.WriteString(w, dockerfile); err != nil {
			return err
		}
	}
	h = textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="context"; filename="context.tar.gz"`)
	h.Set("Content-Type", "application/gzip")
	if w, err = mw.CreatePart(h); err != nil {
		return err
	}
	if _, err := WriteContextTar(w, contextDir, progress); err != nil {
		return err
	}
	return mw.Close()
}

// BuildTemplateFromDockerfile builds template name from a Dockerfile
// (StartDockerfileBuild says what dockerfile, contextDir and opts are),
// calling progress (if not nil) with each progress line, and returns once
// it is built. A failed build is an *Error whose Code is the build's.
// Any key.
func (c *Client) BuildTemplateFromDockerfile(ctx context.Context, name, dockerfile, contextDir string, progress func(string), opts ...BuildOption) (TemplateBuild, error) {
	b, err := c.StartDockerfileBuild(ctx, name, dockerfile, contextDir, opts...)
	if err != nil {
		return b, err
	}
	return c.followToEnd(ctx, b, progress)
}

// followToEnd follows build b to its end: an *Error if it failed.
func (c *Client) followToEnd(ctx context.Context, b TemplateBuild, progress func(string)) (TemplateBuild, error) {
	b, err := c.FollowTemplateBuild(ctx, b.ID, progress)
	if err != nil {
		return b, err
	}
	if b.Status != BuildSucceeded {
		return b, newError(0, b.Code, b.Error)
	}
	return b, nil
}
