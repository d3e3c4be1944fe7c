package hostapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
)

// ServeBuilds makes the agent's API serve template builds with b, which
// receives each build's context as a file in contextDir (b removes it,
// see builds.Spec.ContextTar). Call it before serving.
func (s *Server) ServeBuilds(b builds.Builder, contextDir string) {
	s.builds, s.contextDir = b, contextDir
}

var errNoBuilds = fmt.Errorf("%w: this host agent does not build templates", errors.ErrUnsupported)

// buildRoutes are the endpoints above but the log's (authenticated and
// tracked by the caller).
func (s *Server) buildRoutes(r chi.Router) {
	r.Post(hostwire.Prefix+"/template-builds", s.json(s.startBuild))
	r.Get(hostwire.Prefix+"/template-builds", s.buildsJSON(func(r *http.Request, b builds.Builder) (any, error) {
		list, err := b.List(r.Context())
		out := make([]hostwire.BuildStatus, len(list))
		for i, st := range list {
			out[i] = hostwire.BuildStatusOf(st)
		}
		return map[string]any{"builds": out}, err
	}))
	r.Get(hostwire.Prefix+"/template-builds/{buildID}", s.buildsJSON(func(r *http.Request, b builds.Builder) (any, error) {
		st, err := b.Get(r.Context(), chi.URLParam(r, "buildID"))
		return hostwire.BuildStatusOf(st), err
	}))
	r.Post(hostwire.Prefix+"/template-builds/{buildID}/cancel", s.buildsJSON(func(r *http.Request, b builds.Builder) (any, error) {
		c, ok := b.(builds.Canceler)
		if !ok {
			return nil, fmt.Errorf("%w: this host agent cannot cancel template builds", errors.ErrUnsupported)
		}
		var req struct {
			Why string `json:"why"`
		}
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		st, err := c.Cancel(r.Context(), chi.URLParam(r, "buildID"), req.Why)
		return hostwire.BuildStatusOf(st), err
	}))
	r.Get(hostwire.Prefix+"/user-templates", s.buildsJSON(func(r *http.Request, b builds.Builder) (any, error) {
		us, err := b.UserTemplates(r.Context())
		return map[string]any{"templates": hostwire.UserTemplatesOf(us)}, err
	}))
	r.Get(hostwire.Prefix+"/user-templates/{ref}", s.buildsJSON(func(r *http.Request, b builds.Builder) (any, error) {
		u, err := b.UserTemplate(r.Context(), chi.URLParam(r, "ref"))
		return hostwire.UserTemplateOf(u), err
	}))
	r.Get(hostwire.Prefix+"/user-templates/{name}/versions", s.buildsJSON(func(r *http.Request, b builds.Builder) (any, error) {
		vs, err := b.Versions(r.Context(), chi.URLParam(r, "name"))
		return map[string]any{"versions": hostwire.UserTemplatesOf(vs)}, err
	}))
	r.Delete(hostwire.Prefix+"/user-templates/{ref}", s.buildsJSON(func(r *http.Request, b builds.Builder) (any, error) {
		return nil, b.Remove(r.Context(), chi.URLParam(r, "ref"))
	}))
	r.Put(hostwire.Prefix+"/user-templates/{ref}/public", s.buildsJSON(func(r *http.Request, b builds.Builder) (any, error) {
		var req struct {
			Public bool `json:"public"`
		}
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return nil, b.SetPublished(r.Context(), chi.URLParam(r, "ref"), req.Public)
	}))
}

// buildsJSON is json for an operation on the agent's builds.
func (s *Server) buildsJSON(fn func(r *http.Request, b builds.Builder) (any, error)) http.HandlerFunc {
	return s.json(func(r *http.Request) (any, error) {
		if s.builds == nil {
			return nil, errNoBuilds
		}
		return fn(r, s.builds)
	})
}

// startBuild reads the spec, then the context into a file of contextDir,
// and starts the build, which owns the file from then on.
func (s *Server) startBuild(r *http.Request) (any, error) {
	if s.builds == nil {
		return nil, errNoBuilds
	}
	mr, err := r.MultipartReader()
	if err != nil {
		return nil, fmt.Errorf("%w: a build is a multipart request: %v", host.ErrInvalid, err)
	}
	part, err := mr.NextPart()
	if err != nil || part.FormName() != "spec" {
		return nil, fmt.Errorf("%w: a build request starts with its spec", host.ErrInvalid)
	}
	var ws hostwire.BuildSpec
	dec := json.NewDecoder(io.LimitReader(part, 8<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ws); err != nil {
		return nil, fmt.Errorf("%w: malformed build spec: %v", host.ErrInvalid, err)
	}
	spec := ws.Contract()
	part, err = mr.NextPart()
	switch {
	case err == io.EOF:
	case err != nil:
		return nil, fmt.Errorf("%w: read the build context: %v", host.ErrInvalid, err)
	case part.FormName() != "context":
		return nil, fmt.Errorf("%w: unexpected part %q in a build request", host.ErrInvalid, part.FormName())
	default:
		if spec.ContextTar, err = receiveContext(part, s.contextDir); err != nil {
			return nil, err
		}
	}
	st, err := s.builds.Start(r.Context(), spec) // removes ContextTar whatever the error
	return hostwire.BuildStatusOf(st), err
}

// receiveContext copies a build context into a new file of dir.
func receiveContext(r io.Reader, dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("build context: %w", err)
	}
	f, err := os.CreateTemp(dir, "context-*.tar")
	if err != nil {
		return "", fmt.Errorf("build context: %w", err)
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("%w: receive the build context: %v", host.ErrUnavailable, err)
	}
	return f.Name(), nil
}

// buildLog streams a build's lines until it ends (see the list above).
func (s *Server) buildLog(w http.ResponseWriter, r *http.Request) {
	if s.builds == nil {
		writeError(w, errNoBuilds)
		return
	}
	id := chi.URLParam(r, "buildID")
	if _, err := s.builds.Get(r.Context(), id); err != nil {
		writeError(w, err)
		return
	}
	out := newNDJSON(w)
	st, err := s.builds.Follow(r.Context(), id, func(line string) { out.send(hostwire.BuildLogEvent{Line: &line}) })
	if err != nil {
		_, we := hostwire.EncodeError(err)
		out.send(hostwire.BuildLogEvent{Error: &we})
		return
	}
	ws := hostwire.BuildStatusOf(st)
	out.send(hostwire.BuildLogEvent{Status: &ws})
}
