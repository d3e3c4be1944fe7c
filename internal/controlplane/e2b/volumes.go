package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

// E2B's volumes: the control routes under /volumes (authenticated with
// an API key, as the sandboxes'), and the content routes under
// /volumecontent/{volumeID}/... that the SDK sends to E2B_VOLUME_API_URL
// with the volume's token, which create and getInfo return: an HMAC of
// the volume and its key, so that it needs no storage and dies with the
// secret. An API key is accepted there too.

// Volume is a volume as E2B shows it.
type Volume struct {
	ID   string
	Name string
}

// VolumeMount is a volume a create mounts: by name, at an absolute path.
type VolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// Volumes is the Backend's optional ability to serve volumes. keyID
// methods act on the key's own volumes only: another key's is not found.
// Errors are classified by Backend.Status.
type Volumes interface {
	CreateVolume(ctx context.Context, keyID, name string) (Volume, error)
	// Volume is the key's volume by id or name.
	Volume(ctx context.Context, keyID, id string) (Volume, error)
	ListVolumes(ctx context.Context, keyID string) ([]Volume, error)
	// DeleteVolume deletes the key's volume (a conflict while a sandbox
	// that is not stopped mounts it).
	DeleteVolume(ctx context.Context, keyID, id string) error
	// The files of the key's volume id, paths from its root.
	ListVolumeDir(ctx context.Context, keyID, id, p string) ([]guestproto.FileInfo, error)
	StatVolumeFile(ctx context.Context, keyID, id, p string) (guestproto.FileInfo, error)
	ReadVolumeFile(ctx context.Context, keyID, id, p string) (io.ReadCloser, guestproto.FileInfo, error)
	WriteVolumeFile(ctx context.Context, keyID, id, p string, r io.Reader, mode uint32) error
	MkdirVolume(ctx context.Context, keyID, id, p string) error
	RemoveVolumeFile(ctx context.Context, keyID, id, p string) error
}

// volumeRoutes adds the volume routes to m.
func (s *Server) volumeRoutes(m *http.ServeMux) {
	m.HandleFunc("POST /volumes", s.auth(s.volumes(s.createVolume)))
	m.HandleFunc("GET /volumes", s.auth(s.volumes(s.listVolumes)))
	m.HandleFunc("GET /volumes/{volumeID}", s.auth(s.volumes(s.getVolume)))
	m.HandleFunc("DELETE /volumes/{volumeID}", s.auth(s.volumes(s.deleteVolume)))
	m.HandleFunc("GET /volumecontent/{volumeID}/dir", s.volumeAuth(s.listVolumeDir))
	m.HandleFunc("POST /volumecontent/{volumeID}/dir", s.volumeAuth(s.makeVolumeDir))
	m.HandleFunc("GET /volumecontent/{volumeID}/path", s.volumeAuth(s.statVolumePath))
	m.HandleFunc("DELETE /volumecontent/{volumeID}/path", s.volumeAuth(s.removeVolumePath))
	m.HandleFunc("PATCH /volumecontent/{volumeID}/path", s.volumeAuth(func(w http.ResponseWriter, r *http.Request, _ Volumes, _ string) {
		s.writeError(w, r, errStatus(http.StatusNotImplemented, "changing a volume file's owner or mode is not supported by PandaStack"))
	}))
	m.HandleFunc("GET /volumecontent/{volumeID}/file", s.volumeAuth(s.readVolumeFile))
	m.HandleFunc("PUT /volumecontent/{volumeID}/file", s.volumeAuth(s.writeVolumeFile))
}

// volumes passes the Backend's Volumes on (501 if it has none).
func (s *Server) volumes(h func(w http.ResponseWriter, r *http.Request, v Volumes, keyID string)) func(w http.ResponseWriter, r *http.Request, keyID string) {
	return func(w http.ResponseWriter, r *http.Request, keyID string) {
		v, ok := s.b.(Volumes)
		if !ok {
			s.writeError(w, r, errStatus(http.StatusNotImplemented, "this server has no volumes"))
			return
		}
		h(w, r, v, keyID)
	}
}

// VolumeToken is the token of key keyID's volume id for the content
// routes: the key's id and an HMAC of both.
func (s *Server) VolumeToken(keyID, id string) string {
	return keyID + "." + s.volumeMAC(keyID, id)
}

func (s *Server) volumeMAC(keyID, id string) string {
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte("e2b volume token\x00" + keyID + "\x00" + id))
	return hex.EncodeToString(m.Sum(nil))
}

// volumeAuth authenticates a content request (Authorization: Bearer
// with the volume's token, or an API key) for the volume of its path and
// passes the key's id on. Like auth, it reads no body before.
func (s *Server) volumeAuth(h func(w http.ResponseWriter, r *http.Request, v Volumes, keyID string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, ok := s.b.(Volumes)
		if !ok {
			s.writeError(w, r, errStatus(http.StatusNotImplemented, "this server has no volumes"))
			return
		}
		secret, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		secret = strings.TrimSpace(secret)
		if secret == "" {
			secret = strings.TrimSpace(r.Header.Get("X-API-KEY"))
		}
		if secret == "" {
			s.writeError(w, r, errStatus(http.StatusUnauthorized, "missing token: send Authorization: Bearer with the volume's token"))
			return
		}
		id := r.PathValue("volumeID")
		if keyID, mac, ok := strings.Cut(secret, "."); ok && hmac.Equal([]byte(mac), []byte(s.volumeMAC(keyID, id))) {
			h(w, r, v, keyID)
			return
		}
		keyID, err := s.b.Authenticate(r.Context(), secret)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		h(w, r, v, keyID)
	}
}

// volumeJSON is E2B's VolumeAndToken (create, get) and Volume (list,
// without the token).
type volumeJSON struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token,omitempty"`
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request, v Volumes, keyID string) {
	var body struct {
		Name string `json:"name"`
	}
	if err := decode(r, &body); err != nil {
		s.writeError(w, r, err)
		return
	}
	vol, err := v.CreateVolume(r.Context(), keyID, body.Name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, volumeJSON{VolumeID: vol.ID, Name: vol.Name, Token: s.VolumeToken(keyID, vol.ID)})
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request, v Volumes, keyID string) {
	vs, err := v.ListVolumes(r.Context(), keyID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]volumeJSON, 0, len(vs))
	for _, vol := range vs {
		out = append(out, volumeJSON{VolumeID: vol.ID, Name: vol.Name})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request, v Volumes, keyID string) {
	vol, err := v.Volume(r.Context(), keyID, r.PathValue("volumeID"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, volumeJSON{VolumeID: vol.ID, Name: vol.Name, Token: s.VolumeToken(keyID, vol.ID)})
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request, v Volumes, keyID string) {
	if err := v.DeleteVolume(r.Context(), keyID, r.PathValue("volumeID")); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// volumeEntryJSON is E2B's VolumeEntryStat. A volume's files have no owner of
// their own (uid and gid 0) and one time (mtime, also atime and ctime).
type volumeEntryJSON struct {
	Name   string `json:"name"`
	Path   string `json:"path"`
	Type   string `json:"type"`
	Size   int64  `json:"size"`
	Mode   uint32 `json:"mode"`
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
	Atime  string `json:"atime"`
	Mtime  string `json:"mtime"`
	Ctime  string `json:"ctime"`
	Target string `json:"target,omitempty"`
}

func volumeEntry(fi guestproto.FileInfo) volumeEntryJSON {
	t := fi.ModTime().UTC().Format(time.RFC3339Nano)
	e := volumeEntryJSON{Name: fi.Name, Path: fi.Path, Type: "file", Size: fi.Size, Mode: fi.Mode & 0o7777,
		Atime: t, Mtime: t, Ctime: t, Target: fi.LinkTarget}
	switch {
	case fi.IsSymlink:
		e.Type = "symlink"
	case fi.IsDir:
		e.Type = "directory"
	}
	return e
}

// volumePath is the path query parameter (required).
func volumePath(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" {
		return "", errStatus(http.StatusBadRequest, "path is required")
	}
	return p, nil
}

// maxListDepth and maxVolumeListEntries bound a recursive listing.
const (
	maxListDepth         = 16
	maxVolumeListEntries = 10000
)

func (s *Server) listVolumeDir(w http.ResponseWriter, r *http.Request, v Volumes, keyID string) {
	p, err := volumePath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	depth := 1
	if d := r.URL.Query().Get("depth"); d != "" {
		if depth, err = strconv.Atoi(d); err != nil || depth < 1 || depth > maxListDepth {
			s.writeError(w, r, errStatus(http.StatusBadRequest, "depth must be between 1 and %d", maxListDepth))
			return
		}
	}
	id := r.PathValue("volumeID")
	out := []volumeEntryJSON{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		list, err := v.ListVolumeDir(r.Context(), keyID, id, dir)
		if err != nil {
			return err
		}
		for _, fi := range list {
			if len(out) >= maxVolumeListEntries {
				return errStatus(http.StatusBadRequest, "the listing has more than %d entries: list with a smaller depth", maxVolumeListEntries)
			}
			out = append(out, volumeEntry(fi))
			if fi.IsDir && !fi.IsSymlink && level < depth {
				if err := walk(path.Join("/", dir, fi.Name), level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(p, 1); err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) makeVolumeDir(w http.ResponseWriter, r *http.Request, v Volumes, keyID string) {
	p, err := volumePath(r)
	if err == nil {
		err = v.MkdirVolume(r.Context(), keyID, r.PathValue("volumeID"), p)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.statVolume(w, r, v, keyID, p, http.StatusCreated)
}

func (s *Server) statVolumePath(w http.ResponseWriter, r *http.Request, v Volumes, keyID string) {
	p, err := volumePath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.statVolume(w, r, v, keyID, p, http.StatusOK)
}

// statVolume answers with the entry of path p.
func (s *Server) statVolume(w http.ResponseWriter, r *http.Request, v Volumes, keyID, p string, status int) {
	fi, err := v.StatVolumeFile(r.Context(), keyID, r.PathValue("volumeID"), p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, status, volumeEntry(fi))
}

func (s *Server) removeVolumePath(w http.ResponseWriter, r *http.Request, v Volumes, keyID string) {
	p, err := volumePath(r)
	if err == nil {
		err = v.RemoveVolumeFile(r.Context(), keyID, r.PathValue("volumeID"), p)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) readVolumeFile(w http.ResponseWriter, r *http.Request, v Volumes, keyID string) {
	p, err := volumePath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	rc, fi, err := v.ReadVolumeFile(r.Context(), keyID, r.PathValue("volumeID"), p)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(fi.Size, 10))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rc); err != nil {
		// Headers are out: cut the answer short, never a short file.
		panic(http.ErrAbortHandler)
	}
}

func (s *Server) writeVolumeFile(w http.ResponseWriter, r *http.Request, v Volumes, keyID string) {
	p, err := volumePath(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	mode := uint32(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		n, err := strconv.ParseUint(m, 10, 32)
		if err != nil || n&^0o7777 != 0 {
			s.writeError(w, r, errStatus(http.StatusBadRequest, "mode %q must be permission bits (a number up to %d)", m, 0o7777))
			return
		}
		mode = uint32(n)
	}
	max := s.b.MaxUploadBytes()
	if r.ContentLength > max {
		s.writeError(w, r, errStatus(http.StatusRequestEntityTooLarge, "upload of %d bytes exceeds the limit of %d", r.ContentLength, max))
		return
	}
	body := http.MaxBytesReader(w, r.Body, max)
	if err := v.WriteVolumeFile(r.Context(), keyID, r.PathValue("volumeID"), p, body, mode); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.statVolume(w, r, v, keyID, p, http.StatusOK)
}
