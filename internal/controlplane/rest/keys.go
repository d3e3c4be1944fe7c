package rest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

type keyJSON struct {
	ID           string    `json:"id"`
	Name         string    `json:"name"`
	Admin        bool      `json:"admin"`
	Prefix       string    `json:"prefix"`
	MaxSandboxes int       `json:"max_sandboxes"`
	MaxMemoryMiB int       `json:"max_memory_mib"`
	MaxVCPUs     int       `json:"max_vcpus"`
	MaxDiskMiB   int       `json:"max_disk_mib"`
	CreatedAt    time.Time `json:"created_at"`
	Revoked      bool      `json:"revoked,omitempty"`
	Key          string    `json:"key,omitempty"`
}

func keyToJSON(k catalog.Key) keyJSON {
	return keyJSON{ID: k.ID, Name: k.Name, Admin: k.Admin, Prefix: k.Prefix, MaxSandboxes: k.MaxSandboxes,
		MaxMemoryMiB: k.MaxMemoryMiB, MaxVCPUs: k.MaxVCPUs, MaxDiskMiB: k.MaxDiskMiB, CreatedAt: k.CreatedAt.UTC(), Revoked: !k.RevokedAt.IsZero()}
}

// validKeyID reports whether id has the shape of a key id ("key" and
// lowercase letters and digits).
func validKeyID(id string) bool {
	if len(id) < 4 || len(id) > 64 || !strings.HasPrefix(id, "key") {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func randomString(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// NewKey creates an API key and returns it with its secret, which is
// not stored anywhere.
func NewKey(ctx context.Context, cat catalog.Catalog, name string, admin bool, maxSandboxes, maxMemoryMiB int) (catalog.Key, string, error) {
	return newKey(ctx, cat, name, admin, catalog.Limits{Sandboxes: maxSandboxes, MemoryMiB: maxMemoryMiB})
}

func newKey(ctx context.Context, cat catalog.Catalog, name string, admin bool, lim catalog.Limits) (catalog.Key, string, error) {
	secret := "panda_" + randomString(40)
	k := catalog.Key{
		ID: "key" + randomString(12), Name: name, Hash: HashKey(secret), Prefix: secret[:12], Admin: admin,
		MaxSandboxes: lim.Sandboxes, MaxMemoryMiB: lim.MemoryMiB, MaxVCPUs: lim.VCPUs, MaxDiskMiB: lim.DiskMiB,
		CreatedAt: time.Now().UTC(),
	}
	if err := cat.CreateKey(ctx, k); err != nil {
		return catalog.Key{}, "", fmt.Errorf("create key: %w", err)
	}
	return k, secret, nil
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) {
	if err := requireAdmin(r); err != nil {
		s.writeError(w, r, err)
		return
	}
	var req struct {
		Name         string `json:"name"`
		Admin        bool   `json:"admin"`
		MaxSandboxes int    `json:"max_sandboxes"`
		MaxMemoryMiB int    `json:"max_memory_mib"`
		MaxVCPUs     int    `json:"max_vcpus"`
		MaxDiskMiB   int    `json:"max_disk_mib"`
	}
	if err := decodeJSON(r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	req.Name = strings.TrimSpace(req.Name)
	switch {
	case req.Name == "" || len(req.Name) > 64 || strings.ContainsRune(req.Name, 0):
		s.writeError(w, r, invalid("name must be 1 to 64 characters, without NUL"))
		return
	case req.MaxSandboxes < 0 || req.MaxMemoryMiB < 0 || req.MaxVCPUs < 0 || req.MaxDiskMiB < 0:
		s.writeError(w, r, invalid("quotas must not be negative (0 means the server default)"))
		return
	}
	k, secret, err := newKey(r.Context(), s.cat, req.Name, req.Admin, catalog.Limits{
		Sandboxes: req.MaxSandboxes, MemoryMiB: req.MaxMemoryMiB, VCPUs: req.MaxVCPUs, DiskMiB: req.MaxDiskMiB})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.log.Info("api key created", "key_id", k.ID, "admin", k.Admin, "by", callerOf(r).Key.ID)
	out := keyToJSON(k)
	out.Key = secret
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) {
	if err := requireAdmin(r); err != nil {
		s.writeError(w, r, err)
		return
	}
	keys, err := s.cat.ListKeys(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]keyJSON, 0, len(keys))
	for _, k := range keys {
		out = append(out, keyToJSON(k))
	}
	writeJSON(w, http.StatusOK, map[string]any{"keys": out})
}

func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) {
	if err := requireAdmin(r); err != nil {
		s.writeError(w, r, err)
		return
	}
	id := chi.URLParam(r, "keyID")
	if !validKeyID(id) {
		s.writeError(w, r, notFound("key %q not found", id))
		return
	}
	if id == callerOf(r).Key.ID {
		s.writeError(w, r, conflict("a key cannot revoke itself"))
		return
	}
	if err := s.cat.RevokeKey(r.Context(), id, time.Now().UTC()); err != nil {
		if errors.Is(err, catalog.ErrNotFound) {
			s.writeError(w, r, notFound("key %s not found", id))
			return
		}
		s.writeError(w, r, err)
		return
	}
	// Its event streams end (later requests are refused: 401), its build
	// requests being received end, its builds are canceled (their status
	// says why).
	s.events.CloseKey(id)
	s.endBuildRequests(id)
	if _, err := s.cancelBuilds(r.Context(), id); err != nil {
		s.log.Error("cancel template builds of revoked key", "key_id", id, "err", err)
	}
	// A revoked key's sandboxes go with it.
	live, err := s.cat.ListSandboxes(r.Context(), catalog.SandboxFilter{KeyID: id, States: controlplane.LiveStates})
	if err == nil {
		for _, sb := range live {
			if err := s.cp.Stop(r.Context(), sb.ID, "key_revoked"); err != nil {
				s.log.Error("kill sandbox of revoked key", "sandbox_id", sb.ID, "err", err)
			}
		}
	}
	s.log.Info("api key revoked", "key_id", id)
	w.WriteHeader(http.StatusNoContent)
}
