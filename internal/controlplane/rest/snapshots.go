package rest

import (
	"context"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

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
// controlplane.Plane.SnapshotStorage, or the host's answer to the snapshot).
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
	// Checked before the sandbox is looked up, as every request's body.
	if err := controlplane.CheckSnapshotName(req.Name); err != nil {
		s.writeError(w, r, err)
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
