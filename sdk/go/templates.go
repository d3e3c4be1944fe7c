package pandastack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/pandastack/pandastack/sdk/go/internal/wire"
)

// Template states.
const (
	TemplateReady    = "ready"
	TemplateStale    = "stale"
	TemplateNotBaked = "not_baked"
	TemplateBaking   = "baking"
)

// Template is a root filesystem sandboxes start from, in one baked shape
// (memory size and vCPUs). A user template (BuildTemplate) has versions:
// each build makes one; its entries say which Version they are and list
// them all.
type Template struct {
	Name        string    `json:"name"`
	MemoryMiB   int       `json:"memory_mib,omitempty"`
	VCPUs       int       `json:"vcpus,omitempty"`
	State       string    `json:"state"` // ready, stale, not_baked, baking
	StaleReason string    `json:"stale_reason,omitempty"`
	BakedAt     time.Time `json:"baked_at,omitzero"`
	BakeMS      int64     `json:"bake_ms,omitempty"`
	// A user template's image (BuildTemplate) for this entry's Version;
	// empty for built-in ones. SizeBytes is its root filesystem's apparent
	// size, DiskBytes the disk space it takes.
	FromImage string    `json:"from_image,omitempty"`
	Digest    string    `json:"digest,omitempty"`
	BuiltAt   time.Time `json:"built_at,omitzero"`
	BuildMS   int64     `json:"build_ms,omitempty"`
	SizeBytes int64     `json:"size_bytes,omitempty"`
	DiskBytes int64     `json:"disk_bytes,omitempty"`
	// Version is the version of a user template this entry is (0 for
	// built-in templates); LatestVersion the one "NAME" means for this
	// key (the latest for its owner and admin keys, the latest published
	// for other keys); Versions all of them this key may use, oldest
	// first.
	Version       int               `json:"version,omitempty"`
	LatestVersion int               `json:"latest_version,omitempty"`
	Versions      []TemplateVersion `json:"versions,omitempty"`
	// Public: some version of the user template is published, usable by
	// every key (PublishTemplate; TemplateVersion.Published says which).
	// Owner is the id of the key that built it, listed for admin keys
	// only ("" also for templates built before owners were recorded).
	Public bool   `json:"public,omitempty"`
	Owner  string `json:"owner,omitempty"`
	// Its start and ready commands (WithStartCmd, WithReadyCmd); listed
	// for admin keys only.
	StartCmd            string `json:"start_cmd,omitempty"`
	ReadyCmd            string `json:"ready_cmd,omitempty"`
	ReadyTimeoutSeconds int    `json:"ready_timeout_seconds,omitempty"`
}

// TemplateVersion is one version of a user template.
type TemplateVersion struct {
	Version int `json:"version"`
	// Published: every key may use this version (PublishTemplate).
	Published bool      `json:"published"`
	BuiltAt   time.Time `json:"built_at"`
	BuildMS   int64     `json:"build_ms"`
	SizeBytes int64     `json:"size_bytes"`
	DiskBytes int64     `json:"disk_bytes"`
	FromImage string    `json:"from_image"`
	Digest    string    `json:"digest,omitempty"`
}

// TemplateRef is the reference to version v of template name, "NAME:V"
// (for a sandbox's Template); name itself for v 0 (the latest).
func TemplateRef(name string, v int) string {
	if v == 0 {
		return name
	}
	return fmt.Sprintf("%s:%d", name, v)
}

// Templates lists the templates the key may use (built-in ones, its own,
// published ones; an admin key: all), one entry per baked shape.
func (c *Client) Templates(ctx context.Context) ([]Template, error) {
	var out struct {
		Templates []Template `json:"templates"`
	}
	if err := c.doJSON(ctx, http.MethodGet, path("templates"), nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Templates, nil
}

// BakeTemplate bakes (or re-bakes) the template name for a shape (0 for
// the server's defaults) and returns it ready. progress, if not nil, is
// called with each progress message. Admin keys only.
func (c *Client) BakeTemplate(ctx context.Context, name string, memoryMiB, vcpus int, progress func(string)) (Template, error) {
	if name == "" {
		return Template{}, newError(0, CodeInvalid, "template name is empty")
	}
	in := wire.BakeTemplateJSONRequestBody{MemoryMib: optional(memoryMiB), Vcpus: optional(vcpus)}
	b, err := json.Marshal(in)
	if err != nil {
		return Template{}, fmt.Errorf("encode request: %w", err)
	}
	req, err := c.newRequest(ctx, http.MethodPost, path("templates", name, "bake"), nil, bytesReader(b), "application/json")
	if err != nil {
		return Template{}, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.send(req)
	if err != nil {
		return Template{}, err
	}
	defer resp.Body.Close()
	ev, err := readProgressStream(resp.Body, "bake", "the template was baked", progress)
	if err != nil {
		return Template{}, err
	}
	if ev.Template == nil {
		return Template{}, newError(0, CodeInternal, "bake: done event without a template")
	}
	return *ev.Template, nil
}

// progressEvent is a line of a stream of progress (a bake's, a create's
// with CreateOptions.Progress): progress lines, then done or error.
type progressEvent struct {
	Type     string       `json:"type"`
	Message  string       `json:"message"`
	Template *Template    `json:"template"` // a bake's done
	Sandbox  *SandboxInfo `json:"sandbox"`  // a create's done
	Error    *Error       `json:"error"`
}

// readProgressStream calls progress with each progress line of r and
// returns its done event, or its error as an *Error. what names the
// operation in errors, until what a stream cut short never reached.
func readProgressStream(r io.Reader, what, until string, progress func(string)) (progressEvent, error) {
	dec := json.NewDecoder(r)
	for {
		var ev progressEvent
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return ev, fmt.Errorf("%s: %w before %s", what, ErrStreamEnded, until)
			}
			return ev, fmt.Errorf("%s: read progress stream: %w", what, err)
		}
		switch ev.Type {
		case "progress":
			if progress != nil {
				progress(ev.Message)
			}
		case "done":
			return ev, nil
		case "error":
			if ev.Error == nil {
				return ev, newError(0, CodeInternal, what+": error event without an error")
			}
			return ev, newError(0, ev.Error.Code, ev.Error.Message)
		}
	}
}

// Template build states and failure codes (TemplateBuild).
const (
	BuildQueued    = "queued"
	BuildRunning   = "running"
	BuildSucceeded = "succeeded"
	BuildFailed    = "failed"

	CodeImageNotFound = "image_not_found"
	CodeBuildFailed   = "build_failed"
	CodeCanceled      = "canceled"
	// CodeInterrupted: the server restarted during the build.
	CodeInterrupted = "interrupted"
)

// TemplateBuild is a build of a user template from a container image.
type TemplateBuild struct {
	ID        string `json:"build_id"`
	Name      string `json:"name"`
	FromImage string `json:"from_image"`
	Status    string `json:"status"` // queued, running, succeeded, failed
	Code      string `json:"code,omitempty"`
	Error     string `json:"error,omitempty"`
	Digest    string `json:"digest,omitempty"`
	// Version is the template version the build made (once succeeded).
	Version   int       `json:"version,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	StartedAt time.Time `json:"started_at,omitzero"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	// HostID is, on a fleet, the host that runs the build.
	HostID string `json:"host_id,omitempty"`
}

// BuildOption is an option of a template build (StartTemplateBuild,
// BuildTemplate).
type BuildOption func(*buildRequest)

// buildRequest is what a build's options made: body() is its JSON.
type buildRequest struct {
	Name                string
	FromImage           string
	Dockerfile          *string
	DockerfilePath      string
	BuildArgs           map[string]string
	StartCmd            string
	ReadyCmd            string
	ReadyTimeoutSeconds int

	contextProgress func(ContextStats)
}

// body is r as the JSON body of POST /v1/templates (or its spec part).
func (r *buildRequest) body() wire.BuildTemplateJSONRequestBody {
	return wire.BuildTemplateJSONRequestBody{
		Name: r.Name, FromImage: optional(r.FromImage), Dockerfile: r.Dockerfile, DockerfilePath: optional(r.DockerfilePath),
		BuildArgs: optionalMap(r.BuildArgs), StartCmd: optional(r.StartCmd), ReadyCmd: optional(r.ReadyCmd),
		ReadyTimeoutSeconds: optional(r.ReadyTimeoutSeconds),
	}
}

// WithStartCmd makes the template's bake start cmd (a /bin/sh -c script,
// with the image's Env and WorkingDir) in the background before the
// snapshot: every sandbox of the template starts with that process
// running, each its own copy. Its output goes to /var/log/start.log in
// the guest. The build then bakes the template at the server's default
// shape and fails if the command cannot start or, with WithReadyCmd,
// never gets ready.
func WithStartCmd(cmd string) BuildOption { return func(r *buildRequest) { r.StartCmd = cmd } }

// WithReadyCmd makes the bake run cmd (a /bin/sh -c script; each run at
// most 10 s) until it exits 0 before the snapshot, e.g. a check that the
// start command's server answers. If it does not succeed within the ready
// timeout (WithReadyTimeout; default 60 s) the build fails with the last
// lines of its output and of the start command's.
func WithReadyCmd(cmd string) BuildOption { return func(r *buildRequest) { r.ReadyCmd = cmd } }

// WithReadyTimeout bounds the wait for the ready command (whole seconds,
// at most 30 minutes; 0 for the default, 60 s).
func WithReadyTimeout(d time.Duration) BuildOption {
	return func(r *buildRequest) { r.ReadyTimeoutSeconds = int((d + time.Second - 1) / time.Second) }
}

// StartTemplateBuild starts building template name from the container
// image fromImage (a registry reference) and returns the build, queued.
// Any key may build: a new name is the key's own and private to it until
// an admin key publishes it (PublishTemplate); another key's name is
// refused (CodeConflict). Each build that succeeds is a new version. Only
// `panda up` builds templates.
func (c *Client) StartTemplateBuild(ctx context.Context, name, fromImage string, opts ...BuildOption) (TemplateBuild, error) {
	in := &buildRequest{Name: name, FromImage: fromImage}
	for _, o := range opts {
		o(in)
	}
	var out TemplateBuild
	err := c.doJSON(ctx, http.MethodPost, path("templates"), nil, in.body(), &out)
	return out, err
}

// TemplateBuild returns the status of a build.
func (c *Client) TemplateBuild(ctx context.Context, buildID string) (TemplateBuild, error) {
	var out TemplateBuild
	err := c.doJSON(ctx, http.MethodGet, path("templates", "builds", buildID), nil, nil, &out)
	return out, err
}

// TemplateBuilds lists the builds the key may read (its own; every build
// for an admin key), newest first; name, if not empty, keeps that
// template's only. Builds are forgotten an hour after they end.
func (c *Client) TemplateBuilds(ctx context.Context, name string) ([]TemplateBuild, error) {
	var q url.Values
	if name != "" {
		q = url.Values{"name": {name}}
	}
	var out struct {
		Builds []TemplateBuild `json:"builds"`
	}
	err := c.doJSON(ctx, http.MethodGet, path("templates", "builds"), q, nil, &out)
	return out.Builds, err
}

// FollowTemplateBuild calls progress (if not nil) with each progress line
// of a build, from the first, and returns the build once it has ended
// (succeeded or failed: see its Status).
func (c *Client) FollowTemplateBuild(ctx context.Context, buildID string, progress func(string)) (TemplateBuild, error) {
	req, err := c.newRequest(ctx, http.MethodGet, path("templates", "builds", buildID, "logs"), nil, nil, "")
	if err != nil {
		return TemplateBuild{}, err
	}
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.send(req)
	if err != nil {
		return TemplateBuild{}, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev struct {
			Line *string `json:"line"`
			TemplateBuild
		}
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return TemplateBuild{}, fmt.Errorf("template build %s: %w before it ended", buildID, ErrStreamEnded)
			}
			return TemplateBuild{}, fmt.Errorf("template build %s: read progress stream: %w", buildID, err)
		}
		if ev.Line != nil {
			if progress != nil {
				progress(*ev.Line)
			}
			continue
		}
		if ev.Status != "" {
			return ev.TemplateBuild, nil
		}
	}
}

// BuildTemplate builds template name from the container image fromImage
// (a registry reference such as "registry.example.com/app:1.0"), calling
// progress (if not nil) with each progress line, and returns once it is
// built. A failed build is an *Error whose Code is the build's
// (CodeImageNotFound, CodeBuildFailed, CodeCanceled). Sandboxes created
// with Template name then start from it; the image's Env and WorkingDir
// are the defaults of their commands. opts may give the template a start
// and a ready command (WithStartCmd, WithReadyCmd), whose first run is
// part of the build. Rebuilding makes a new version (the build's
// Version): sandboxes made earlier keep theirs, and Template "NAME:N"
// (TemplateRef) pins one.
func (c *Client) BuildTemplate(ctx context.Context, name, fromImage string, progress func(string), opts ...BuildOption) (TemplateBuild, error) {
	b, err := c.StartTemplateBuild(ctx, name, fromImage, opts...)
	if err != nil {
		return b, err
	}
	return c.followToEnd(ctx, b, progress)
}

// DeleteTemplate deletes user template name, "NAME" (every version and
// every shape baked from them) or "NAME:N" (one version, not the latest).
// Without force it is refused (CodeConflict) while sandboxes of it are not
// stopped or snapshots of it exist. Its owner or an admin key only.
func (c *Client) DeleteTemplate(ctx context.Context, name string, force bool) error {
	if name == "" {
		return newError(0, CodeInvalid, "template name is empty")
	}
	var q url.Values
	if force {
		q = url.Values{"force": {"true"}}
	}
	return c.doJSON(ctx, http.MethodDelete, path("templates", name), q, nil, nil)
}

// PublishTemplate publishes a version of user template name for every key
// (public true): "NAME" its latest version (as it is now), "NAME:N"
// version N. Publishing is per version: other keys' "NAME" means the
// latest published version, and a version built later is its owner's
// alone until it is published in turn. With public false it withdraws
// "NAME:N", or every version of "NAME". Admin keys only.
func (c *Client) PublishTemplate(ctx context.Context, name string, public bool) error {
	if name == "" {
		return newError(0, CodeInvalid, "template name is empty")
	}
	verb := "publish"
	if !public {
		verb = "unpublish"
	}
	return c.doJSON(ctx, http.MethodPost, path("templates", name, verb), nil, nil, nil)
}
