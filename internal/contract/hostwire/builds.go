package hostwire

import (
	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
)

// Template builds over the host API: a control plane whose host is a
// remote agent builds user templates on that agent, whose template store
// keeps them. The client's Builds is a builds.Builder over these
// endpoints:
//
//	POST   /template-builds                   multipart: part "spec" (JSON BuildSpec), then part "context" (the tar, optional)
//	GET    /template-builds                   {"builds": [BuildStatus]}
//	GET    /template-builds/{id}              BuildStatus
//	GET    /template-builds/{id}/log          NDJSON: {"line": "..."}..., then {"status": BuildStatus} or {"error": Error} (BuildLogEvent)
//	POST   /template-builds/{id}/cancel       {"why": "..."} -> BuildStatus (builds.Canceler)
//	GET    /user-templates                    {"templates": [UserTemplate]}, the latest version of each
//	GET    /user-templates/{ref}              UserTemplate
//	GET    /user-templates/{name}/versions    {"versions": [UserTemplate]}, oldest first
//	DELETE /user-templates/{ref}
//	PUT    /user-templates/{ref}/public       {"public": bool}: publish or withdraw versions (builds.Builder.SetPublished)
//
// An agent without builds answers 501.

// BuildSpec is builds.Spec on the wire, without ContextTar (the
// request's "context" part).
type BuildSpec struct {
	Name         string            `json:"name"`
	FromImage    string            `json:"from_image,omitempty"`
	Dockerfile   []byte            `json:"dockerfile,omitempty"`
	BuildArgs    map[string]string `json:"build_args,omitempty"`
	Startup      templates.Startup `json:"startup"`
	Owner        string            `json:"owner,omitempty"`
	MaxTemplates int               `json:"max_templates,omitempty"`
	MaxBuilds    int               `json:"max_builds,omitempty"`
	MaxVersions  int               `json:"max_versions,omitempty"`
	ID           string            `json:"id,omitempty"`
	Version      int               `json:"version,omitempty"`
}

// BuildSpecOf is spec on the wire (but its ContextTar).
func BuildSpecOf(spec builds.Spec) BuildSpec {
	return BuildSpec{Name: spec.Name, FromImage: spec.FromImage, Dockerfile: spec.Dockerfile, BuildArgs: spec.BuildArgs,
		Startup: spec.Startup, Owner: spec.Owner, MaxTemplates: spec.MaxTemplates, MaxBuilds: spec.MaxBuilds, MaxVersions: spec.MaxVersions,
		ID: spec.ID, Version: spec.Version}
}

// Contract is the spec s carries, without a context.
func (s BuildSpec) Contract() builds.Spec {
	return builds.Spec{Name: s.Name, FromImage: s.FromImage, Dockerfile: s.Dockerfile, BuildArgs: s.BuildArgs,
		Startup: s.Startup, Owner: s.Owner, MaxTemplates: s.MaxTemplates, MaxBuilds: s.MaxBuilds, MaxVersions: s.MaxVersions,
		ID: s.ID, Version: s.Version}
}

// BuildStatus is builds.Status with its owner, which the API checks (and
// builds.Status does not encode).
type BuildStatus struct {
	builds.Status
	Owner string `json:"owner,omitempty"`
}

// BuildStatusOf is st on the wire.
func BuildStatusOf(st builds.Status) BuildStatus { return BuildStatus{Status: st, Owner: st.Owner} }

// Contract is the status b carries.
func (b BuildStatus) Contract() builds.Status {
	st := b.Status
	st.Owner = b.Owner
	return st
}

// UserTemplate is templates.UserRootFS with what it takes on disk, which
// is measured when read (and templates.UserRootFS does not encode).
type UserTemplate struct {
	templates.UserRootFS
	DiskBytes int64 `json:"disk_bytes,omitempty"`
}

// UserTemplateOf is u on the wire.
func UserTemplateOf(u templates.UserRootFS) UserTemplate {
	return UserTemplate{UserRootFS: u, DiskBytes: u.DiskBytes}
}

// UserTemplatesOf is us on the wire.
func UserTemplatesOf(us []templates.UserRootFS) []UserTemplate {
	out := make([]UserTemplate, len(us))
	for i, u := range us {
		out[i] = UserTemplateOf(u)
	}
	return out
}

// Contract is the user template u carries.
func (u UserTemplate) Contract() templates.UserRootFS {
	r := u.UserRootFS
	r.DiskBytes = u.DiskBytes
	return r
}

// BuildLogEvent is a line of GET /template-builds/{id}/log: one of its
// fields is set.
type BuildLogEvent struct {
	Line   *string      `json:"line,omitempty"`
	Status *BuildStatus `json:"status,omitempty"`
	Error  *Error       `json:"error,omitempty"`
}
