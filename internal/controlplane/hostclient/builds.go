package hostclient

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

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
	"github.com/pandastack/pandastack/internal/contract/templates"
)

// Builds is the agent's template builds as a builds.Builder
// (Client.Builds), over the endpoints hostwire lists.
type Builds struct{ c *Client }

// Builds returns the agent's template builds; an agent that has none
// answers every call with errors.ErrUnsupported.
func (c *Client) Builds() Builds { return Builds{c: c} }

var (
	_ builds.Builder  = Builds{}
	_ builds.Canceler = Builds{}
)

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

// Cancel cancels build id (builds.Canceler).
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
