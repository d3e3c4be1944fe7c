package api

import (
	"errors"
	"net/http"
	"sort"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/template"
)

type templateJSON struct {
	Name        string     `json:"name"`
	MemoryMiB   int        `json:"memory_mib,omitempty"`
	VCPUs       int        `json:"vcpus,omitempty"`
	State       string     `json:"state"`
	StaleReason string     `json:"stale_reason,omitempty"`
	BakedAt     *time.Time `json:"baked_at"`
	BakeMS      int64      `json:"bake_ms,omitempty"`
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
