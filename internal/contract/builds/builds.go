// Package builds is the vocabulary of template builds that the control
// plane and the hosts share: what a build is asked to make (Spec), its
// status and states, the Builder that runs builds (a host's Manager, a
// remote host agent's, a fleet's), and the error classes of builds.
// Running builds is a host's (internal/hostagent/template/build).
// Standard library only.
package builds

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/internal/contract/errs"

	"github.com/pandastack/pandastack/internal/contract/templates"
)

// The errors of template builds (wrapped; test with errors.Is), each of a
// class of internal/contract/errs. A failed build's own error is in its
// Status.
var (
	ErrNotFound = errs.New(errs.NotFound, "not found")
	// ErrConflict: the template has a build queued or running.
	ErrConflict = errs.New(errs.Conflict, "conflict")
	ErrClosed   = errs.New(errs.Unavailable, "template builds are shutting down")
	// ErrUnsupported: this server does not run Dockerfile builds.
	ErrUnsupported = errs.New(errs.NotImplemented, "Dockerfile builds are not supported here")
	// ErrImageNotFound is what a Convert returns (wrapped) when the
	// registry does not have the image; a build failing with it has
	// Status.Code CodeImageNotFound.
	ErrImageNotFound = errs.New(errs.NotFound, "image not found")
	// ErrLimit: the key owns Spec.MaxTemplates templates already, or the
	// template has Spec.MaxVersions versions.
	ErrLimit = errs.New(errs.TemplateLimit, "template limit reached")
	// ErrBusy: the key has Spec.MaxBuilds builds queued or running.
	ErrBusy = errs.New(errs.TooManyRequests, "too many template builds")
	// ErrNoSpace is what Config.CheckSpace returns (wrapped) when the
	// disk has no room for a build.
	ErrNoSpace = errs.New(errs.NoSpace, "no space for template builds")
)

// Result is what a Convert found in the image.
type Result struct {
	Image  templates.ImageConfig
	Digest string
}

// Spec is what a build makes a template from: an image (FromImage) or a
// Dockerfile (Dockerfile, with the files of ContextTar).
type Spec struct {
	Name string
	// FromImage is an image reference; "" for a Dockerfile build.
	FromImage string
	// Dockerfile is the Dockerfile's text; nil for an image build.
	Dockerfile []byte
	// ContextTar is the path of the build context, a tar file (possibly
	// gzip-compressed) the Manager owns from Start on: it removes it once
	// the build has ended. "" for none.
	ContextTar string
	// BuildArgs set the Dockerfile's ARGs.
	BuildArgs map[string]string
	Startup   templates.Startup
	// Owner is the id of the API key building the template: the owner of
	// the template if this build makes its first version (a rebuild keeps
	// the template's owner), and of the build's status and log. A build of
	// a name that does not exist yet is refused (ErrConflict) while
	// another owner's build of that name is queued or running.
	Owner string
	// MaxTemplates bounds the templates Owner owns: a build of a new
	// name is refused (ErrLimit) when Owner has that many already,
	// counting new names queued. 0: no bound.
	MaxTemplates int
	// MaxBuilds bounds Owner's builds queued or running here, this one
	// included: Start refuses one more (ErrBusy). 0: no bound.
	MaxBuilds int
	// MaxVersions bounds the versions of the template: a build of a name
	// that has that many, counting the builds of it queued or running, is
	// refused (ErrLimit). 0: no bound.
	MaxVersions int
	// ID and Version are given by a fleet's control plane, which keeps
	// the registry of its user templates (package fleet): the build's id
	// (20 hex digits; ErrConflict if taken) and the version number it
	// installs, which must be newer than every version of the name this
	// host has held. Zero values: a new id, and the next number here.
	ID      string
	Version int
}

// Source is how a build's status names what it builds from.
func (s Spec) Source() string {
	if s.Dockerfile != nil {
		return "Dockerfile"
	}
	return s.FromImage
}

// States of a build.
const (
	StateQueued    = "queued"
	StateRunning   = "running"
	StateSucceeded = "succeeded"
	StateFailed    = "failed"
)

// Codes classify a failed build's error.
const (
	CodeImageNotFound = "image_not_found"
	CodeCanceled      = "canceled"
	CodeFailed        = "build_failed"
	// CodeInterrupted: the server stopped while the build was queued or
	// running.
	CodeInterrupted = "interrupted"
	// CodeNoSpace: the disk had no room for the build when it was to run.
	CodeNoSpace = "insufficient_storage"
)

// Status is a build's state.
type Status struct {
	ID     string `json:"build_id"`
	Name   string `json:"name"`
	Source string `json:"from_image"`
	State  string `json:"status"`
	// Code and Error say why a failed build failed, for users.
	Code   string `json:"code,omitempty"`
	Error  string `json:"error,omitempty"`
	Digest string `json:"digest,omitempty"`
	// Version is the template version the build made (once succeeded).
	Version   int        `json:"version,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	StartedAt *time.Time `json:"started_at,omitempty"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	// Owner is Spec.Owner: who may read the status and the log.
	Owner string `json:"-"`
	// HostID is the host of a fleet that runs the build ("" elsewhere).
	HostID string `json:"host_id,omitempty"`
}

// Done reports whether the build has ended.
func (s Status) Done() bool { return s.State == StateSucceeded || s.State == StateFailed }

// Builder runs builds, as the API uses it: a Manager in the server's
// process, or a remote host agent's behind the host API (hostclient.Client).
// Every call takes a context (a remote one does I/O); Follow and List are
// Manager's, the others its Store's through it.
type Builder interface {
	Start(ctx context.Context, spec Spec) (Status, error)
	Get(ctx context.Context, id string) (Status, error)
	// List returns every build remembered, newest first.
	List(ctx context.Context) ([]Status, error)
	Follow(ctx context.Context, id string, line func(string)) (Status, error)
	// Remove removes "NAME" (every version) or "NAME:N" (one).
	Remove(ctx context.Context, ref string) error
	// SetPublished publishes or withdraws versions of ref: see
	// template.Store.SetUserPublished.
	SetPublished(ctx context.Context, ref string, published bool) error
	UserTemplate(ctx context.Context, ref string) (templates.UserRootFS, error)
	UserTemplates(ctx context.Context) ([]templates.UserRootFS, error)
	Versions(ctx context.Context, name string) ([]templates.UserRootFS, error)
}

// VersionLister is a Builder that can return every template's versions
// in one read (a fleet's registry is one catalog query), where Versions
// per name of UserTemplates would take one read each.
type VersionLister interface {
	// AllVersions returns the versions of every template, by name, oldest
	// first.
	AllVersions(ctx context.Context) (map[string][]templates.UserRootFS, error)
}

// Canceler is a Builder that can cancel builds (a Manager, a fleet's, a
// remote agent's).
type Canceler interface {
	// Cancel ends build id if it is queued or running: it fails with
	// CodeCanceled and why as its error. A build that has ended is left
	// as it was. It returns the build's status (perhaps not ended yet: the
	// build stops soon after). Errors: ErrNotFound.
	Cancel(ctx context.Context, id, why string) (Status, error)
}

// VersionLimit is the error of a build of template name, which has n
// versions (and builds of new ones), at its limit.
func VersionLimit(name string, n int) error {
	return fmt.Errorf("%w: template %s has %d versions (counting its builds in progress), the most a template keeps; delete old ones (DELETE /v1/templates/%s:N) first", ErrLimit, name, n, name)
}

// buildIDRE is what NewID makes.
var buildIDRE = regexp.MustCompile(`^[0-9a-f]{20}$`)

// NewID returns a new build id.
func NewID() string {
	b := make([]byte, 10)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// ValidID reports whether id is one NewID makes.
func ValidID(id string) bool { return buildIDRE.MatchString(id) }

// MinFreeBytes is the free space a disk keeps for everything else: builds
// (build.DiskSpace) and the build contexts the API receives are refused below it.
const MinFreeBytes = 1 << 30

// CheckFree fails with an error wrapping ErrNoSpace when the file system
// of dir has less than min+need bytes free. Its message, for users, names
// no path. An unreadable file system is not refused here: writing to it
// says more.
func CheckFree(dir string, min, need int64) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return nil
	}
	free := int64(st.Bavail) * st.Bsize
	if free < min+need {
		what := ""
		if need > 0 {
			what = fmt.Sprintf(" besides the %d MiB of this build's context", need>>20)
		}
		return fmt.Errorf("%w: the server has %d MiB of disk free for template builds and keeps %d MiB free%s; retry once builds or templates were deleted",
			ErrNoSpace, free>>20, min>>20, what)
	}
	return nil
}
