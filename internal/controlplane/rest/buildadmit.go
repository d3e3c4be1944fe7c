package rest

// Admission of template builds (POST /v1/templates), before their bodies
// are read. A Dockerfile build's context may be GiBs that the server
// writes to its disk, so everything that can refuse a build is checked
// before it is received:
//
//  1. before any of the body (admitBuild): the key's builds — queued or
//     running, plus its build requests being received — are fewer than
//     Config.MaxTemplateBuildsPerKey (429 too_many_requests), and a
//     multipart body fits in the context directory's free space (507);
//  2. once the spec part is read, before the context part
//     (checkBuildName): the name's syntax (422), its owner (another key's
//     name: 409), the key's templates for a new name (429 template_limit)
//     and the template's versions for a rebuild (429 template_limit);
//  3. while the context is received: its size (413) and the disk's free
//     space (507), and the key's revocation (401: the upload ends).
//
// The builder checks 2 again, and the key's builds, when the build starts
// (tmplbuild.Spec's MaxTemplates, MaxBuilds, MaxVersions): what it says
// wins. Admin keys have no bound on builds, templates or versions.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"syscall"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// Defaults of Config.MaxTemplateBuildsPerKey and MaxTemplateVersions.
const (
	DefaultMaxTemplateBuildsPerKey = 2
	DefaultMaxTemplateVersions     = 10
)

// buildGate holds the build requests being received, by key: they count
// against the key's builds, and a revocation ends them.
type buildGate struct {
	// mu is held across an admission, List included: a request admitted
	// meanwhile, or one whose build starts meanwhile, is counted once,
	// either as a request or as a build.
	mu       sync.Mutex
	inflight map[string][]*admission
}

// admission is a build request being received.
type admission struct{ cancel context.CancelCauseFunc }

// errKeyRevoked ends the build requests of a key being revoked.
var errKeyRevoked = errorf(controlplane.Unauthorized, "unknown or revoked API key")

// admitBuild admits a build request of key (step 1 above) and returns
// the context its reading and its Start run in (canceled if key is
// revoked meanwhile) and done, to call once Start has returned.
func (s *Server) admitBuild(ctx context.Context, b TemplateBuilds, key catalog.Key) (context.Context, func(), error) {
	g := &s.buildGate
	g.mu.Lock()
	defer g.mu.Unlock()
	if max := s.cfg.MaxTemplateBuildsPerKey; !key.Admin && max > 0 {
		n := len(g.inflight[key.ID])
		if n < max {
			active, err := keyBuilds(ctx, b, key.ID)
			if err != nil {
				return nil, nil, err
			}
			n += len(active)
		}
		if n >= max {
			return nil, nil, tooMany("this API key has %d template builds queued, running or being uploaded, the most allowed at once; wait for one to end", max)
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	if g.inflight == nil {
		g.inflight = map[string][]*admission{}
	}
	a := &admission{cancel: cancel}
	g.inflight[key.ID] = append(g.inflight[key.ID], a)
	return ctx, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		list := slices.DeleteFunc(g.inflight[key.ID], func(x *admission) bool { return x == a })
		if len(list) == 0 {
			delete(g.inflight, key.ID)
		} else {
			g.inflight[key.ID] = list
		}
		cancel(nil)
	}, nil
}

// keyBuilds returns the builds of key keyID that have not ended.
func keyBuilds(ctx context.Context, b TemplateBuilds, keyID string) ([]builds.Status, error) {
	list, err := b.List(ctx)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(list, func(st builds.Status) bool { return st.Owner != keyID || st.Done() }), nil
}

// endBuildRequests ends the build requests of key keyID being received
// (it is being revoked).
func (s *Server) endBuildRequests(keyID string) {
	g := &s.buildGate
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, a := range g.inflight[keyID] {
		a.cancel(errKeyRevoked)
	}
}

// checkContextSpace refuses a build request with a context when the
// context directory's disk keeps less than tmplbuild.MinFreeBytes free
// besides the request's declared length (507).
func (s *Server) checkContextSpace(r *http.Request) error {
	return builds.CheckFree(s.contextDir(), builds.MinFreeBytes, max(r.ContentLength, 0))
}

// contextDir is where build contexts are received.
func (s *Server) contextDir() string {
	if s.cfg.TemplateContextDir != "" {
		return s.cfg.TemplateContextDir
	}
	return os.TempDir()
}

// checkBuildName checks a build of template name by key before its
// context is received (step 2 above).
func (s *Server) checkBuildName(ctx context.Context, b TemplateBuilds, key catalog.Key, name string) error {
	if n, v, err := templates.SplitRef(name); err != nil || v != 0 || n != name {
		return invalid("template name %q must be 1-32 lowercase letters, digits, - or _", name)
	}
	if slices.Contains(templates.Reserved, name) {
		return invalid("%q is a built-in template; pick another name", name)
	}
	if name == templates.NotAName {
		return invalid("%q names the API's list of builds (/v1/templates/builds); pick another name", name)
	}
	u, err := b.UserTemplate(ctx, name)
	if err != nil && !errors.Is(err, templates.ErrNotFound) {
		return err
	}
	exists := err == nil
	if exists && !key.Admin && (u.Owner == "" || u.Owner != key.ID) {
		return conflict("the template name %s is taken; pick another", name)
	}
	if key.Admin {
		return nil
	}
	max := s.cfg.MaxTemplatesPerKey
	if exists {
		max = s.cfg.MaxTemplateVersions
	}
	if max <= 0 {
		return nil
	}
	active, err := keyBuilds(ctx, b, key.ID)
	if err != nil {
		return err
	}
	if exists {
		vs, err := b.Versions(ctx, name)
		if err != nil {
			return err
		}
		n := len(vs)
		for _, st := range active {
			if st.Name == name {
				n++
			}
		}
		if n >= max {
			return builds.VersionLimit(name, n)
		}
		return nil
	}
	owned := map[string]bool{}
	us, err := b.UserTemplates(ctx)
	if err != nil {
		return err
	}
	for _, u := range us {
		if u.Owner == key.ID {
			owned[u.Name] = true
		}
	}
	for _, st := range active {
		owned[st.Name] = true
	}
	if len(owned) >= max {
		return fmt.Errorf("%w: this key has %d templates, its limit; delete one first", builds.ErrLimit, len(owned))
	}
	return nil
}

// ctxBody is a request body whose reads fail once ctx ends, with ctx's
// cause (a revoked key: errKeyRevoked).
type ctxBody struct {
	ctx context.Context
	io.ReadCloser
}

func (b ctxBody) Read(p []byte) (int, error) {
	if b.ctx.Err() != nil {
		return 0, context.Cause(b.ctx)
	}
	return b.ReadCloser.Read(p)
}

// spaceWriter writes to w, and fails once the disk of dir keeps less than
// tmplbuild.MinFreeBytes free (checked every spaceCheckEvery bytes).
type spaceWriter struct {
	w       io.Writer
	dir     string
	written int64
}

const spaceCheckEvery = 64 << 20

func (sw *spaceWriter) Write(p []byte) (int, error) {
	if sw.written/spaceCheckEvery != (sw.written+int64(len(p)))/spaceCheckEvery {
		if err := builds.CheckFree(sw.dir, builds.MinFreeBytes, 0); err != nil {
			return 0, err
		}
	}
	n, err := sw.w.Write(p)
	sw.written += int64(n)
	if errors.Is(err, syscall.ENOSPC) {
		err = fmt.Errorf("%w: the server's disk is full", builds.ErrNoSpace)
	}
	return n, err
}
