package rest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
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

// listTemplates lists the templates the caller may use: the built-in
// ones, its own, the published ones (an admin key: all). An admin key sees
// every shape baked; other keys see each template at its default shape
// (which shapes others had baked is theirs to know). A user template's
// rows carry its versions.
func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	key := callerOf(r).Key
	store := s.host.Templates()
	baked, err := store.List(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	users, err := s.cp.UserVersions(r.Context()) // by name, the versions
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	view := newTemplateView(key, users)
	if !key.Admin {
		var defaults []templates.Meta
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
		if !view.visible(t.Name) {
			continue
		}
		name, v, _ := templates.SplitRef(t.Name)
		_, reason, err := store.Lookup(r.Context(), t.Params)
		if errors.Is(err, templates.ErrNotFound) {
			continue // its root filesystem is gone
		}
		if _, ok := users[name]; ok && v == 0 && reason != "" {
			continue // a shape of an earlier latest version: the pinned rows say more
		}
		seen[name] = true
		tj := templateJSON{Name: name, Version: v, MemoryMiB: t.MemoryMiB, VCPUs: t.VCPUs, State: "ready", BakeMS: t.BakeMS}
		at := t.BakedAt
		tj.BakedAt = &at
		if reason != "" {
			tj.State, tj.StaleReason = "stale", reason
		}
		out = append(out, tj)
	}
	names, err := store.Names(r.Context())
	if err != nil {
		s.log.Warn("list template names of host", "host_id", s.cp.Config().HostID, "err", err)
	}
	for _, name := range names {
		if !seen[name] && view.visibleName(name) {
			p := s.host.TemplateParams(name, 0, 0)
			out = append(out, templateJSON{Name: name, MemoryMiB: p.MemoryMiB, VCPUs: p.VCPUs, State: "not_baked"})
		}
	}
	for i := range out {
		view.describe(&out[i], key.Admin)
	}
	sortTemplateRows(out)
	if out == nil {
		out = []templateJSON{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"templates": out})
}

// templateView is what one key may see of the user templates: users
// holds every user template's versions by name; usable, by name, the
// versions the key may use (its own and an admin key's: all; others':
// the published ones). A template with none usable is not listed. A
// version the registry does not list is a deleted one's (a host of a
// fleet that was away keeps it until its next start): not listed.
type templateView struct {
	users, usable map[string][]templates.UserRootFS
}

func newTemplateView(key catalog.Key, users map[string][]templates.UserRootFS) templateView {
	usable := map[string][]templates.UserRootFS{}
	for name, vs := range users {
		if uv := controlplane.UsableVersions(key, vs); len(uv) > 0 {
			usable[name] = uv
		}
	}
	return templateView{users: users, usable: usable}
}

// visible reports whether a template baked as ref is listed: a built-in,
// or a version the key may use (for a shape of plain NAME, the latest
// version's: only if that one is usable).
func (tv templateView) visible(ref string) bool {
	name, v, err := templates.SplitRef(ref)
	vs, ok := tv.users[name]
	switch {
	case err != nil:
		return false
	case !ok:
		return v == 0
	case v == 0:
		uv := tv.usable[name]
		return len(uv) > 0 && uv[len(uv)-1].Version == vs[len(vs)-1].Version
	}
	return slices.ContainsFunc(tv.usable[name], func(u templates.UserRootFS) bool { return u.Version == v })
}

// visibleName reports whether template name, not baked, is listed: a
// built-in, or a user template with a version the key may use.
func (tv templateView) visibleName(name string) bool {
	_, user := tv.users[name]
	return !user || len(tv.usable[name]) > 0
}

// describe fills in a user template's row with what the key may see of
// it: its row's version (the latest for a shape of plain NAME), the
// latest and every usable version, whether it is public, and for an
// admin key its owner and commands. Other rows stay as they are.
func (tv templateView) describe(tj *templateJSON, admin bool) {
	vs, ok := tv.usable[tj.Name]
	if !ok {
		return
	}
	latest := vs[len(vs)-1]
	if tj.Version == 0 {
		tj.Version = latest.Version
	}
	pub := slices.ContainsFunc(vs, func(u templates.UserRootFS) bool { return u.Published })
	tj.LatestVersion, tj.Public = latest.Version, &pub
	if admin {
		tj.Owner = latest.Owner
		tj.StartCmd, tj.ReadyCmd, tj.ReadyTimeoutSeconds = latest.StartCmd, latest.ReadyCmd, latest.ReadyTimeoutSeconds
	}
	for _, u := range vs {
		tj.Versions = append(tj.Versions, versionJSON{Version: u.Version, Published: u.Published, BuiltAt: u.BuiltAt, BuildMS: u.BuildMS,
			SizeBytes: u.SizeBytes, DiskBytes: u.DiskBytes, FromImage: u.Source, Digest: u.Digest})
		if u.Version == tj.Version {
			at := u.BuiltAt
			tj.FromImage, tj.Digest, tj.BuiltAt, tj.BuildMS = u.Source, u.Digest, &at, u.BuildMS
			tj.SizeBytes, tj.DiskBytes = u.SizeBytes, u.DiskBytes
		}
	}
}

// sortTemplateRows sorts rows by name, then newest version first, then
// smallest memory first.
func sortTemplateRows(out []templateJSON) {
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		if out[i].Version != out[j].Version {
			return out[i].Version > out[j].Version
		}
		return out[i].MemoryMiB < out[j].MemoryMiB
	})
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

// DefaultMaxTemplatesPerKey is Config.MaxTemplatesPerKey's default.
const DefaultMaxTemplatesPerKey = 20

func (s *Server) builds() (TemplateBuilds, error) {
	b := s.cp.Config().Templates
	if b == nil {
		return nil, errorf(controlplane.NotImplemented, "this server does not build templates; built-in templates work everywhere")
	}
	return b, nil
}

// callerBuilds is the template builder for a request of the build
// endpoints; on false the error was answered.
func (s *Server) callerBuilds(w http.ResponseWriter, r *http.Request) (TemplateBuilds, bool) {
	b, err := s.builds()
	if err != nil {
		s.writeError(w, r, err)
		return nil, false
	}
	return b, true
}

// buildSpecOwner fills in the owner of a build of spec.Name by key and the
// bounds the builder checks again when it starts it (buildadmit.go): any
// key may build a new name, which it then owns (up to MaxTemplatesPerKey
// of them, admin keys unbounded); only the owner or an admin key may
// rebuild one (another key's name is taken: 409, whether it may see it or
// not), up to MaxTemplateVersions versions; a key has at most
// MaxTemplateBuildsPerKey builds queued or running.
func (s *Server) buildSpecOwner(ctx context.Context, b TemplateBuilds, key catalog.Key, spec *builds.Spec) error {
	spec.Owner = key.ID
	if !key.Admin {
		spec.MaxTemplates = max(s.cfg.MaxTemplatesPerKey, 0)
		spec.MaxBuilds = max(s.cfg.MaxTemplateBuildsPerKey, 0)
		spec.MaxVersions = max(s.cfg.MaxTemplateVersions, 0)
	}
	u, err := b.UserTemplate(ctx, spec.Name)
	if errors.Is(err, templates.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if !key.Admin && (u.Owner == "" || u.Owner != key.ID) {
		return conflict("the template name %s is taken; pick another", spec.Name)
	}
	return nil
}

// visibleBuild returns build id's status if key may read it: the key that
// started it, or an admin key; another key's build is not found.
func visibleBuild(ctx context.Context, b TemplateBuilds, key catalog.Key, id string) (builds.Status, error) {
	st, err := b.Get(ctx, id)
	if err != nil {
		return st, err
	}
	if !key.Admin && st.Owner != key.ID {
		return builds.Status{}, notFound("template build %q not found", id)
	}
	return st, nil
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
	b, err := s.builds()
	if err != nil {
		s.refuse(w, r, err)
		return
	}
	key := callerOf(r).Key
	ctx, done, err := s.admitBuild(r.Context(), b, key)
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
	spec, err := s.buildSpecOf(r, func(name string) error { return s.checkBuildName(ctx, b, key, name) })
	if err != nil {
		s.refuse(w, r, err)
		return
	}
	err = s.buildSpecOwner(ctx, b, key, &spec)
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
	b, ok := s.callerBuilds(w, r)
	if !ok {
		return
	}
	st, err := visibleBuild(r.Context(), b, callerOf(r).Key, chi.URLParam(r, "buildID"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// listBuilds lists the builds the key may read (its own; every build for
// an admin key), newest first, optionally of one template (?name=NAME).
func (s *Server) listBuilds(w http.ResponseWriter, r *http.Request) {
	b, ok := s.callerBuilds(w, r)
	if !ok {
		return
	}
	key, name := callerOf(r).Key, r.URL.Query().Get("name")
	list, err := b.List(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := []builds.Status{}
	for _, st := range list {
		if (key.Admin || st.Owner == key.ID) && (name == "" || st.Name == name) {
			out = append(out, st)
		}
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
	if _, err := visibleBuild(r.Context(), b, callerOf(r).Key, id); err != nil {
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
