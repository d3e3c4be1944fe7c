package rest

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
)

type fileInfoJSON struct {
	Name       string    `json:"name"`
	Path       string    `json:"path"`
	Size       int64     `json:"size"`
	Mode       uint32    `json:"mode"`
	IsDir      bool      `json:"is_dir"`
	IsSymlink  bool      `json:"is_symlink"`
	LinkTarget string    `json:"link_target,omitempty"`
	ModifiedAt time.Time `json:"modified_at"`
}

func fileJSON(fi guestproto.FileInfo) fileInfoJSON {
	return fileInfoJSON{
		Name: fi.Name, Path: fi.Path, Size: fi.Size, Mode: fi.Mode & 0o7777, IsDir: fi.IsDir,
		IsSymlink: fi.IsSymlink, LinkTarget: fi.LinkTarget, ModifiedAt: fi.ModTime().UTC(),
	}
}

// checkPath validates a guest path from a request.
func checkPath(p string) error {
	switch {
	case p == "":
		return invalid("path is required")
	case !utf8.ValidString(p):
		return invalid("path is not valid UTF-8")
	case strings.ContainsRune(p, 0):
		return invalid("path contains a NUL byte")
	case len(p) > 4096:
		return invalid("path is longer than 4096 bytes")
	case !path.IsAbs(p):
		return invalid("path %q must be absolute", p)
	}
	return nil
}

func queryPath(r *http.Request, name string) (string, error) {
	p := r.URL.Query().Get(name)
	if err := checkPath(p); err != nil {
		return "", err
	}
	return p, nil
}

// pathAndGuest reads the path query parameter and reaches the caller's
// running sandbox; on failure it has written the error and returns ok false.
func (s *Server) pathAndGuest(w http.ResponseWriter, r *http.Request) (p string, g host.Guest, ok bool) {
	p, err := queryPath(r, "path")
	if err == nil {
		g, err = s.guestFor(r)
	}
	if err != nil {
		s.writeError(w, r, err)
		return "", nil, false
	}
	return p, g, true
}

// guestFor returns the guest client of the caller's running sandbox
// (limitGuest's).
func (s *Server) guestFor(r *http.Request) (host.Guest, error) {
	sb, err := s.guestSandbox(r)
	if err != nil {
		return nil, err
	}
	return s.host.Guest(r.Context(), sb.ID)
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	p, c, ok := s.pathAndGuest(w, r)
	if !ok {
		return
	}
	rc, fi, err := c.ReadFile(r.Context(), p)
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
		// Headers are out: all we can do is cut the connection short so
		// the client sees a truncated body, not a silently short file.
		s.log.Warn("download interrupted", "path", p, "err", err)
		panic(http.ErrAbortHandler)
	}
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r, "path")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	mode, err := s.uploadMode(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	c, err := s.guestFor(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxUploadBytes)
	if _, err := c.WriteFile(r.Context(), p, body, mode); err != nil {
		s.writeError(w, r, s.uploadError(err))
		return
	}
	s.opThenStat(w, r, c, nil, p, nil)
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r, "path")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	recursive := false
	if v := r.URL.Query().Get("recursive"); v != "" {
		if recursive, err = strconv.ParseBool(v); err != nil {
			s.writeError(w, r, invalid("recursive must be true or false"))
			return
		}
	}
	if path.Clean(p) == "/" {
		s.writeError(w, r, invalid("refusing to remove /"))
		return
	}
	c, err := s.guestFor(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := c.Remove(r.Context(), p, recursive); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
	p, c, ok := s.pathAndGuest(w, r)
	if !ok {
		return
	}
	list, err := c.ListDir(r.Context(), p)
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

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) {
	p, c, ok := s.pathAndGuest(w, r)
	if !ok {
		return
	}
	s.opThenStat(w, r, c, nil, p, nil)
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Path string `json:"path"`
	}
	if err := decodeJSON(r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.opThenStat(w, r, nil, []string{req.Path}, req.Path, func(ctx context.Context, c host.Guest) error {
		return c.Mkdir(ctx, req.Path)
	})
}

func (s *Server) rename(w http.ResponseWriter, r *http.Request) {
	var req struct {
		From string `json:"from"`
		To   string `json:"to"`
	}
	if err := decodeJSON(r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.opThenStat(w, r, nil, []string{req.From, req.To}, req.To, func(ctx context.Context, c host.Guest) error {
		return c.Rename(ctx, req.From, req.To)
	})
}

// opThenStat checks paths, reaches the caller's running sandbox (unless c
// is given), runs op (if any) and answers with the FileInfo of result.
func (s *Server) opThenStat(w http.ResponseWriter, r *http.Request, c host.Guest, paths []string, result string, op func(context.Context, host.Guest) error) {
	var err error
	for _, p := range paths {
		if err = checkPath(p); err != nil {
			break
		}
	}
	if err == nil && c == nil {
		c, err = s.guestFor(r)
	}
	if err == nil && op != nil {
		err = op(r.Context(), c)
	}
	var fi guestproto.FileInfo
	if err == nil {
		fi, err = c.Stat(r.Context(), result)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fileJSON(fi))
}

// uploadMode is the permission bits of a file upload (the mode query
// parameter, octal; 644 if none), once its declared length is within
// the server's limit.
func (s *Server) uploadMode(r *http.Request) (fs.FileMode, error) {
	mode := fs.FileMode(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || v > 0o7777 {
			return 0, invalid("mode %q must be octal permission bits like 644 or 755", m)
		}
		mode = fs.FileMode(v)
	}
	if r.ContentLength > s.cfg.MaxUploadBytes {
		return 0, errorf(controlplane.TooLarge, "upload of %d bytes exceeds the limit of %d", r.ContentLength, s.cfg.MaxUploadBytes)
	}
	return mode, nil
}

// uploadError is the error of an upload that failed: too large if its
// body went over the server's limit (http.MaxBytesReader), else err.
func (s *Server) uploadError(err error) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return errorf(controlplane.TooLarge, "upload exceeds the limit of %d bytes", s.cfg.MaxUploadBytes)
	}
	return err
}
