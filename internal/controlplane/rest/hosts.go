package rest

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// Fleet is the registry of the hosts that joined this server (package
// fleet; `panda server` with hosts registering). Its errors: ErrJoinToken,
// ErrHostToken, ErrInvalid as the Fleet's classes say.
type Fleet interface {
	controlplane.Registry
	// CheckJoinToken refuses a wrong join token.
	CheckJoinToken(token string) error
	Register(ctx context.Context, reg host.Registration) (catalog.Host, error)
	Heartbeat(ctx context.Context, id, agentToken string, load host.Load) error
	SetDraining(ctx context.Context, id string, draining bool) (catalog.Host, error)
}

// fleetHostJSON is a host of a fleet in GET /v1/hosts.
type fleetHostJSON struct {
	hostJSON
	URL          string    `json:"url,omitempty"`
	Draining     bool      `json:"draining"`
	Static       bool      `json:"static"`
	DiskMiB      int64     `json:"disk_mib"`
	DiskFreeMiB  int64     `json:"disk_free_mib"`
	RegisteredAt time.Time `json:"registered_at,omitzero"`
	HeartbeatAt  time.Time `json:"heartbeat_at,omitzero"`
}

// joinToken checks the join token of a host agent's request.
func (s *Server) joinToken(r *http.Request) error {
	if s.cfg.Fleet == nil {
		return errorf(controlplane.NotImplemented, "this server takes no hosts: run panda server with hosts joining (docs/deployment.md)")
	}
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if err := s.cfg.Fleet.CheckJoinToken(strings.TrimSpace(tok)); err != nil {
		return errorf(controlplane.Unauthorized, "missing or wrong join token (panda server writes it to DATA_DIR/join.token)")
	}
	return nil
}

// registerHost is POST /v1/fleet/join: a host agent joins.
func (s *Server) registerHost(w http.ResponseWriter, r *http.Request) {
	if err := s.joinToken(r); err != nil {
		s.writeError(w, r, err)
		return
	}
	var reg host.Registration
	if err := decodeJSON(r, &reg, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	rec, err := s.cfg.Fleet.Register(r.Context(), reg)
	if err != nil {
		s.writeError(w, r, s.cfg.Fleet.Classify(err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": rec.ID, "state": rec.State, "draining": rec.Draining})
}

// heartbeatHost is POST /v1/fleet/hosts/{id}/heartbeat.
func (s *Server) heartbeatHost(w http.ResponseWriter, r *http.Request) {
	if err := s.joinToken(r); err != nil {
		s.writeError(w, r, err)
		return
	}
	var req struct {
		Token string    `json:"token"`
		Load  host.Load `json:"load"`
	}
	if err := decodeJSON(r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.cfg.Fleet.Heartbeat(r.Context(), chi.URLParam(r, "id"), req.Token, req.Load); err != nil {
		s.writeError(w, r, s.cfg.Fleet.Classify(err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// drainHost is POST /v1/hosts/{id}/drain[?migrate=true] (admin): no new
// placements on the host; with migrate, its running sandboxes move to
// other hosts (paused through the object store, resumed elsewhere).
func (s *Server) drainHost(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Fleet == nil {
		s.writeError(w, r, errorf(controlplane.NotImplemented, "this server has one host: nothing to drain to"))
		return
	}
	id := chi.URLParam(r, "id")
	migrate := r.URL.Query().Get("migrate")
	if migrate != "" && migrate != "true" && migrate != "false" {
		s.writeError(w, r, invalid("migrate must be true or false"))
		return
	}
	rec, err := s.cfg.Fleet.SetDraining(r.Context(), id, true)
	if err != nil {
		s.writeError(w, r, s.cfg.Fleet.Classify(err))
		return
	}
	out := map[string]any{"id": rec.ID, "state": rec.State, "draining": rec.Draining}
	if migrate == "true" {
		moved, failed := s.cp.Migrate(r.Context(), id)
		out["migrated"], out["failed"] = moved, failed
	}
	writeJSON(w, http.StatusOK, out)
}

// activateHost is POST /v1/hosts/{id}/activate (admin): ends a drain.
func (s *Server) activateHost(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Fleet == nil {
		s.writeError(w, r, errorf(controlplane.NotImplemented, "this server has one host, which is always active"))
		return
	}
	rec, err := s.cfg.Fleet.SetDraining(r.Context(), chi.URLParam(r, "id"), false)
	if err != nil {
		s.writeError(w, r, s.cfg.Fleet.Classify(err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": rec.ID, "state": rec.State, "draining": rec.Draining})
}

// forgetHost is DELETE /v1/hosts/{id} (admin): the host leaves the fleet
// (controlplane.Plane.ForgetHost).
func (s *Server) forgetHost(w http.ResponseWriter, r *http.Request) {
	if err := s.cp.ForgetHost(r.Context(), chi.URLParam(r, "id")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type hostJSON struct {
	ID                 string  `json:"id"`
	State              string  `json:"state"`
	Accel              string  `json:"accel"`
	Sandboxes          int     `json:"sandboxes"`
	VCPUs              int     `json:"vcpus"`
	MemoryMiB          int     `json:"memory_mib"`
	MemoryAvailableMiB int     `json:"memory_available_mib"`
	MemoryAllocatedMiB int     `json:"memory_allocated_mib"`
	SandboxesPSSMiB    float64 `json:"sandboxes_pss_mib"`
	SandboxesPrivMiB   float64 `json:"sandboxes_private_mib"`
	// NetworkOff: the host runs without sandbox networking (--network
	// off); unknown while a host of a fleet is not connected.
	NetworkOff bool `json:"network_off,omitempty"`
	// Templates are the templates whose memory image the host holds, those
	// the key may see (visibleTemplates).
	Templates []string `json:"templates"`
}

// listHosts describes the hosts as the key may see them
// (controlplane.Plane.Hosts): those of a fleet with their registration,
// or the one host.
func (s *Server) listHosts(w http.ResponseWriter, r *http.Request) {
	views, err := s.cp.Hosts(r.Context(), callerOf(r).Key)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]any, 0, len(views))
	for _, v := range views {
		if !v.Member {
			out = append(out, toHostJSON(v))
			continue
		}
		out = append(out, fleetHostJSON{hostJSON: toHostJSON(v), URL: v.URL, Draining: v.Draining, Static: v.Static,
			DiskMiB: v.DiskMiB, DiskFreeMiB: v.DiskFreeMiB, RegisteredAt: v.RegisteredAt, HeartbeatAt: v.HeartbeatAt})
	}
	writeJSON(w, http.StatusOK, map[string]any{"hosts": out})
}

func toHostJSON(v controlplane.HostView) hostJSON {
	return hostJSON{ID: v.ID, State: v.State, Accel: v.Accel, Sandboxes: v.Sandboxes, VCPUs: v.VCPUs, MemoryMiB: v.MemoryMiB,
		MemoryAvailableMiB: v.MemoryAvailableMiB, MemoryAllocatedMiB: v.MemoryAllocatedMiB,
		SandboxesPSSMiB: mib(v.SandboxesPSSBytes), SandboxesPrivMiB: mib(v.SandboxesPrivateBytes),
		NetworkOff: v.NetworkOff, Templates: v.Templates}
}
