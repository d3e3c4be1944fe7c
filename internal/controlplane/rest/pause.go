package rest

import (
	"context"
	"net/http"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
)

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	s.lifecycleOp(w, r, &struct{}{}, s.cp.Pause)
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Placement scheduler.Placement `json:"placement"`
	}
	s.lifecycleOp(w, r, &req, func(ctx context.Context, id string) (catalog.Sandbox, error) {
		return s.cp.ResumeOn(ctx, id, req.Placement)
	})
}

// lifecycleOp serves pause and resume (run: controlplane.Plane's): the sandbox
// must be in the state the operation starts from (or already in the
// operation: the request joins it), the operation runs detached, and the
// answer is the sandbox as it left it. A client that goes away does not
// cancel it; GET tells how it ended (state, last_error).
// The request's body (optional) is decoded into body first.
func (s *Server) lifecycleOp(w http.ResponseWriter, r *http.Request, body any, run func(ctx context.Context, id string) (catalog.Sandbox, error)) {
	if err := decodeJSON(r, body, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.owned(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err = run(r.Context(), sb.ID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.withMemory(r.Context(), sb))
}
