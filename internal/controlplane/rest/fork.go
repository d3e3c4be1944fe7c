package rest

import (
	"net/http"

	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
)

type forkChildJSON struct {
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
	Error   *errorDetail `json:"error,omitempty"`
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Count      *int                `json:"count"`
		Placement  scheduler.Placement `json:"placement"`
		VolumeMode string              `json:"volume_mode"`
	}
	if err := decodeJSON(r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	if count < 1 || count > controlplane.MaxForkCount {
		s.writeError(w, r, invalid("count must be between 1 and %d", controlplane.MaxForkCount))
		return
	}
	parent, err := s.running(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	res, err := s.cp.Fork(r.Context(), callerOf(r).Key, parent, count, req.Placement, req.VolumeMode)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]forkChildJSON, len(res.Children))
	for i, c := range res.Children {
		if c.Err != nil {
			ae := classify(c.Err)
			out[i].Error = &errorDetail{Code: ae.Code, Message: ae.Message}
			continue
		}
		j := s.toJSON(*c.Sandbox)
		out[i].Sandbox = &j
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"children":                  out,
		"parent_paused_ms":          res.ParentPausedMS,
		"dirty_bytes":               res.DirtyBytes,
		"cross_host_capture_bytes":  res.CrossHostCaptureBytes,
		"cross_host_direct_bytes":   res.CrossHostDirectBytes,
		"cross_host_uploaded_bytes": res.CrossHostUploadedBytes,
		"cross_host_fetched_bytes":  res.CrossHostFetchedBytes,
		"cross_host_pulled_bytes":   res.CrossHostPulledBytes,
	})
}
