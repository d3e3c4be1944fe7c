package rest

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// volumeJSON is the Volume schema.
type volumeJSON struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	SizeMiB   int       `json:"size_mib"`
	UsedBytes int64     `json:"used_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// Parent is the name of the volume it was branched from (omitted if
	// none, or if that volume is deleted).
	Parent string `json:"parent,omitempty"`
	// MountedBy are the sandboxes not stopped that mount it.
	MountedBy []string `json:"mounted_by"`
}

func (s *Server) volumeJSON(ctx context.Context, v catalog.Volume) (volumeJSON, error) {
	out := volumeJSON{ID: v.ID, Name: v.Name, SizeMiB: v.SizeMiB, UsedBytes: v.UsedBytes, CreatedAt: v.CreatedAt.UTC()}
	if v.ParentID != "" {
		if pv, err := s.cat.GetVolume(ctx, v.ParentID); err == nil && pv.KeyID == v.KeyID {
			out.Parent = pv.Name
		}
	}
	ids, err := s.cp.MountedBy(ctx, v)
	if err != nil {
		return out, err
	}
	out.MountedBy = ids
	return out, nil
}

// writeVolume answers with volume v.
func (s *Server) writeVolume(w http.ResponseWriter, r *http.Request, status int, v catalog.Volume) {
	out, err := s.volumeJSON(r.Context(), v)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, status, out)
}

// ownedVolume returns the caller's volume named (or with the id) in the
// URL; another key's is not found, exactly like a missing one.
func (s *Server) ownedVolume(r *http.Request) (catalog.Volume, error) {
	return s.cp.Volume(r.Context(), callerOf(r).Key.ID, chi.URLParam(r, "name"))
}

// createVolumeRequest is the body of POST /v1/volumes.
type createVolumeRequest struct {
	Name    string `json:"name"`
	SizeMiB *int   `json:"size_mib"`
}

// resizeVolumeRequest is the body of PATCH /v1/volumes/{name}.
type resizeVolumeRequest struct {
	SizeMiB *int `json:"size_mib"`
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	var req createVolumeRequest
	if err := decodeJSON(r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	size := controlplane.DefaultVolumeSizeMiB
	if req.SizeMiB != nil {
		size = *req.SizeMiB
		if size < 1 {
			s.writeError(w, r, invalid("size_mib must be at least 1"))
			return
		}
	}
	v, err := s.cp.CreateVolume(r.Context(), callerOf(r).Key, req.Name, size)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeVolume(w, r, http.StatusCreated, v)
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	vs, err := s.cp.ListVolumes(r.Context(), callerOf(r).Key.ID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]volumeJSON, 0, len(vs))
	for _, v := range vs {
		j, err := s.volumeJSON(r.Context(), v)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		out = append(out, j)
	}
	writeJSON(w, http.StatusOK, map[string]any{"volumes": out})
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.ownedVolume(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeVolume(w, r, http.StatusOK, s.cp.RefreshVolume(r.Context(), v))
}

func (s *Server) resizeVolume(w http.ResponseWriter, r *http.Request) {
	var req resizeVolumeRequest
	if err := decodeJSON(r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.SizeMiB == nil {
		s.writeError(w, r, invalid("size_mib is required"))
		return
	}
	v, err := s.ownedVolume(r)
	if err == nil {
		v, err = s.cp.ResizeVolume(r.Context(), callerOf(r).Key, v, *req.SizeMiB)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeVolume(w, r, http.StatusOK, v)
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	force := false
	if f := r.URL.Query().Get("force"); f != "" {
		var err error
		if force, err = strconv.ParseBool(f); err != nil {
			s.writeError(w, r, invalid("force must be true or false"))
			return
		}
	}
	v, err := s.ownedVolume(r)
	if err == nil {
		err = s.cp.DeleteVolume(r.Context(), v, force)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) promoteVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.ownedVolume(r)
	if err == nil {
		v, err = s.cp.PromoteVolume(r.Context(), v)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeVolume(w, r, http.StatusOK, v)
}

// Files: as the sandbox files routes (files.go), paths relative to the
// volume's root.

// volumeAndPath returns the caller's volume and the path query parameter
// (required, as the sandbox routes' is).
func (s *Server) volumeAndPath(r *http.Request) (catalog.Volume, string, error) {
	p := r.URL.Query().Get("path")
	if p == "" {
		return catalog.Volume{}, "", invalid("path is required")
	}
	if _, err := controlplane.CheckVolumeFilePath(p); err != nil {
		return catalog.Volume{}, "", err
	}
	v, err := s.ownedVolume(r)
	return v, p, err
}

func (s *Server) readVolumeFile(w http.ResponseWriter, r *http.Request) {
	v, p, err := s.volumeAndPath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rc, fi, err := s.cp.ReadVolumeFile(r.Context(), v, p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	w.Header().Set("X-Panda-File-Mode", strconv.FormatUint(uint64(fi.Mode&0o7777), 10))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		// Headers are out: cut the connection short so the client sees a
		// truncated body, not a silently short file.
		s.log.Warn("volume download interrupted", "volume_id", v.ID, "err", err)
		panic(http.ErrAbortHandler)
	}
}

func (s *Server) writeVolumeFile(w http.ResponseWriter, r *http.Request) {
	v, p, err := s.volumeAndPath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	mode, err := s.uploadMode(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxUploadBytes)
	if _, err := s.cp.WriteVolumeFile(r.Context(), v, p, body, mode); err != nil {
		s.writeError(w, r, s.uploadError(err))
		return
	}
	s.statVolumePath(w, r, v, p)
}

func (s *Server) removeVolumeFile(w http.ResponseWriter, r *http.Request) {
	v, p, err := s.volumeAndPath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	recursive := false
	if q := r.URL.Query().Get("recursive"); q != "" {
		if recursive, err = strconv.ParseBool(q); err != nil {
			s.writeError(w, r, invalid("recursive must be true or false"))
			return
		}
	}
	if err := s.cp.RemoveVolumeFile(r.Context(), v, p, recursive); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) listVolumeFiles(w http.ResponseWriter, r *http.Request) {
	v, p, err := s.volumeAndPath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	list, err := s.cp.ListVolumeDir(r.Context(), v, p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]fileInfoJSON, 0, len(list))
	for _, fi := range list {
		out = append(out, fileJSON(fi))
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": out})
}

func (s *Server) statVolumeFile(w http.ResponseWriter, r *http.Request) {
	v, p, err := s.volumeAndPath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.statVolumePath(w, r, v, p)
}

func (s *Server) mkdirVolume(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Path string `json:"path"`
	}
	if err := decodeJSON(r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Path == "" {
		s.writeError(w, r, invalid("path is required"))
		return
	}
	v, err := s.ownedVolume(r)
	if err == nil {
		err = s.cp.MkdirVolume(r.Context(), v, req.Path)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.statVolumePath(w, r, v, req.Path)
}

// statVolumePath answers with the FileInfo of path p of volume v.
func (s *Server) statVolumePath(w http.ResponseWriter, r *http.Request, v catalog.Volume, p string) {
	fi, err := s.cp.StatVolumeFile(r.Context(), v, p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fileJSON(fi))
}
