package hostapi

import (
	"io/fs"
	"net/http"
	"strconv"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
	"github.com/pandastack/pandastack/internal/hostagent"
)

// volumeRoutes serves the agent's volumes (host.Volumes) and forks whose
// children say what they mount (host.VolumeForker): hostwire/volumes.go.
func (s *Server) volumeRoutes(r chi.Router) {
	vols := hostagent.Local(s.a).(host.Volumes) // the files API, with its contract's signatures
	const p = hostwire.Prefix + "/volumes"
	r.Post(p, s.json(func(r *http.Request) (any, error) {
		var req hostwire.VolumeRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return s.a.CreateVolume(req.ID, req.LimitBytes)
	}))
	r.Get(p, s.json(func(r *http.Request) (any, error) {
		list, err := s.a.ListVolumes()
		return map[string]any{"volumes": list}, err
	}))
	r.Get(p+"/{vol}", s.json(func(r *http.Request) (any, error) { return s.a.GetVolume(chi.URLParam(r, "vol")) }))
	r.Patch(p+"/{vol}", s.json(func(r *http.Request) (any, error) {
		var req hostwire.VolumeRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return s.a.ResizeVolume(chi.URLParam(r, "vol"), req.LimitBytes)
	}))
	r.Delete(p+"/{vol}", s.json(func(r *http.Request) (any, error) {
		force, _ := strconv.ParseBool(r.URL.Query().Get("force"))
		return nil, s.a.DeleteVolume(chi.URLParam(r, "vol"), force)
	}))
	r.Post(p+"/{vol}/branch", s.json(func(r *http.Request) (any, error) {
		var req hostwire.BranchRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return s.a.BranchVolume(chi.URLParam(r, "vol"), req.To)
	}))
	r.Post(p+"/{vol}/promote", s.json(func(r *http.Request) (any, error) {
		var req hostwire.PromoteRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return s.a.PromoteVolume(chi.URLParam(r, "vol"), req.Target)
	}))
	r.Get(p+"/{vol}/files", func(w http.ResponseWriter, r *http.Request) {
		rd, fi, err := vols.ReadVolumeFile(r.Context(), chi.URLParam(r, "vol"), r.URL.Query().Get("path"))
		sendFile(w, rd, fi, err)
	})
	r.Put(p+"/{vol}/files", func(w http.ResponseWriter, r *http.Request) {
		receiveFile(w, r, func(path string, mode fs.FileMode) (int64, error) {
			return vols.WriteVolumeFile(r.Context(), chi.URLParam(r, "vol"), path, r.Body, mode)
		})
	})
	r.Delete(p+"/{vol}/files", s.json(func(r *http.Request) (any, error) {
		recursive, _ := strconv.ParseBool(r.URL.Query().Get("recursive"))
		return nil, vols.RemoveVolumeFile(r.Context(), chi.URLParam(r, "vol"), r.URL.Query().Get("path"), recursive)
	}))
	r.Get(p+"/{vol}/files/list", s.json(func(r *http.Request) (any, error) {
		list, err := vols.ListVolumeDir(r.Context(), chi.URLParam(r, "vol"), r.URL.Query().Get("path"))
		return map[string]any{"entries": list}, err
	}))
	r.Get(p+"/{vol}/files/stat", s.json(func(r *http.Request) (any, error) {
		return vols.StatVolumeFile(r.Context(), chi.URLParam(r, "vol"), r.URL.Query().Get("path"))
	}))
	r.Post(p+"/{vol}/files/mkdir", s.json(func(r *http.Request) (any, error) {
		var req hostwire.PathRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return nil, vols.MkdirVolume(r.Context(), chi.URLParam(r, "vol"), req.Path)
	}))
	r.Post(hostwire.Prefix+"/sandboxes/{id}/fork-volumes", s.json(func(r *http.Request) (any, error) {
		var req hostwire.ForkVolumesRequest
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		res, err := s.a.ForkWithVolumes(r.Context(), chi.URLParam(r, "id"), req.Contract())
		if err != nil {
			return nil, err
		}
		return forkReply(res), nil
	}))
}
