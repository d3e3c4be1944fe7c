package pandastack

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/pandastack/pandastack/sdk/go/internal/wire"
)

// FileInfo describes a file in a sandbox.
type FileInfo struct {
	Name       string      `json:"name"`
	Path       string      `json:"path"`
	Size       int64       `json:"size"`
	Mode       os.FileMode `json:"mode"` // permission bits only (0644)
	IsDir      bool        `json:"is_dir"`
	IsSymlink  bool        `json:"is_symlink,omitempty"`
	LinkTarget string      `json:"link_target,omitempty"`
	ModifiedAt time.Time   `json:"modified_at,omitzero"`
}

func pathQuery(p string) url.Values { return url.Values{"path": {p}} }

// fileAPI is the files routes of one owner: a sandbox
// (/v1/sandboxes/{id}/files...) or a volume (/v1/volumes/{name}/files...),
// which take the same query parameters and bodies and answer alike.
type fileAPI struct {
	c     *Client
	owner string // "sandbox" or "volume", for the empty-id error
	route string // "sandboxes" or "volumes"
	id    string
}

func (s *Sandbox) files() fileAPI {
	return fileAPI{c: s.c, owner: "sandbox", route: "sandboxes", id: s.ID}
}

// path is the API path of the owner's files route with more segments.
func (f fileAPI) path(more ...string) string {
	return path(append([]string{f.route, f.id, "files"}, more...)...)
}

// WriteFile uploads r to the absolute path p, creating parent directories.
// r is streamed, never held in memory; if it is a regular *os.File the
// length is sent up front. The file appears only once complete. mode is
// the permission bits (0 means 0644). r is not closed.
func (s *Sandbox) WriteFile(ctx context.Context, p string, r io.Reader, mode os.FileMode) (FileInfo, error) {
	return s.files().write(ctx, p, r, mode)
}

func (f fileAPI) write(ctx context.Context, p string, r io.Reader, mode os.FileMode) (FileInfo, error) {
	if err := checkID(f.owner, f.id); err != nil {
		return FileInfo{}, err
	}
	q := pathQuery(p)
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode&0o7777), 8))
	}
	// Hide r's Close (the transport closes the body) and anything that
	// would make net/http treat it specially.
	body := struct{ io.Reader }{r}
	req, err := f.c.newRequest(ctx, http.MethodPut, f.path(), q, body, "application/octet-stream")
	if err != nil {
		return FileInfo{}, err
	}
	req.ContentLength = lengthOf(r)
	if req.ContentLength == 0 {
		req.Body = http.NoBody
	}
	req.Header.Set("Accept", "application/json")
	resp, err := f.c.send(req)
	if err != nil {
		return FileInfo{}, fmt.Errorf("write %s: %w", p, err)
	}
	defer resp.Body.Close()
	var fi FileInfo
	if err := decodeJSON(resp.Body, &fi); err != nil {
		return FileInfo{}, fmt.Errorf("write %s: %w", p, err)
	}
	return fi, nil
}

// lengthOf returns how many bytes r will yield, or -1 if unknown.
func lengthOf(r io.Reader) int64 {
	type lener interface{ Len() int }
	switch v := r.(type) {
	case lener: // bytes.Reader, bytes.Buffer, strings.Reader
		return int64(v.Len())
	case *os.File:
		st, err := v.Stat()
		if err != nil || !st.Mode().IsRegular() {
			return -1
		}
		off, err := v.Seek(0, io.SeekCurrent)
		if err != nil || off > st.Size() {
			return -1
		}
		return st.Size() - off
	}
	return -1
}

// ReadFile downloads the file at p. The content is streamed: read it and
// close it. Errors (not found, ...) are returned before any content.
func (s *Sandbox) ReadFile(ctx context.Context, p string) (io.ReadCloser, error) {
	return s.files().read(ctx, p)
}

func (f fileAPI) read(ctx context.Context, p string) (io.ReadCloser, error) {
	if err := checkID(f.owner, f.id); err != nil {
		return nil, err
	}
	req, err := f.c.newRequest(ctx, http.MethodGet, f.path(), pathQuery(p), nil, "")
	if err != nil {
		return nil, err
	}
	resp, err := f.c.send(req)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return resp.Body, nil
}

// ListFiles lists the directory p, sorted by name.
func (s *Sandbox) ListFiles(ctx context.Context, p string) ([]FileInfo, error) {
	return s.files().list(ctx, p)
}

func (f fileAPI) list(ctx context.Context, p string) ([]FileInfo, error) {
	if err := checkID(f.owner, f.id); err != nil {
		return nil, err
	}
	var out struct {
		Entries []FileInfo `json:"entries"`
	}
	if err := f.c.doJSON(ctx, http.MethodGet, f.path("list"), pathQuery(p), nil, &out); err != nil {
		return nil, fmt.Errorf("list %s: %w", p, err)
	}
	return out.Entries, nil
}

// Stat describes the file at p, without following a final symlink.
func (s *Sandbox) Stat(ctx context.Context, p string) (FileInfo, error) {
	return s.files().stat(ctx, p)
}

func (f fileAPI) stat(ctx context.Context, p string) (FileInfo, error) {
	if err := checkID(f.owner, f.id); err != nil {
		return FileInfo{}, err
	}
	var fi FileInfo
	if err := f.c.doJSON(ctx, http.MethodGet, f.path("stat"), pathQuery(p), nil, &fi); err != nil {
		return FileInfo{}, fmt.Errorf("stat %s: %w", p, err)
	}
	return fi, nil
}

// Mkdir creates the directory p and its parents (like mkdir -p).
func (s *Sandbox) Mkdir(ctx context.Context, p string) (FileInfo, error) {
	return s.files().mkdir(ctx, p)
}

func (f fileAPI) mkdir(ctx context.Context, p string) (FileInfo, error) {
	if err := checkID(f.owner, f.id); err != nil {
		return FileInfo{}, err
	}
	in := wire.MakeDirJSONRequestBody{Path: p}
	var fi FileInfo
	if err := f.c.doJSON(ctx, http.MethodPost, f.path("mkdir"), nil, in, &fi); err != nil {
		return FileInfo{}, fmt.Errorf("mkdir %s: %w", p, err)
	}
	return fi, nil
}

// Remove removes the file or directory p; a non-empty directory needs
// recursive.
func (s *Sandbox) Remove(ctx context.Context, p string, recursive bool) error {
	return s.files().remove(ctx, p, recursive)
}

func (f fileAPI) remove(ctx context.Context, p string, recursive bool) error {
	if err := checkID(f.owner, f.id); err != nil {
		return err
	}
	q := pathQuery(p)
	if recursive {
		q.Set("recursive", "true")
	}
	if err := f.c.doJSON(ctx, http.MethodDelete, f.path(), q, nil, nil); err != nil {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

// Rename renames or moves from to to and describes the file at its new path.
func (s *Sandbox) Rename(ctx context.Context, from, to string) (FileInfo, error) {
	if err := checkID("sandbox", s.ID); err != nil {
		return FileInfo{}, err
	}
	in := wire.RenameFileJSONRequestBody{From: from, To: to}
	var fi FileInfo
	if err := s.c.doJSON(ctx, http.MethodPost, path("sandboxes", s.ID, "files", "rename"), nil, in, &fi); err != nil {
		return FileInfo{}, fmt.Errorf("rename %s: %w", from, err)
	}
	return fi, nil
}
