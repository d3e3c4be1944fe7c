package rest

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
)

type forkChildJSON struct {
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
	Error   *errorDetail `json:"error,omitempty"`
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Count     *int                `json:"count"`
		Placement scheduler.Placement `json:"placement"`
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
	res, err := s.cp.Fork(r.Context(), callerOf(r).Key, parent, count, req.Placement)
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

type snapshotJSON struct {
	ID        string    `json:"id"`
	Name      string    `json:"name,omitempty"`
	SandboxID string    `json:"sandbox_id"`
	Template  string    `json:"template"`
	MemoryMiB int       `json:"memory_mib"`
	VCPUs     int       `json:"vcpus"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// Stored and StoreError are the host's (host.SnapshotInfo); absent
	// when the host cannot be asked.
	Stored     string `json:"stored,omitempty"`
	StoreError string `json:"store_error,omitempty"`
}

// snapToJSON describes sn; storage is where its host keeps it (from
// control.Plane.SnapshotStorage, or the host's answer to the snapshot).
func snapToJSON(sn catalog.Snapshot, storage map[string]host.SnapshotInfo) snapshotJSON {
	si := storage[sn.ID]
	return snapshotJSON{ID: sn.ID, Name: sn.Name, SandboxID: sn.SandboxID, Template: sn.Template,
		MemoryMiB: sn.MemoryMiB, VCPUs: sn.VCPUs, SizeBytes: sn.SizeBytes, CreatedAt: sn.CreatedAt.UTC(),
		Stored: si.Stored, StoreError: si.StoreError}
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"name"`
	}
	if err := decodeJSON(r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	if len(req.Name) > 128 || strings.ContainsRune(req.Name, 0) || !utf8.ValidString(req.Name) {
		s.writeError(w, r, invalid("name must be at most 128 bytes of UTF-8, without NUL"))
		return
	}
	sb, err := s.running(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sn, err := s.cp.Snapshot(r.Context(), callerOf(r).Key, sb, req.Name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapToJSON(sn, s.cp.SnapshotStorageOf(r.Context(), sn)))
}

// ownedSnapshot returns the caller's snapshot from the URL.
func (s *Server) ownedSnapshot(ctx context.Context, r *http.Request, id string) (catalog.Snapshot, error) {
	return s.cp.OwnedSnapshot(ctx, callerOf(r).Key.ID, id)
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	list, err := s.cat.ListSnapshots(r.Context(), callerOf(r).Key.ID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]snapshotJSON, 0, len(list))
	storage := s.cp.SnapshotStorage(r.Context())
	for _, sn := range list {
		out = append(out, snapToJSON(sn, storage))
	}
	writeJSON(w, http.StatusOK, map[string]any{"snapshots": out})
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := s.ownedSnapshot(r.Context(), r, chi.URLParam(r, "snapID"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snapToJSON(sn, s.cp.SnapshotStorageOf(r.Context(), sn)))
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := s.ownedSnapshot(r.Context(), r, chi.URLParam(r, "snapID"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.cp.DeleteSnapshot(r.Context(), sn.ID); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

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

// lifecycleOp serves pause and resume (run: control.Plane's): the sandbox
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
