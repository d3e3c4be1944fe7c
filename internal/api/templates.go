package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/catalog"
	"github.com/pandastack/pandastack/internal/template"
	"github.com/pandastack/pandastack/internal/tmplbuild"
)

type templateJSON struct {
	Name        string     `json:"name"`
	MemoryMiB   int        `json:"memory_mib,omitempty"`
	VCPUs       int        `json:"vcpus,omitempty"`
	State       string     `json:"state"`
	StaleReason string     `json:"stale_reason,omitempty"`
	BakedAt     *time.Time `json:"baked_at"`
	BakeMS      int64      `json:"bake_ms,omitempty"`
	// A user template's image (built with POST /v1/templates).
	FromImage string     `json:"from_image,omitempty"`
	Digest    string     `json:"digest,omitempty"`
	BuiltAt   *time.Time `json:"built_at,omitempty"`
	// Its start and ready commands, shown to admin keys only (they may
	// hold secrets).
	StartCmd            string `json:"start_cmd,omitempty"`
	ReadyCmd            string `json:"ready_cmd,omitempty"`
	ReadyTimeoutSeconds int    `json:"ready_timeout_seconds,omitempty"`
}

// listTemplates lists the templates. An admin key sees every shape baked;
// other keys see each template at its default shape (which shapes others
// had baked is theirs to know).
func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	store := s.host.Templates()
	baked, err := store.List()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !callerOf(r).Key.Admin {
		var defaults []template.Template
		for _, t := range baked {
			if t.Params == s.host.TemplateParams(t.Name, 0, 0) {
				defaults = append(defaults, t)
			}
		}
		baked = defaults
	}
	var out []templateJSON
	seen := map[string]bool{}
	for _, t := range baked {
		seen[t.Name] = true
		_, reason, err := store.Lookup(t.Params)
		if errors.Is(err, template.ErrNotFound) {
			continue // its root filesystem is gone
		}
		tj := templateJSON{Name: t.Name, MemoryMiB: t.MemoryMiB, VCPUs: t.VCPUs, State: "ready", BakeMS: t.BakeMS}
		at := t.BakedAt
		tj.BakedAt = &at
		if reason != "" {
			tj.State, tj.StaleReason = "stale", reason
		}
		out = append(out, tj)
	}
	for _, name := range store.Names() {
		if !seen[name] {
			p := s.host.TemplateParams(name, 0, 0)
			out = append(out, templateJSON{Name: name, MemoryMiB: p.MemoryMiB, VCPUs: p.VCPUs, State: "not_baked"})
		}
	}
	if b, err := s.builds(); err == nil {
		if users, err := b.UserTemplates(); err == nil {
			byName := map[string]template.UserRootFS{}
			for _, u := range users {
				byName[u.Name] = u
			}
			for i := range out {
				if u, ok := byName[out[i].Name]; ok {
					at := u.BuiltAt
					out[i].FromImage, out[i].Digest, out[i].BuiltAt = u.Source, u.Digest, &at
					if callerOf(r).Key.Admin {
						out[i].StartCmd, out[i].ReadyCmd, out[i].ReadyTimeoutSeconds = u.StartCmd, u.ReadyCmd, u.ReadyTimeoutSeconds
					}
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].MemoryMiB < out[j].MemoryMiB
	})
	if out == nil {
		out = []templateJSON{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"templates": out})
}

func (s *Server) bakeTemplate(w http.ResponseWriter, r *http.Request) {
	if err := requireAdmin(r); err != nil {
		s.writeError(w, r, err)
		return
	}
	var req struct {
		MemoryMiB int `json:"memory_mib"`
		VCPUs     int `json:"vcpus"`
	}
	if err := decodeJSON(r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	p := s.host.TemplateParams(chi.URLParam(r, "name"), req.MemoryMiB, req.VCPUs)
	if err := p.Validate(); err != nil {
		s.writeError(w, r, err)
		return
	}
	if _, _, err := s.host.Templates().Lookup(p); err != nil {
		s.writeError(w, r, err)
		return
	}
	out := newNDJSON(w)
	t, err := s.host.Templates().Bake(r.Context(), p, func(msg string) {
		out.send(map[string]string{"type": "progress", "message": msg})
	})
	if err != nil {
		s.metrics.bakes.WithLabelValues("error").Inc()
		ae := classify(err)
		if ae.Code == "internal" {
			ae.Message = err.Error() // bake failures explain themselves (console tail)
		}
		out.send(map[string]any{"type": "error", "error": errorDetail{Code: ae.Code, Message: ae.Message}})
		return
	}
	s.metrics.bakes.WithLabelValues("ok").Inc()
	at := t.BakedAt
	out.send(map[string]any{"type": "done", "template": templateJSON{
		Name: t.Name, MemoryMiB: t.MemoryMiB, VCPUs: t.VCPUs, State: "ready", BakedAt: &at, BakeMS: t.BakeMS,
	}})
}

// TemplateBuilds builds user templates from container images
// (*tmplbuild.Manager, which documents the contracts). A server without
// it (Config.TemplateBuilds nil: its hosts are remote) answers 501.
type TemplateBuilds interface {
	Start(spec tmplbuild.Spec) (tmplbuild.Status, error)
	Get(id string) (tmplbuild.Status, error)
	Follow(ctx context.Context, id string, line func(string)) (tmplbuild.Status, error)
	Remove(name string) error
	UserTemplates() ([]template.UserRootFS, error)
}

func (s *Server) builds() (TemplateBuilds, error) {
	if s.cfg.TemplateBuilds == nil {
		return nil, errorf(http.StatusNotImplemented, "not_implemented", "this server does not build templates from images (only `panda up` does so far)")
	}
	return s.cfg.TemplateBuilds, nil
}

// adminBuilds is the template builder for a request of the build
// endpoints, which need an admin key; on false the error was answered.
func (s *Server) adminBuilds(w http.ResponseWriter, r *http.Request) (TemplateBuilds, bool) {
	err := requireAdmin(r)
	var b TemplateBuilds
	if err == nil {
		b, err = s.builds()
	}
	if err != nil {
		s.writeError(w, r, err)
		return nil, false
	}
	return b, true
}

// checkImageRef accepts registry references only: the other sources the
// builder knows (oci:DIR, docker-archive:FILE, paths) name files of the
// server's host.
func checkImageRef(ref string) error {
	r := strings.TrimPrefix(ref, "docker://")
	switch {
	case r == "":
		return invalid("from_image is required: an image reference such as registry.example.com/app:1.0")
	case len(r) > 512 || strings.ContainsAny(r, " \t\r\n\x00"):
		return invalid("from_image %q is not an image reference", ref)
	case strings.HasPrefix(r, "/") || strings.HasPrefix(r, ".") || strings.HasSuffix(r, ".tar") ||
		strings.HasPrefix(r, "oci:") || strings.HasPrefix(r, "docker-archive:"):
		return invalid("from_image must be a registry reference (registry.example.com/app:1.0); files of the server cannot be built from")
	}
	return nil
}

// startBuild starts building a user template from an image or a
// Dockerfile (the request: buildrequest.go): 202 with the build's id; its
// outcome is the build's status.
func (s *Server) startBuild(w http.ResponseWriter, r *http.Request) {
	b, ok := s.adminBuilds(w, r)
	if !ok {
		return
	}
	spec, err := s.buildSpecOf(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	// From here spec.ContextTar is the builder's, whatever Start returns.
	st, err := b.Start(spec)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/templates/builds/"+st.ID)
	writeJSON(w, http.StatusAccepted, st)
}

func (s *Server) getBuild(w http.ResponseWriter, r *http.Request) {
	b, ok := s.adminBuilds(w, r)
	if !ok {
		return
	}
	st, err := b.Get(chi.URLParam(r, "buildID"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// buildLogs streams a build's progress lines as NDJSON, from the first,
// until it ends: {"line": "..."} each, then its final status
// ({"status": "succeeded"|"failed", "code", "error", ...}).
func (s *Server) buildLogs(w http.ResponseWriter, r *http.Request) {
	b, ok := s.adminBuilds(w, r)
	if !ok {
		return
	}
	id := chi.URLParam(r, "buildID")
	if _, err := b.Get(id); err != nil {
		s.writeError(w, r, err)
		return
	}
	out := newNDJSON(w)
	st, err := b.Follow(r.Context(), id, func(line string) {
		out.send(map[string]string{"line": line})
	})
	if err != nil {
		return // the client went away, or the build was forgotten
	}
	out.send(st)
}

// deleteTemplate removes a user template: its root filesystem and every
// shape baked from it. Refused (409) while live sandboxes of the template
// are in the catalog, unless ?force=true: they keep running on their own
// files either way.
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	b, ok := s.adminBuilds(w, r)
	if !ok {
		return
	}
	name := chi.URLParam(r, "name")
	for _, builtin := range template.Reserved {
		if name == builtin {
			s.writeError(w, r, invalid("%s is a built-in template; it cannot be deleted", name))
			return
		}
	}
	users, err := b.UserTemplates()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if !slices.ContainsFunc(users, func(u template.UserRootFS) bool { return u.Name == name }) {
		s.writeError(w, r, notFound("no template %q built from an image", name))
		return
	}
	force := false
	switch r.URL.Query().Get("force") {
	case "", "false":
	case "true":
		force = true
	default:
		s.writeError(w, r, invalid("force must be true or false"))
		return
	}
	if !force {
		live, err := s.cat.ListSandboxes(r.Context(), catalog.SandboxFilter{States: liveStates})
		if err != nil {
			s.writeError(w, r, fmt.Errorf("list sandboxes: %w", err))
			return
		}
		n := 0
		for _, sb := range live {
			if sb.Template == name {
				n++
			}
		}
		if n > 0 {
			s.writeError(w, r, conflict("sandboxes of template %s are not stopped (%d); kill them first, or delete with ?force=true (they keep running)", name, n))
			return
		}
	}
	if err := b.Remove(name); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

var _ TemplateBuilds = (*tmplbuild.Manager)(nil)
