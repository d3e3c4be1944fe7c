package rest

// Admission of template builds (POST /v1/templates), before their bodies
// are read. A Dockerfile build's context may be GiBs that the server
// writes to its disk, so everything that can refuse a build is checked
// before it is received:
//
//  1. before any of the body (admitBuild): the key's builds — queued or
//     running, plus its build requests being received — are fewer than
//     controlplane.Config.MaxTemplateBuildsPerKey (429
//     too_many_requests), and a multipart body fits in the context
//     directory's free space (507);
//  2. once the spec part is read, before the context part
//     (controlplane.Plane.CheckBuildName): the name's syntax (422), its
//     owner (another key's name: 409), the key's templates for a new name
//     (429 template_limit) and the template's versions for a rebuild (429
//     template_limit);
//  3. while the context is received: its size (413) and the disk's free
//     space (507), and the key's revocation (401: the upload ends).
//
// Who may build what, and the bounds, are the Plane's rules
// (controlplane/builds.go); what is here is about request bodies. The
// builder checks 2 again, and the key's builds, when the build starts
// (Plane.ClaimBuild fills in builds.Spec's MaxTemplates, MaxBuilds,
// MaxVersions): what it says wins. Admin keys have no bound on builds,
// templates or versions.

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
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
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
func (s *Server) admitBuild(ctx context.Context, key catalog.Key) (context.Context, func(), error) {
	g := &s.buildGate
	g.mu.Lock()
	defer g.mu.Unlock()
	if max := s.cp.Config().MaxTemplateBuildsPerKey; !key.Admin && max > 0 {
		n := len(g.inflight[key.ID])
		if n < max {
			active, err := s.cp.ActiveBuilds(ctx, key.ID)
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
