package hostapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"os"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
	"github.com/pandastack/pandastack/internal/contract/templates"
)

// Builds is the agent's template builds as a tmplbuild.Builder
// (Client.Builds).
type Builds struct{ c *Client }

// Builds returns the agent's template builds; an agent that has none
// answers every call with errors.ErrUnsupported.
func (c *Client) Builds() Builds { return Builds{c: c} }

var (
	_ builds.Builder  = Builds{}
	_ builds.Canceler = Builds{}
)

// ServeBuilds makes the agent's API serve template builds with b, which
// receives each build's context as a file in contextDir (b removes it,
// see tmplbuild.Spec.ContextTar). Call it before serving.
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

// Start sends spec and its context file (which it removes, sent or not,
// as a Manager's Start would) to the agent.
func (b Builds) Start(ctx context.Context, spec builds.Spec) (builds.Status, error) {
	if spec.ContextTar != "" {
		defer os.Remove(spec.ContextTar)
	}
	ws, err := json.Marshal(hostwire.BuildSpecOf(spec))
	if err != nil {
		return builds.Status{}, err
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() { pw.CloseWithError(writeBuildRequest(mw, ws, spec.ContextTar)) }()
	req, err := b.c.request(ctx, http.MethodPost, "/template-builds", nil, pr)
	if err != nil {
		pr.Close()
		return builds.Status{}, err
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	res, err := b.c.do(req)
	pr.Close() // ends the writer if the agent answered before reading it all
	if err != nil {
		return builds.Status{}, err
	}
	defer res.Body.Close()
	var st hostwire.BuildStatus
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil {
		return builds.Status{}, b.c.transportError(ctx, fmt.Errorf("decode build status: %w", err))
	}
	return st.Contract(), nil
}

// writeBuildRequest writes the parts of a build request: the spec, then
// the file at contextTar if there is one.
func writeBuildRequest(mw *multipart.Writer, spec []byte, contextTar string) error {
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="spec"`)
	h.Set("Content-Type", "application/json")
	p, err := mw.CreatePart(h)
	if err == nil {
		_, err = p.Write(spec)
	}
	if err == nil && contextTar != "" {
		var f *os.File
		if f, err = os.Open(contextTar); err == nil {
			defer f.Close()
			h := textproto.MIMEHeader{}
			h.Set("Content-Disposition", `form-data; name="context"; filename="context.tar"`)
			h.Set("Content-Type", "application/octet-stream")
			if p, err = mw.CreatePart(h); err == nil {
				_, err = io.Copy(p, f)
			}
		}
	}
	if err != nil {
		return err
	}
	return mw.Close()
}

// Get returns build id's status.
func (b Builds) Get(ctx context.Context, id string) (builds.Status, error) {
	var st hostwire.BuildStatus
	err := b.c.callShort(ctx, http.MethodGet, "/template-builds/"+url.PathEscape(id), nil, nil, &st)
	return st.Contract(), err
}

// Cancel cancels build id (tmplbuild.Canceler).
func (b Builds) Cancel(ctx context.Context, id, why string) (builds.Status, error) {
	var st hostwire.BuildStatus
	err := b.c.callShort(ctx, http.MethodPost, "/template-builds/"+url.PathEscape(id)+"/cancel", nil, map[string]string{"why": why}, &st)
	return st.Contract(), err
}

// List returns the builds the agent remembers, newest first.
func (b Builds) List(ctx context.Context) ([]builds.Status, error) {
	var out struct {
		Builds []hostwire.BuildStatus `json:"builds"`
	}
	if err := b.c.callShort(ctx, http.MethodGet, "/template-builds", nil, nil, &out); err != nil {
		return nil, err
	}
	list := make([]builds.Status, len(out.Builds))
	for i, b := range out.Builds {
		list[i] = b.Contract()
	}
	return list, nil
}

// Follow calls line for each of build id's lines until it ends, and
// returns its final status.
func (b Builds) Follow(ctx context.Context, id string, line func(string)) (builds.Status, error) {
	req, err := b.c.request(ctx, http.MethodGet, "/template-builds/"+url.PathEscape(id)+"/log", nil, nil)
	if err != nil {
		return builds.Status{}, err
	}
	res, err := b.c.do(req)
	if err != nil {
		return builds.Status{}, err
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var ev hostwire.BuildLogEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return builds.Status{}, b.c.transportError(ctx, fmt.Errorf("build log stream: %w", err))
		}
		switch {
		case ev.Line != nil:
			line(*ev.Line)
		case ev.Status != nil:
			return ev.Status.Contract(), nil
		case ev.Error != nil:
			return builds.Status{}, ev.Error.Err()
		}
	}
	return builds.Status{}, b.c.transportError(ctx, errors.New("build log stream ended before the build"))
}

// Remove removes user template "NAME" (every version) or "NAME:N".
func (b Builds) Remove(ctx context.Context, ref string) error {
	return b.c.callShort(ctx, http.MethodDelete, "/user-templates/"+url.PathEscape(ref), nil, nil, nil)
}

// SetPublished publishes or withdraws versions of user template ref
// ("NAME" or "NAME:N").
func (b Builds) SetPublished(ctx context.Context, ref string, published bool) error {
	return b.c.callShort(ctx, http.MethodPut, "/user-templates/"+url.PathEscape(ref)+"/public", nil, map[string]bool{"public": published}, nil)
}

// UserTemplate returns user template ref ("NAME": its latest version).
func (b Builds) UserTemplate(ctx context.Context, ref string) (templates.UserRootFS, error) {
	var u hostwire.UserTemplate
	err := b.c.callShort(ctx, http.MethodGet, "/user-templates/"+url.PathEscape(ref), nil, nil, &u)
	return u.Contract(), err
}

// UserTemplates lists the latest version of every user template.
func (b Builds) UserTemplates(ctx context.Context) ([]templates.UserRootFS, error) {
	var out struct {
		Templates []hostwire.UserTemplate `json:"templates"`
	}
	err := b.c.callShort(ctx, http.MethodGet, "/user-templates", nil, nil, &out)
	return users(out.Templates), err
}

// Versions lists the versions of user template name, oldest first.
func (b Builds) Versions(ctx context.Context, name string) ([]templates.UserRootFS, error) {
	var out struct {
		Versions []hostwire.UserTemplate `json:"versions"`
	}
	err := b.c.callShort(ctx, http.MethodGet, "/user-templates/"+url.PathEscape(name)+"/versions", nil, nil, &out)
	return users(out.Versions), err
}

func users(us []hostwire.UserTemplate) []templates.UserRootFS {
	out := make([]templates.UserRootFS, len(us))
	for i, u := range us {
		out[i] = u.Contract()
	}
	return out
}
