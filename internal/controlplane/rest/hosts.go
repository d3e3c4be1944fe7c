package rest

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// Fleet is the registry of the hosts that joined this server (package
// fleet; `panda server` with hosts registering). Its errors: ErrJoinToken,
// ErrHostToken, ErrInvalid as the Fleet's classes say.
type Fleet interface {
	controlplane.Fleet
	// CheckJoinToken refuses a wrong join token.
	CheckJoinToken(token string) error
	Register(ctx context.Context, reg host.Registration) (catalog.Host, error)
	Heartbeat(ctx context.Context, id, agentToken string, load host.Load) error
	SetDraining(ctx context.Context, id string, draining bool) (catalog.Host, error)
	Forget(ctx context.Context, id string) error
	Statuses() []controlplane.HostStatus
	// Classify maps its errors to user-facing ones.
	Classify(err error) error
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

// listFleet describes the hosts of the fleet. Admin keys see every
// sandbox on them, every template they hold and their addresses; other
// keys see capacity and load, only their own sandboxes, and of the
// templates only those they may use (visibleTemplates).
func (s *Server) listFleet(w http.ResponseWriter, r *http.Request) {
	key := callerOf(r).Key
	visible, err := s.visibleTemplates(r.Context(), key)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	f := catalog.SandboxFilter{States: []string{catalog.StateRunning}}
	if !key.Admin {
		f.KeyID = key.ID
	}
	running, err := s.cat.ListSandboxes(r.Context(), f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	byHost := map[string][]catalog.Sandbox{}
	for _, sb := range running {
		byHost[sb.HostID] = append(byHost[sb.HostID], sb)
	}
	out := []fleetHostJSON{}
	for _, st := range s.cfg.Fleet.Statuses() {
		rec := st.Record
		h := fleetHostJSON{
			hostJSON: hostJSON{ID: rec.ID, State: rec.State, Accel: rec.Capacity.Accel, VCPUs: rec.Capacity.CPUs,
				MemoryMiB: int(rec.Capacity.MemoryMiB), NetworkOff: s.networkOff(rec.ID), Templates: []string{}},
			Draining: rec.Draining, Static: st.Static, DiskMiB: rec.Capacity.DiskMiB,
			RegisteredAt: rec.RegisteredAt, HeartbeatAt: rec.HeartbeatAt,
		}
		if key.Admin {
			h.URL = rec.URL
		}
		if st.Loaded {
			h.MemoryAvailableMiB, h.DiskFreeMiB = int(st.Load.FreeMemoryMiB), st.Load.DiskFreeMiB
			for _, t := range st.Load.Templates {
				if visible(t) {
					h.Templates = append(h.Templates, t)
				}
			}
		}
		if st.Static {
			c, err := s.cfg.Fleet.Host(rec.ID)
			if err == nil {
				h.Accel = string(c.Accel())
				res := host.LocalResources()
				if rr, ok := c.(host.ResourceReporter); ok {
					res, err = rr.Resources(r.Context())
				}
				if err == nil {
					h.VCPUs, h.MemoryMiB, h.MemoryAvailableMiB = res.VCPUs, res.MemoryMiB, res.MemoryAvailableMiB
				}
			}
		}
		if !st.Connected && rec.State != catalog.HostLost {
			h.State = "connecting"
		}
		var pss, priv int64
		for _, sb := range byHost[rec.ID] {
			h.Sandboxes++
			h.MemoryAllocatedMiB += sb.MemoryMiB
			if m, err := s.host.Memory(r.Context(), sb.ID); err == nil {
				pss += m.PSSBytes
				priv += m.PrivateBytes
			}
		}
		h.SandboxesPSSMiB, h.SandboxesPrivMiB = mib(pss), mib(priv)
		out = append(out, h)
	}
	writeJSON(w, http.StatusOK, map[string]any{"hosts": out})
}

// visibleTemplates returns whether key may see a template a host holds,
// by its reference ("NAME", "NAME:N"): an admin key every one; another key
// the built-in ones and the user templates it may use (every version of
// its own, the published versions of others', usableVersions), as GET
// /v1/templates lists them. A
// pinned version of a template the registry does not know (a deleted
// one, still on a host) is nobody's but the admin keys'.
func (s *Server) visibleTemplates(ctx context.Context, key catalog.Key) (func(string) bool, error) {
	if key.Admin {
		return func(string) bool { return true }, nil
	}
	users, err := s.userVersions(ctx)
	if err != nil {
		return nil, err
	}
	return func(ref string) bool {
		name, v, err := templates.SplitRef(ref)
		vs, ok := users[name]
		if err != nil || !ok || len(vs) == 0 {
			return err == nil && v == 0
		}
		usable := usableVersions(key, vs)
		if v == 0 {
			return len(usable) > 0
		}
		return slices.ContainsFunc(usable, func(u templates.UserRootFS) bool { return u.Version == v })
	}, nil
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

// forgetHost is DELETE /v1/hosts/{id} (admin): the host leaves the fleet.
// Refused while it holds live sandboxes, unless it is lost.
func (s *Server) forgetHost(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Fleet == nil {
		s.writeError(w, r, errorf(controlplane.NotImplemented, "this server has one host, which cannot be removed"))
		return
	}
	id := chi.URLParam(r, "id")
	live, err := s.cat.ListSandboxes(r.Context(), catalog.SandboxFilter{HostID: id, States: controlplane.LiveStates})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	lost := false
	for _, st := range s.cfg.Fleet.Statuses() {
		lost = lost || (st.Record.ID == id && st.Record.State == catalog.HostLost)
	}
	if len(live) > 0 && !lost {
		s.writeError(w, r, errorf(controlplane.Conflict, "host %s holds %d live sandboxes: drain it (POST /v1/hosts/%s/drain?migrate=true) or kill them first", id, len(live), id))
		return
	}
	if err := s.cfg.Fleet.Forget(r.Context(), id); err != nil {
		if errors.Is(err, catalog.ErrNotFound) {
			s.writeError(w, r, errorf(controlplane.NotFound, "host %s not found", id))
			return
		}
		s.writeError(w, r, s.cfg.Fleet.Classify(err))
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

// listHosts describes the hosts. An admin key sees every sandbox on them;
// other keys see the machines' capacity and only their own sandboxes.
func (s *Server) listHosts(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Fleet != nil {
		s.listFleet(w, r)
		return
	}
	h := hostJSON{ID: s.cfg.HostID, State: "ready", Accel: string(s.host.Accel()), NetworkOff: s.networkOff(s.cfg.HostID)}
	res := host.LocalResources()
	if rr, ok := s.host.(host.ResourceReporter); ok {
		var err error
		if res, err = rr.Resources(r.Context()); err != nil {
			h.State = "unreachable"
			s.log.Warn("host resources", "host_id", s.cfg.HostID, "err", err)
		}
	}
	h.VCPUs, h.MemoryMiB, h.MemoryAvailableMiB = res.VCPUs, res.MemoryMiB, res.MemoryAvailableMiB
	var running []string
	key := callerOf(r).Key
	if key.Admin {
		infos, err := s.host.List(r.Context())
		if err != nil {
			s.log.Warn("list sandboxes of host", "host_id", s.cfg.HostID, "err", err)
		}
		for _, info := range infos {
			if info.State == lifecycle.Running {
				running = append(running, info.ID)
				h.MemoryAllocatedMiB += info.MemoryMiB
			}
		}
	} else {
		own, err := s.cat.ListSandboxes(r.Context(), catalog.SandboxFilter{KeyID: key.ID, HostID: s.cfg.HostID, States: []string{catalog.StateRunning}})
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		for _, sb := range own {
			running = append(running, sb.ID)
			h.MemoryAllocatedMiB += sb.MemoryMiB
		}
	}
	var pss, priv int64
	for _, id := range running {
		h.Sandboxes++
		if m, err := s.host.Memory(r.Context(), id); err == nil {
			pss += m.PSSBytes
			priv += m.PrivateBytes
		}
	}
	h.SandboxesPSSMiB, h.SandboxesPrivMiB = mib(pss), mib(priv)
	h.Templates = []string{}
	if ts, err := s.host.Templates().List(r.Context()); err != nil {
		s.log.Warn("list templates of host", "host_id", s.cfg.HostID, "err", err)
	} else {
		visible, err := s.visibleTemplates(r.Context(), key)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		for _, t := range ts {
			if visible(t.Name) && !slices.Contains(h.Templates, t.Name) {
				h.Templates = append(h.Templates, t.Name)
			}
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"hosts": []hostJSON{h}})
}
