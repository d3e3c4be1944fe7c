package rest

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// versionJSON is one version of a user template: SizeBytes is its root
// filesystem's apparent size, DiskBytes what it takes on disk; Published
// whether every key may use it.
type versionJSON struct {
	Version   int       `json:"version"`
	Published bool      `json:"published"`
	BuiltAt   time.Time `json:"built_at"`
	BuildMS   int64     `json:"build_ms"`
	SizeBytes int64     `json:"size_bytes"`
	DiskBytes int64     `json:"disk_bytes"`
	FromImage string    `json:"from_image"`
	Digest    string    `json:"digest,omitempty"`
}

type templateJSON struct {
	Name        string     `json:"name"`
	MemoryMiB   int        `json:"memory_mib,omitempty"`
	VCPUs       int        `json:"vcpus,omitempty"`
	State       string     `json:"state"`
	StaleReason string     `json:"stale_reason,omitempty"`
	BakedAt     *time.Time `json:"baked_at"`
	BakeMS      int64      `json:"bake_ms,omitempty"`
	// A user template's image (built with POST /v1/templates): the
	// version of this row (Version; the latest for shapes baked from
	// plain NAME), the template's LatestVersion (for a key other than its
	// owner's or an admin one, the latest published), Public (some
	// version is published), Owner (the building key's id, shown to
	// admin keys only; "" for one built before owners were recorded, an
	// admin keys' template) and every Versions the key may use.
	FromImage     string        `json:"from_image,omitempty"`
	Digest        string        `json:"digest,omitempty"`
	BuiltAt       *time.Time    `json:"built_at,omitempty"`
	BuildMS       int64         `json:"build_ms,omitempty"`
	SizeBytes     int64         `json:"size_bytes,omitempty"`
	DiskBytes     int64         `json:"disk_bytes,omitempty"`
	Version       int           `json:"version,omitempty"`
	LatestVersion int           `json:"latest_version,omitempty"`
	Public        *bool         `json:"public,omitempty"`
	Owner         string        `json:"owner,omitempty"`
	Versions      []versionJSON `json:"versions,omitempty"`
	// Its start and ready commands, shown to admin keys only (they may
	// hold secrets).
	StartCmd            string `json:"start_cmd,omitempty"`
	ReadyCmd            string `json:"ready_cmd,omitempty"`
	ReadyTimeoutSeconds int    `json:"ready_timeout_seconds,omitempty"`
}

// listTemplates lists the templates the caller may use
// (controlplane.Plane.ListTemplates) of those this server's host (or
// fleet) holds.
func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	rows, err := s.cp.ListTemplates(r.Context(), callerOf(r).Key, s.host)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]templateJSON, len(rows))
	for i, row := range rows {
		out[i] = templateOf(row)
	}
	writeJSON(w, http.StatusOK, map[string]any{"templates": out})
}

// templateOf is a template row as the API shows it.
func templateOf(row controlplane.TemplateRow) templateJSON {
	tj := templateJSON{Name: row.Name, MemoryMiB: row.MemoryMiB, VCPUs: row.VCPUs, State: row.State, StaleReason: row.StaleReason,
		BakedAt: row.BakedAt, BakeMS: row.BakeMS, FromImage: row.FromImage, Digest: row.Digest, BuiltAt: row.BuiltAt,
		BuildMS: row.BuildMS, SizeBytes: row.SizeBytes, DiskBytes: row.DiskBytes, Version: row.Version,
		LatestVersion: row.LatestVersion, Public: row.Public, Owner: row.Owner,
		StartCmd: row.StartCmd, ReadyCmd: row.ReadyCmd, ReadyTimeoutSeconds: row.ReadyTimeoutSeconds}
	for _, v := range row.Versions {
		tj.Versions = append(tj.Versions, versionJSON(v))
	}
	return tj
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
	p := s.host.TemplateParams(templateParam(r), req.MemoryMiB, req.VCPUs)
	if err := p.Validate(); err != nil {
		s.writeError(w, r, err)
		return
	}
	if _, _, err := s.host.Templates().Lookup(r.Context(), p); err != nil {
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

// TemplateBuilds builds user templates from container images: a
// tmplbuild.Manager in the server's process, or a remote host agent's
// (hostclient.Client). A server without it answers 501.
type TemplateBuilds = builds.Builder

// callerBuilds is the template builder for a request of the build
// endpoints; on false the error was answered.
func (s *Server) callerBuilds(w http.ResponseWriter, r *http.Request) (TemplateBuilds, bool) {
	b, err := s.cp.Builds()
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
// outcome is the build's status. What can refuse it is checked before its
// context is received (buildadmit.go).
func (s *Server) startBuild(w http.ResponseWriter, r *http.Request) {
	b, err := s.cp.Builds()
	if err != nil {
		s.refuse(w, r, err)
		return
	}
	key := callerOf(r).Key
	ctx, done, err := s.admitBuild(r.Context(), key)
	if err == nil && isMultipart(r) {
		err = s.checkContextSpace(r)
	}
	if err != nil {
		if done != nil {
			done()
		}
		s.refuse(w, r, err)
		return
	}
	defer done()
	r.Body = ctxBody{ctx: ctx, ReadCloser: r.Body}
	spec, err := s.buildSpecOf(r, func(name string) error { return s.cp.CheckBuildName(ctx, key, name) })
	if err != nil {
		s.refuse(w, r, err)
		return
	}
	err = s.cp.ClaimBuild(ctx, key, &spec)
	if err == nil {
		// Revoked while its context was received (the upload may have
		// ended first).
		k, kerr := s.cat.GetKey(ctx, key.ID)
		switch {
		case errors.Is(kerr, catalog.ErrNotFound) || (kerr == nil && k.Revoked()):
			err = errKeyRevoked
		case kerr != nil:
			err = fmt.Errorf("look up api key: %w", kerr)
		}
	}
	if err != nil {
		if spec.ContextTar != "" {
			os.Remove(spec.ContextTar)
		}
		s.refuse(w, r, err)
		return
	}
	// From here spec.ContextTar is the builder's, whatever Start returns.
	st, err := b.Start(ctx, spec)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", "/v1/templates/builds/"+st.ID)
	writeJSON(w, http.StatusAccepted, st)
}

func (s *Server) getBuild(w http.ResponseWriter, r *http.Request) {
	st, err := s.cp.GetBuild(r.Context(), callerOf(r).Key, chi.URLParam(r, "buildID"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// listBuilds lists the builds the key may read (its own; every build for
// an admin key), newest first, optionally of one template (?name=NAME):
// controlplane.Plane.ListBuilds.
func (s *Server) listBuilds(w http.ResponseWriter, r *http.Request) {
	out, err := s.cp.ListBuilds(r.Context(), callerOf(r).Key, r.URL.Query().Get("name"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"builds": out})
}

// buildLogs streams a build's progress lines as NDJSON, from the first,
// until it ends: {"line": "..."} each, then its final status
// ({"status": "succeeded"|"failed", "code", "error", ...}).
func (s *Server) buildLogs(w http.ResponseWriter, r *http.Request) {
	b, ok := s.callerBuilds(w, r)
	if !ok {
		return
	}
	id := chi.URLParam(r, "buildID")
	if _, err := s.cp.GetBuild(r.Context(), callerOf(r).Key, id); err != nil {
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

// deleteTemplate is DELETE /v1/templates/{name}[?force=true]
// (controlplane.Plane.DeleteTemplate).
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	if templateParam(r) == templates.NotAName {
		s.methodNotAllowed(w, r) // the list of builds, not a template
		return
	}
	if _, ok := s.callerBuilds(w, r); !ok {
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
	if err := s.cp.DeleteTemplate(r.Context(), callerOf(r).Key, templateParam(r), force); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// templateParam is the URL's {name}, unescaped: clients may escape the
// colon of NAME:N (%3A), and the router matches the escaped path.
func templateParam(r *http.Request) string {
	p := chi.URLParam(r, "name")
	if u, err := url.PathUnescape(p); err == nil {
		return u
	}
	return p
}

// publishTemplate is POST /v1/templates/{name}/publish (public) and
// /unpublish (controlplane.Plane.PublishTemplate), admin keys only. It
// answers the versions published after the change.
func (s *Server) publishTemplate(public bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := requireAdmin(r); err != nil {
			s.writeError(w, r, err)
			return
		}
		pub, err := s.cp.PublishTemplate(r.Context(), templateParam(r), public)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		out := map[string]any{"name": pub.Name, "public": len(pub.Versions) > 0, "published_versions": pub.Versions}
		if pub.Version > 0 {
			out["version"] = pub.Version
		}
		writeJSON(w, http.StatusOK, out)
	}
}
