// Package tmplbuild runs the builds of user templates: each turns a
// container image into a root filesystem of the template store (see
// template.Store.StageUserRootFS) through a Convert function (package
// rootfs). It owns the builds' queue (at most Config.MaxConcurrent at
// once, shared fairly between owners; one at a time per template name;
// per owner and per template at most what each Spec allows), their
// status, and their
// progress lines, kept in memory for whoever follows them and, with
// Config.Dir, on disk (ID.json, the status; ID.log, the lines), so that
// they outlive a restart of the server. Finished builds are forgotten
// (files too) after Config.Retention. A build that was queued or running
// when the server stopped is failed at the next New with CodeInterrupted;
// what it staged the store removes at start-up
// (template.Store.RemoveLeftovers).
package build

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
)

// Convert writes the root filesystem of image src to the ext4 image out
// (which it creates), reporting progress lines. Errors for an image the
// registry does not have wrap ErrImageNotFound. It must return soon after
// ctx ends.
type Convert func(ctx context.Context, src, out string, progress func(string)) (builds.Result, error)

// BuildDockerfile writes the root filesystem a Dockerfile build of spec
// makes to the ext4 image out (which it creates), reporting progress lines.
// It must return soon after ctx ends.
type BuildDockerfile func(ctx context.Context, spec builds.Spec, out string, progress func(string)) (builds.Result, error)

// Store is the template store as builds use it (*template.Store).
type Store interface {
	ValidateUserName(name string) error
	StageUserRootFS(name string) (dir string, err error)
	InstallUserRootFS(dir string, u templates.UserRootFS) error
	TryUserRootFS(dir string, u templates.UserRootFS) (keep func(), undo func() error, err error)
	RemoveUserRootFS(name string) error
	RemoveUserVersion(name string, version int) error
	RemoveUserCopy(name string, version int) error
	SetUserPublished(ref string, published bool) error
	UserRootFS(ref string) (templates.UserRootFS, error)
	UserRootFSes() ([]templates.UserRootFS, error)
	UserVersions(name string) ([]templates.UserRootFS, error)
}

// Config configures a Manager.
type Config struct {
	Store   Store
	Convert Convert
	// Dockerfile runs Dockerfile builds; nil: they are refused
	// (ErrUnsupported).
	Dockerfile BuildDockerfile
	// CheckDockerfile, if set, checks a Dockerfile and its build args when
	// its build is started, so that a malformed one is refused at once
	// (its errors are wrapped in templates.ErrInvalid).
	CheckDockerfile func(dockerfile []byte, buildArgs map[string]string) error
	// Dir keeps the builds' status and log lines, so that they outlive
	// a restart; "" keeps them in memory only.
	Dir string
	// Bake bakes user template ref (the version just installed,
	// "NAME:N") at the host's
	// default shape, reporting progress lines. A build whose template
	// starts commands (templates.Startup) calls it, so that a start or
	// ready command that fails, fails the build: the template is then
	// as it was before the build (its previous version, or none). Errors of the ready command are *templates.ReadyError. nil:
	// such templates are baked on first use like the others.
	Bake func(ctx context.Context, name string, progress func(string)) error
	// Publish, if set, is given each version a build installed (its
	// description, version included, and its directory, which holds
	// rootfs.ext4) before the build succeeds: a host of a fleet uploads
	// it to the object store, from which the other hosts fetch it. A
	// build whose Publish fails fails, and its version is undone.
	Publish func(ctx context.Context, u templates.UserRootFS, dir string) error
	// Unpublish, if set, is called once Remove has removed versions of
	// template name; its error is logged.
	Unpublish func(ctx context.Context, name string, versions []int) error
	// Copies: the templates here are copies of the versions a fleet's
	// registry lists (a host of a fleet), so Remove removes a template's
	// latest version alone too (template.Store.RemoveUserCopy).
	Copies bool
	// MaxConcurrent bounds the builds running at once; more wait (default
	// 2), and the slots are shared fairly between owners (slots).
	MaxConcurrent int
	// CheckSpace, if set, reports whether the disk has room for a build:
	// an error wrapping ErrNoSpace when it has not (its text is for
	// users). Start refuses a build then, and a build that gets its slot
	// then fails with CodeNoSpace.
	CheckSpace func() error
	// Timeout bounds one build (default 30 minutes).
	Timeout time.Duration
	// Retention is how long a finished build stays visible (default 1 h).
	Retention time.Duration
	// MaxLines bounds the progress lines kept per build (default 10000):
	// later lines are dropped, and a line says how many. Each line is
	// cut at MaxLineBytes.
	MaxLines int
	Logger   *slog.Logger
}

// Default of Config.MaxConcurrent.
const DefaultMaxConcurrent = 2

// MaxLineBytes bounds one progress line.
const MaxLineBytes = 4096

// Validate checks c and fills in defaults.
func (c *Config) Validate() error {
	if c.Store == nil || c.Convert == nil {
		return errors.New("template builds: Store and Convert are required")
	}
	if c.MaxConcurrent < 0 || c.Timeout < 0 || c.Retention < 0 || c.MaxLines < 0 {
		return errors.New("template builds: limits must not be negative")
	}
	if c.MaxConcurrent == 0 {
		c.MaxConcurrent = DefaultMaxConcurrent
	}
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Minute
	}
	if c.Retention == 0 {
		c.Retention = time.Hour
	}
	if c.MaxLines == 0 {
		c.MaxLines = 10000
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

type build struct {
	st      builds.Status
	spec    builds.Spec
	lines   []string
	dropped int
	// changed is closed (and replaced) whenever lines or st change.
	changed chan struct{}
	cancel  context.CancelFunc
	// canceled is why Cancel canceled it ("": it did not).
	canceled string
	// log is the open ID.log (nil without Config.Dir, or once ended).
	log *os.File
}

// Manager runs builds. Safe for concurrent use.
type Manager struct {
	cfg   Config
	slots *slots
	ctx   context.Context // ends at Close
	end   context.CancelFunc
	wg    sync.WaitGroup

	mu     sync.Mutex
	closed bool
	builds map[string]*build
	// names maps a template name to the builds of it not yet ended, in
	// the order they were started: the first one runs (or waits for a
	// slot), the others wait for it.
	names map[string][]*build
	// turn maps a build to the channel closed when it is first in names.
	turn map[*build]chan struct{}
}

// New returns a manager. It starts nothing.
func New(cfg Config) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ctx, end := context.WithCancel(context.Background())
	m := &Manager{
		cfg: cfg, slots: newSlots(cfg.MaxConcurrent), ctx: ctx, end: end,
		builds: map[string]*build{}, names: map[string][]*build{}, turn: map[*build]chan struct{}{},
	}
	if err := m.load(); err != nil {
		return nil, err
	}
	return m, nil
}

// Start queues a build of spec and returns its status (queued); the
// template's bakes start spec.Startup's commands. Errors:
// templates.ErrInvalid (a bad or built-in name, neither or both of an image
// and a Dockerfile, an invalid Startup), ErrUnsupported, ErrClosed,
// ErrConflict and ErrLimit (checkOwner), ErrBusy (spec.MaxBuilds), an
// error wrapping ErrNoSpace (Config.CheckSpace). From
// Start on, spec.ContextTar is the Manager's to remove, whatever the error.
func (m *Manager) Start(_ context.Context, spec builds.Spec) (st builds.Status, err error) {
	defer func() {
		if err != nil && spec.ContextTar != "" {
			os.Remove(spec.ContextTar)
		}
	}()
	name, su := spec.Name, spec.Startup
	if err := m.cfg.Store.ValidateUserName(name); err != nil {
		return builds.Status{}, err
	}
	if err := su.Validate(); err != nil {
		return builds.Status{}, err
	}
	switch {
	case spec.FromImage == "" && spec.Dockerfile == nil:
		return builds.Status{}, fmt.Errorf("%w: no image or Dockerfile to build from", templates.ErrInvalid)
	case spec.FromImage != "" && spec.Dockerfile != nil:
		return builds.Status{}, fmt.Errorf("%w: build from an image or from a Dockerfile, not both", templates.ErrInvalid)
	case spec.Dockerfile != nil && m.cfg.Dockerfile == nil:
		return builds.Status{}, builds.ErrUnsupported
	}
	if spec.Dockerfile != nil && m.cfg.CheckDockerfile != nil {
		if err := m.cfg.CheckDockerfile(spec.Dockerfile, spec.BuildArgs); err != nil {
			return builds.Status{}, fmt.Errorf("%w: %w", templates.ErrInvalid, err)
		}
	}
	if spec.ID != "" && !builds.ValidID(spec.ID) {
		return builds.Status{}, fmt.Errorf("%w: a build id is 20 lowercase hex digits", templates.ErrInvalid)
	}
	if spec.Version < 0 {
		return builds.Status{}, fmt.Errorf("%w: a negative template version", templates.ErrInvalid)
	}
	if m.cfg.CheckSpace != nil {
		if err := m.cfg.CheckSpace(); err != nil {
			return builds.Status{}, err
		}
	}
	src := spec.Source()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return builds.Status{}, builds.ErrClosed
	}
	m.prune()
	if err := m.checkOwner(spec); err != nil {
		return builds.Status{}, err
	}
	id := spec.ID
	if id == "" {
		id = builds.NewID()
	} else if _, taken := m.builds[id]; taken {
		return builds.Status{}, fmt.Errorf("%w: template build %s exists already", builds.ErrConflict, id)
	}
	ctx, cancel := context.WithTimeout(m.ctx, m.cfg.Timeout)
	b := &build{
		st:      builds.Status{ID: id, Name: name, Source: src, State: builds.StateQueued, CreatedAt: time.Now().UTC(), Owner: spec.Owner},
		spec:    spec,
		changed: make(chan struct{}),
		cancel:  cancel,
	}
	if err := m.create(b); err != nil {
		cancel()
		return builds.Status{}, err
	}
	m.builds[b.st.ID] = b
	turn := make(chan struct{})
	m.turn[b] = turn
	m.names[name] = append(m.names[name], b)
	if len(m.names[name]) == 1 {
		close(turn)
	}
	m.wg.Add(1)
	go m.run(ctx, b, turn)
	return b.st, nil
}

func (m *Manager) run(ctx context.Context, b *build, turn chan struct{}) {
	defer m.wg.Done()
	defer b.cancel()
	say := func(line string) { m.addLine(b, line) }
	var err error
	select {
	case <-turn:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err == nil {
		w := m.slots.enqueue(b.spec.Owner)
		if err = m.slots.wait(ctx, w); err == nil {
			if m.cfg.CheckSpace != nil {
				err = m.cfg.CheckSpace()
			}
			if err == nil {
				err = m.build(ctx, b, say)
			}
			m.slots.release(w)
		}
	}
	// Before the build is seen to end: whoever follows it may look for
	// the context right after.
	if b.spec.ContextTar != "" {
		os.Remove(b.spec.ContextTar)
	}
	m.finish(b, err)
}

func (m *Manager) build(ctx context.Context, b *build, say func(string)) error {
	now := time.Now().UTC()
	m.mu.Lock()
	b.st.State, b.st.StartedAt = builds.StateRunning, &now
	m.save(b)
	m.mu.Unlock()
	name, src := b.st.Name, b.st.Source
	log := m.cfg.Logger.With("template", name, "build_id", b.st.ID)
	log.Info("template build started", "from_image", src)
	say(fmt.Sprintf("building template %s from %s", name, src))
	dir, err := m.cfg.Store.StageUserRootFS(name)
	if err != nil {
		return storeError{err}
	}
	installed := false
	defer func() {
		if !installed {
			os.RemoveAll(dir)
		}
	}()
	var res builds.Result
	if b.spec.Dockerfile != nil {
		res, err = m.cfg.Dockerfile(ctx, b.spec, filepath.Join(dir, "rootfs.ext4"), say)
	} else {
		res, err = m.cfg.Convert(ctx, src, filepath.Join(dir, "rootfs.ext4"), say)
	}
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	u := templates.UserRootFS{Name: name, Source: src, Digest: res.Digest, Image: res.Image, Startup: b.spec.Startup,
		BuiltAt: time.Now().UTC(), BuildMS: time.Since(now).Milliseconds(), Owner: b.spec.Owner, Version: b.spec.Version}
	bake := !b.spec.Startup.IsZero() && m.cfg.Bake != nil
	if !bake && m.cfg.Publish == nil {
		if err := m.cfg.Store.InstallUserRootFS(dir, u); err != nil {
			return storeError{err}
		}
		installed = true
		return m.succeeded(b, res, now, "; its sandboxes bake it on first use", say, log)
	}
	keep, undo, err := m.cfg.Store.TryUserRootFS(dir, u)
	if err != nil {
		return storeError{err}
	}
	installed = true
	v := m.installedVersion(b)
	ref := templates.Ref(name, v)
	// undone takes the version back: a failed step makes the template
	// as it was before the build (its previous version, or none).
	undone := func(err error) error {
		if uerr := undo(); uerr != nil {
			log.Error("undo the install of a template whose build failed", "err", uerr)
		}
		return err
	}
	if bake {
		say(fmt.Sprintf("baking template %s: its start and ready commands run once, before the snapshot", ref))
		t0 := time.Now()
		if err := m.cfg.Bake(ctx, ref, say); err != nil {
			// A version whose commands do not get ready is not kept: its
			// sandboxes would fail to bake it again and again.
			return undone(bakeError{err})
		}
		log.Info("template baked", "dur_ms", time.Since(t0).Milliseconds())
	}
	if m.cfg.Publish != nil {
		iu, err := m.cfg.Store.UserRootFS(ref)
		if err == nil {
			say(fmt.Sprintf("uploading template %s to the object store (%d MiB of data), for the other hosts", ref, iu.DiskBytes>>20))
			t0 := time.Now()
			err = m.cfg.Publish(ctx, iu, dir)
			log.Info("template uploaded", "version", v, "dur_ms", time.Since(t0).Milliseconds(), "err", err)
		}
		if err != nil {
			return undone(publishError{fmt.Errorf("upload template %s: %w", ref, err)})
		}
	}
	keep()
	how := "; its sandboxes bake it on first use"
	if bake {
		how = ""
	}
	return m.succeeded(b, res, now, how, say, log)
}

// succeeded records the version b installed and says it is ready.
func (m *Manager) succeeded(b *build, res builds.Result, start time.Time, how string, say func(string), log *slog.Logger) error {
	v := m.installedVersion(b)
	m.mu.Lock()
	b.st.Digest, b.st.Version = res.Digest, v
	m.mu.Unlock()
	say(fmt.Sprintf("template %s is ready as version %d (%s, %.1fs)%s", b.st.Name, v, res.Digest, time.Since(start).Seconds(), how))
	log.Info("template build succeeded", "digest", res.Digest, "dur_ms", time.Since(start).Milliseconds())
	return nil
}

// finish records how b ended and hands its name to the next build.
func (m *Manager) finish(b *build, err error) {
	now := time.Now().UTC()
	m.mu.Lock()
	defer m.mu.Unlock()
	b.st.EndedAt = &now
	if err == nil {
		b.st.State = builds.StateSucceeded
	} else {
		b.st.State, b.st.Code, b.st.Error = builds.StateFailed, classify(err), err.Error()
		var se storeError
		var be bakeError
		var pe publishError
		var re *templates.ReadyError
		switch {
		case b.canceled != "":
			b.st.Code, b.st.Error = builds.CodeCanceled, b.canceled
		case errors.Is(err, builds.ErrNoSpace):
			b.st.Code, b.st.Error = builds.CodeNoSpace, err.Error()
		case errors.As(err, &se):
			// Names the server's paths: users get the gist, the log the rest.
			b.st.Error = "the server could not store the root filesystem (see its log)"
		case errors.As(err, &re):
			b.st.Error = "the build was undone: " + re.Msg
		case errors.As(err, &pe) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded):
			b.st.Error = "the build was undone: the object store did not take the template, so the other hosts could not use it (see the server's log; retry once the store is back)"
		case errors.As(err, &be) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded):
			b.st.Error = "the build was undone: its first boot failed (see the server's log)"
		case errors.Is(err, context.DeadlineExceeded):
			b.st.Error = fmt.Sprintf("the build took longer than %s", m.cfg.Timeout)
		case errors.Is(err, context.Canceled):
			b.st.Error = "the build was canceled: the server is shutting down"
		}
		m.cfg.Logger.Warn("template build failed", "template", b.st.Name, "build_id", b.st.ID, "err", err)
	}
	m.save(b)
	if b.log != nil {
		b.log.Close()
		b.log = nil
	}
	q := m.names[b.st.Name]
	for i, x := range q {
		if x == b {
			q = append(q[:i], q[i+1:]...)
			break
		}
	}
	delete(m.turn, b)
	if len(q) == 0 {
		delete(m.names, b.st.Name)
	} else {
		m.names[b.st.Name] = q
		if t := m.turn[q[0]]; t != nil {
			select {
			case <-t:
			default:
				close(t)
			}
		}
	}
	m.notify(b)
}

// storeError is a failure of the template store (the server's disk), not
// of the image.
type storeError struct{ err error }

func (e storeError) Error() string { return e.err.Error() }
func (e storeError) Unwrap() error { return e.err }

// publishError is a failure of Config.Publish.
type publishError struct{ err error }

func (e publishError) Error() string { return e.err.Error() }
func (e publishError) Unwrap() error { return e.err }

// bakeError is a failure of the bake that checks a template's start and
// ready commands.
type bakeError struct{ err error }

func (e bakeError) Error() string { return "bake: " + e.err.Error() }
func (e bakeError) Unwrap() error { return e.err }

func classify(err error) string {
	switch {
	case errors.Is(err, builds.ErrImageNotFound):
		return builds.CodeImageNotFound
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return builds.CodeCanceled
	}
	return builds.CodeFailed
}

func (m *Manager) addLine(b *build, line string) {
	if len(line) > MaxLineBytes {
		line = line[:MaxLineBytes]
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(b.lines) < m.cfg.MaxLines {
		b.lines = append(b.lines, line)
		m.appendLine(b, line)
	} else {
		b.dropped++
	}
	m.notify(b)
}

// notify wakes b's followers; m.mu is held.
func (m *Manager) notify(b *build) {
	close(b.changed)
	b.changed = make(chan struct{})
}

// Get returns the status of build id (ErrNotFound).
func (m *Manager) Get(_ context.Context, id string) (builds.Status, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.builds[id]
	if !ok {
		return builds.Status{}, fmt.Errorf("template build %q: %w", id, builds.ErrNotFound)
	}
	return b.st, nil
}

// List returns the status of every build it remembers (running, waiting
// and ended ones not forgotten yet), the newest first.
func (m *Manager) List(context.Context) ([]builds.Status, error) {
	m.mu.Lock()
	out := make([]builds.Status, 0, len(m.builds))
	for _, b := range m.builds {
		out = append(out, b.st)
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b builds.Status) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// Follow calls line for each progress line of build id, from the first,
// as they come, and returns its final status once it has ended; or
// ctx's error. Errors: ErrNotFound.
func (m *Manager) Follow(ctx context.Context, id string, line func(string)) (builds.Status, error) {
	next := 0
	for {
		m.mu.Lock()
		b, ok := m.builds[id]
		if !ok {
			m.mu.Unlock()
			return builds.Status{}, fmt.Errorf("template build %q: %w", id, builds.ErrNotFound)
		}
		lines := b.lines[next:]
		next = len(b.lines)
		st, dropped, changed := b.st, b.dropped, b.changed
		m.mu.Unlock()
		for _, l := range lines {
			line(l)
		}
		if st.Done() {
			if dropped > 0 {
				line(fmt.Sprintf("(%d more lines not kept)", dropped))
			}
			return st, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return st, ctx.Err()
		}
	}
}

// Cancel implements Canceler.
func (m *Manager) Cancel(_ context.Context, id, why string) (builds.Status, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.builds[id]
	if !ok {
		return builds.Status{}, fmt.Errorf("template build %q: %w", id, builds.ErrNotFound)
	}
	if !b.st.Done() && b.canceled == "" {
		if why == "" {
			why = "the build was canceled"
		}
		b.canceled = why
		b.cancel()
		m.cfg.Logger.Info("template build canceled", "template", b.st.Name, "build_id", id, "why", why)
	}
	return b.st, nil
}

// Building reports whether template name has a build queued or running.
func (m *Manager) Building(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.names[name]) > 0
}

// Remove removes user template ref: every version of "NAME", or version
// N of "NAME:N" (templates.ErrNotFound if there is none;
// templates.ErrConflict for the latest version alone), unless a build of it
// is queued or running (ErrConflict).
func (m *Manager) Remove(ctx context.Context, ref string) error {
	name, v, err := templates.SplitRef(ref)
	if err != nil {
		return fmt.Errorf("%w: no user template %q", templates.ErrNotFound, ref)
	}
	versions, err := m.remove(name, v)
	if err == nil && m.cfg.Unpublish != nil {
		// Outside m.mu: a build of name may install a new version
		// meanwhile, whose number none of these is.
		if uerr := m.cfg.Unpublish(ctx, name, versions); uerr != nil {
			m.cfg.Logger.Warn("template removed here but not from the object store: its copy there is garbage now", "template", ref, "err", uerr)
		}
	}
	return err
}

// remove removes version v of name (0: all) and returns the versions
// removed.
func (m *Manager) remove(name string, v int) ([]int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.names[name]) > 0 {
		return nil, fmt.Errorf("template %s is being built: %w", name, builds.ErrConflict)
	}
	// Under m.mu: no build of name can start installing meanwhile.
	if v > 0 && m.cfg.Copies {
		return []int{v}, m.cfg.Store.RemoveUserCopy(name, v)
	}
	if v > 0 {
		return []int{v}, m.cfg.Store.RemoveUserVersion(name, v)
	}
	var versions []int
	if vs, err := m.cfg.Store.UserVersions(name); err == nil {
		for _, u := range vs {
			versions = append(versions, u.Version)
		}
	}
	return versions, m.cfg.Store.RemoveUserRootFS(name)
}

// SetPublished publishes (or withdraws) versions of user template ref:
// see template.Store.SetUserPublished.
func (m *Manager) SetPublished(_ context.Context, ref string, published bool) error {
	return m.cfg.Store.SetUserPublished(ref, published)
}

// UserTemplate returns user template ref (see template.Store.UserRootFS).
func (m *Manager) UserTemplate(_ context.Context, ref string) (templates.UserRootFS, error) {
	return m.cfg.Store.UserRootFS(ref)
}

// Versions lists the versions of user template name, oldest first.
func (m *Manager) Versions(_ context.Context, name string) ([]templates.UserRootFS, error) {
	return m.cfg.Store.UserVersions(name)
}

// checkOwner refuses spec when its owner has MaxBuilds builds queued or
// running (ErrBusy), when its name exists with MaxVersions versions
// (ErrLimit), when its name is new and another owner's build of it is
// queued (ErrConflict), or when its owner has MaxTemplates templates
// already (ErrLimit); m.mu is held.
func (m *Manager) checkOwner(spec builds.Spec) error {
	if spec.MaxBuilds > 0 {
		n := 0
		for _, q := range m.names {
			for _, b := range q {
				if b.spec.Owner == spec.Owner {
					n++
				}
			}
		}
		if n >= spec.MaxBuilds {
			return fmt.Errorf("%w: this key has %d template builds queued or running, the most allowed at once; wait for one to end", builds.ErrBusy, n)
		}
	}
	if _, err := m.cfg.Store.UserRootFS(spec.Name); err == nil {
		// A rebuild (the caller checked who may): a new version.
		if spec.MaxVersions > 0 {
			vs, err := m.cfg.Store.UserVersions(spec.Name)
			if err != nil {
				return err
			}
			if n := len(vs) + len(m.names[spec.Name]); n >= spec.MaxVersions {
				return builds.VersionLimit(spec.Name, n)
			}
		}
		return nil
	}
	for _, q := range m.names[spec.Name] {
		if q.spec.Owner != spec.Owner {
			return fmt.Errorf("%w: the name %s is taken: another key is building it", builds.ErrConflict, spec.Name)
		}
	}
	if spec.MaxTemplates <= 0 {
		return nil
	}
	owned := map[string]bool{}
	users, err := m.cfg.Store.UserRootFSes()
	if err != nil {
		return err
	}
	for _, u := range users {
		if u.Owner == spec.Owner {
			owned[u.Name] = true
		}
	}
	for name, q := range m.names {
		if len(q) > 0 && q[0].spec.Owner == spec.Owner {
			owned[name] = true
		}
	}
	if len(owned) >= spec.MaxTemplates {
		return fmt.Errorf("%w: this key has %d templates, its limit; delete one first", builds.ErrLimit, len(owned))
	}
	return nil
}

// installedVersion is the version b installed: the latest (installs of a
// name are serialized).
func (m *Manager) installedVersion(b *build) int {
	u, err := m.cfg.Store.UserRootFS(b.st.Name)
	if err != nil {
		return 0
	}
	return u.Version
}

// prune forgets builds that ended more than Retention ago; m.mu is held.
func (m *Manager) prune() {
	cutoff := time.Now().Add(-m.cfg.Retention)
	for id, b := range m.builds {
		if b.st.EndedAt != nil && b.st.EndedAt.Before(cutoff) {
			delete(m.builds, id)
			m.removeFiles(id)
		}
	}
}

// Close cancels the builds queued or running and waits for them to end.
// Idempotent.
func (m *Manager) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.end()
	m.wg.Wait()
	return nil
}

// UserTemplates lists the user templates built.
func (m *Manager) UserTemplates(context.Context) ([]templates.UserRootFS, error) {
	return m.cfg.Store.UserRootFSes()
}
