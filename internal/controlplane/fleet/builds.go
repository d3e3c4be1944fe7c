package fleet

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
)

// Templates is a fleet's user templates (panda server --fleet), a
// tmplbuild.Builder. Their registry — names, owners, the versions (and
// which of them are published) and the builds running — is the catalog's (catalog.Template),
// so listing them and creating sandboxes of them need no particular host.
// Each build runs on one host (the one --template-host names, or else the
// ready host with the most free memory), with the version number the
// catalog gave it; that host uploads the version to the object store
// before its build succeeds, and every other host fetches it on its first
// sandbox of it (package agent, usertemplates.go).
//
// A build's version is recorded once its host reports it succeeded: a
// watcher follows each build (Start starts them again for the builds a
// previous run of the control plane left), and Get and Follow record it
// themselves before they report a build done, so that a sandbox created
// right after sees the version. A build whose host is lost is waited for
// (recorded if the host is back and finishes it; a restart of its agent
// fails it); one whose host is forgotten (DELETE /v1/hosts/ID) is
// dropped. A dropped or failed build's number is not given out again.
type Templates struct {
	r   *Registry
	pin string
	log *slog.Logger

	life context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu       sync.Mutex
	watching map[string]bool // build ids

	// The hosts' builders, by default the registry's members' (tests
	// set others): builderOf a host, or why it has none now; whether a
	// host is gone for good; the builders of every host connected.
	builderOf func(id string) (builds.Builder, error)
	gone      func(id string) bool
	connected func() map[string]builds.Builder
	sweeperOf func(id string) (StoreSweeper, bool)

	sweep sweepState // of the object store's user template sets
}

var (
	_ builds.Builder  = (*Templates)(nil)
	_ builds.Canceler = (*Templates)(nil)
)

// NewTemplates returns the fleet's user templates; pin, if set, is the
// host that runs every build (--template-host).
func NewTemplates(r *Registry, pin string) *Templates {
	t := &Templates{r: r, pin: pin, log: r.log.With("part", "templates"), watching: map[string]bool{}}
	t.builderOf, t.gone, t.connected, t.sweeperOf = t.memberBuilder, t.memberGone, t.members, t.memberSweeper
	t.life, t.stop = context.WithCancel(context.Background())
	return t
}

// Watch follows the builds the catalog says are running (a previous run's)
// until they end. Call it once the registry has started.
func (t *Templates) Watch(ctx context.Context) error {
	ts, err := t.r.cfg.Catalog.ListTemplates(ctx)
	if err != nil {
		return fmt.Errorf("template builds: %w", err)
	}
	for _, tp := range ts {
		for _, b := range tp.Builds {
			t.watch(tp.Name, b)
		}
	}
	return nil
}

// HostConnected runs when host id connects. The --template-host's
// templates that the catalog has no record of are imported: those it built
// while it kept the registry itself (before the catalog did), each with
// its versions, owner and published versions. Then, at most once per SweepEvery,
// the host sweeps the object store of the versions the registry no longer
// has (SweepStore), in the background. Errors are logged.
func (t *Templates) HostConnected(ctx context.Context, id string) {
	defer t.maybeSweep(id)
	if id != t.pin {
		return
	}
	b, err := t.builderOf(id)
	if err != nil {
		return
	}
	us, err := b.UserTemplates(ctx)
	if err != nil {
		t.log.Warn("cannot list the template host's templates to import them", "host_id", id, "err", err)
		return
	}
	recs, err := t.r.cfg.Catalog.ListTemplateRecords(ctx)
	if err != nil {
		t.log.Warn("cannot read the registry to import the template host's templates", "host_id", id, "err", err)
		return
	}
	recorded := map[string]bool{}
	for _, rec := range recs {
		recorded[rec.Name] = true
	}
	for _, latest := range us {
		if recorded[latest.Name] {
			continue // known, or deleted (its numbers are taken): the usual case
		}
		if err := t.importTemplate(ctx, b, latest); err != nil && !errors.Is(err, catalog.ErrConflict) {
			t.log.Warn("cannot import a template of the template host", "host_id", id, "template", latest.Name, "err", err)
		}
	}
}

// importTemplate records template latest.Name of builder b, every version.
func (t *Templates) importTemplate(ctx context.Context, b builds.Builder, latest templates.UserRootFS) error {
	vs, err := b.Versions(ctx, latest.Name)
	if err != nil {
		return err
	}
	tp := catalog.Template{Name: latest.Name, Owner: latest.Owner, CreatedAt: time.Now().UTC()}
	for _, u := range vs {
		ver, err := versionOf(u)
		if err != nil {
			return err
		}
		tp.Versions = addVersion(tp.Versions, ver)
		if u.Published {
			tp.Published = append(tp.Published, u.Version)
		}
		tp.LastVersion = max(tp.LastVersion, u.Version)
		if !u.BuiltAt.IsZero() && u.BuiltAt.Before(tp.CreatedAt) {
			tp.CreatedAt = u.BuiltAt
		}
	}
	if len(tp.Versions) == 0 {
		return nil
	}
	if err := t.r.cfg.Catalog.ImportTemplate(ctx, tp); err != nil {
		return err
	}
	t.log.Info("imported a template the template host built before the catalog kept the registry", "template", tp.Name, "versions", len(tp.Versions))
	return nil
}

// Close stops the watchers (the builds go on; the next run watches them).
func (t *Templates) Close() {
	t.stop()
	t.wg.Wait()
}

// memberBuilder returns host id's template builds, or why it has none
// now.
func (t *Templates) memberBuilder(id string) (builds.Builder, error) {
	r := t.r
	r.mu.Lock()
	defer r.mu.Unlock()
	what := "host " + id
	if id == t.pin {
		what = fmt.Sprintf("template builds run on host %s (--template-host), which", id)
	} else {
		what += ", which runs this build,"
	}
	m, ok := r.members[id]
	switch {
	case !ok:
		return nil, &controlplane.Error{Kind: controlplane.Unavailable, Msg: what + " has not joined this fleet"}
	case m.rec.State == catalog.HostLost:
		return nil, &controlplane.Error{Kind: controlplane.Unavailable, Msg: what + " stopped heartbeating; retry when it is back"}
	case m.client == nil:
		return nil, &controlplane.Error{Kind: controlplane.Unavailable, Msg: what + " is not connected yet; retry in a few seconds"}
	}
	return m.client.Builds(), nil
}

// memberGone reports whether host id will never report on its builds:
// not a member (forgotten).
func (t *Templates) memberGone(id string) bool {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	_, ok := t.r.members[id]
	return !ok
}

// lost reports whether host id is a member marked lost.
func (t *Templates) lost(id string) bool {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	m, ok := t.r.members[id]
	return ok && m.rec.State == catalog.HostLost
}

// pick returns the host a new build runs on: the pinned one, else the
// ready host with the most free memory (then the fewest sandboxes, then
// by id).
func (t *Templates) pick(ctx context.Context) (string, builds.Builder, error) {
	if t.pin != "" {
		b, err := t.builderOf(t.pin)
		return t.pin, b, err
	}
	var best *scheduler.Host
	inv := t.r.Inventory(ctx)
	for i, h := range inv {
		if h.State != scheduler.Ready {
			continue
		}
		if best == nil || h.FreeMemoryMiB > best.FreeMemoryMiB ||
			(h.FreeMemoryMiB == best.FreeMemoryMiB && h.Sandboxes < best.Sandboxes) {
			best = &inv[i]
		}
	}
	if best == nil {
		return "", nil, &controlplane.Error{Kind: controlplane.Unavailable, Msg: "no host can build templates now: none is ready (see GET /v1/hosts)"}
	}
	b, err := t.builderOf(best.ID)
	return best.ID, b, err
}

// checkName refuses a name no user template may take; the building host
// checks it against its own built-in images too.
func checkName(name string) error {
	if n, _, err := templates.SplitRef(name); err != nil || n != name {
		return fmt.Errorf("%w: template name %q must be 1-32 lowercase letters, digits, - or _", templates.ErrInvalid, name)
	}
	if slices.Contains(templates.Reserved, name) {
		return fmt.Errorf("%w: %q is a built-in template; pick another name", templates.ErrInvalid, name)
	}
	if name == templates.NotAName {
		return fmt.Errorf("%w: %q names the API's list of builds (/v1/templates/builds); pick another name", templates.ErrInvalid, name)
	}
	return nil
}

func (t *Templates) Start(ctx context.Context, spec builds.Spec) (st builds.Status, err error) {
	defer func() {
		if err != nil && spec.ContextTar != "" {
			os.Remove(spec.ContextTar) // the builder's from Start on
		}
	}()
	if err := checkName(spec.Name); err != nil {
		return builds.Status{}, err
	}
	if err := t.checkLimits(ctx, spec); err != nil {
		return builds.Status{}, err
	}
	hostID, b, err := t.pick(ctx)
	if err != nil {
		return builds.Status{}, err
	}
	bl := catalog.TemplateBuild{ID: builds.NewID(), HostID: hostID, Owner: spec.Owner, CreatedAt: time.Now().UTC()}
	var tp catalog.Template
	for try := 0; try < 2; try++ {
		// Two first builds of one name racing: one inserts, the other
		// conflicts once and then sees the template (a name another key
		// holds conflicts again).
		tp, err = t.r.cfg.Catalog.ReserveTemplateBuild(ctx, spec.Name, bl, spec.MaxTemplates)
		if !errors.Is(err, catalog.ErrConflict) {
			break
		}
	}
	switch {
	case errors.Is(err, catalog.ErrQuota):
		return builds.Status{}, fmt.Errorf("%w: this key has %d templates, its limit; delete one first", builds.ErrLimit, spec.MaxTemplates)
	case errors.Is(err, catalog.ErrConflict):
		return builds.Status{}, fmt.Errorf("%w: the name %s is taken: another key is building it", builds.ErrConflict, spec.Name)
	case err != nil:
		return builds.Status{}, err
	}
	bl = tp.Builds[len(tp.Builds)-1]
	// The registry's bounds are checked: the host's copies count nothing.
	spec.ID, spec.Version, spec.MaxTemplates, spec.MaxBuilds, spec.MaxVersions = bl.ID, bl.Version, 0, 0, 0
	st, err = b.Start(ctx, spec)
	if err != nil {
		if refused(err) {
			t.drop(context.WithoutCancel(ctx), spec.Name, bl, err)
		} else {
			// The host may have started it (the answer was lost): the
			// watcher finds out, and drops it if the host has not.
			t.watch(spec.Name, bl)
		}
		return builds.Status{}, err
	}
	t.log.Info("template build placed", "template", spec.Name, "version", bl.Version, "build_id", bl.ID, "host_id", hostID)
	t.watch(spec.Name, bl)
	st.HostID = hostID
	return st, nil
}

// checkLimits refuses spec when its owner has spec.MaxBuilds builds
// running on the fleet (tmplbuild.ErrBusy), or its template has
// spec.MaxVersions versions, counting its builds (tmplbuild.ErrLimit), as
// the catalog says now. Unlike MaxTemplates (ReserveTemplateBuild), two
// Starts racing may both pass: the API admits one build request of a key
// at a time.
func (t *Templates) checkLimits(ctx context.Context, spec builds.Spec) error {
	if spec.MaxBuilds <= 0 && spec.MaxVersions <= 0 {
		return nil
	}
	ts, err := t.r.cfg.Catalog.ListTemplates(ctx)
	if err != nil {
		return fmt.Errorf("template builds: %w", err)
	}
	running := 0
	for _, tp := range ts {
		for _, b := range tp.Builds {
			if b.Owner == spec.Owner {
				running++
			}
		}
		if tp.Name == spec.Name && spec.MaxVersions > 0 && len(tp.Versions) > 0 {
			if n := len(tp.Versions) + len(tp.Builds); n >= spec.MaxVersions {
				return builds.VersionLimit(spec.Name, n)
			}
		}
	}
	if spec.MaxBuilds > 0 && running >= spec.MaxBuilds {
		return fmt.Errorf("%w: this key has %d template builds queued or running, the most allowed at once; wait for one to end", builds.ErrBusy, running)
	}
	return nil
}

// Cancel implements tmplbuild.Canceler: the build's host cancels it, and
// its watcher records that it ended without a version.
func (t *Templates) Cancel(ctx context.Context, id, why string) (builds.Status, error) {
	b, at, _, err := t.locate(ctx, id)
	if err != nil {
		return builds.Status{}, err
	}
	c, ok := b.(builds.Canceler)
	if !ok {
		return builds.Status{}, fmt.Errorf("%w: host %s cannot cancel template builds", errors.ErrUnsupported, at.HostID)
	}
	st, err := c.Cancel(ctx, id, why)
	st.HostID = at.HostID
	return st, err
}

// refused reports whether a host's error for a build's Start says it
// did not start it.
func refused(err error) bool {
	for _, e := range []error{templates.ErrInvalid, builds.ErrConflict, builds.ErrLimit, builds.ErrUnsupported,
		builds.ErrClosed, builds.ErrBusy, builds.ErrNoSpace, errors.ErrUnsupported} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ce *controlplane.Error
	return errors.As(err, &ce) // the host's state, before anything was sent
}

// watch follows build bl of template name until it ends and records
// how; one watcher a build.
func (t *Templates) watch(name string, bl catalog.TemplateBuild) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.watching[bl.ID] || t.life.Err() != nil {
		return
	}
	t.watching[bl.ID] = true
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		defer func() {
			t.mu.Lock()
			delete(t.watching, bl.ID)
			t.mu.Unlock()
		}()
		wait := time.Second
		for {
			err := t.follow(name, bl)
			if err == nil || t.life.Err() != nil {
				return
			}
			if t.gone(bl.HostID) || errors.Is(err, builds.ErrNotFound) {
				t.drop(t.life, name, bl, err)
				return
			}
			t.log.Warn("cannot follow a template build; retrying", "template", name, "build_id", bl.ID, "host_id", bl.HostID, "err", err)
			select {
			case <-t.life.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, 30*time.Second)
		}
	}()
}

// follow waits for build bl to end on its host and records how it ended.
func (t *Templates) follow(name string, bl catalog.TemplateBuild) error {
	b, err := t.builderOf(bl.HostID)
	if err != nil {
		return err
	}
	st, err := b.Follow(t.life, bl.ID, func(string) {})
	if err != nil {
		return err
	}
	return t.record(t.life, name, bl, st)
}

// record records how build bl ended (st): its version, or nothing.
func (t *Templates) record(ctx context.Context, name string, bl catalog.TemplateBuild, st builds.Status) error {
	if !st.Done() {
		return nil
	}
	if st.State != builds.StateSucceeded {
		t.drop(ctx, name, bl, errors.New(st.Error))
		return nil
	}
	b, err := t.builderOf(bl.HostID)
	if err != nil {
		return err
	}
	ref := templates.Ref(name, bl.Version)
	u, err := b.UserTemplate(ctx, ref)
	if errors.Is(err, templates.ErrNotFound) {
		t.drop(ctx, name, bl, fmt.Errorf("the host does not have %s", ref))
		return nil
	}
	if err != nil {
		return err
	}
	ver, err := versionOf(u)
	if err != nil {
		return err
	}
	recorded := false
	_, err = t.r.cfg.Catalog.UpdateTemplate(ctx, name, func(tp *catalog.Template) error {
		i := slices.IndexFunc(tp.Builds, func(x catalog.TemplateBuild) bool { return x.ID == bl.ID })
		if i < 0 {
			return nil // recorded already
		}
		tp.Builds = slices.Delete(tp.Builds, i, i+1)
		tp.Versions = addVersion(tp.Versions, ver)
		recorded = true
		return nil
	})
	if errors.Is(err, catalog.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if recorded {
		t.log.Info("template version recorded", "template", ref, "build_id", bl.ID, "host_id", bl.HostID)
	}
	return nil
}

// drop removes build bl from its template (a template left without
// versions is deleted); its version number is not given out again.
func (t *Templates) drop(ctx context.Context, name string, bl catalog.TemplateBuild, why error) {
	_, err := t.r.cfg.Catalog.UpdateTemplate(ctx, name, func(tp *catalog.Template) error {
		tp.Builds = slices.DeleteFunc(tp.Builds, func(x catalog.TemplateBuild) bool { return x.ID == bl.ID })
		return nil
	})
	if err != nil && !errors.Is(err, catalog.ErrNotFound) {
		t.log.Error("cannot record a template build's end", "template", name, "build_id", bl.ID, "err", err)
		return
	}
	t.log.Info("template build ended without a version", "template", name, "version", bl.Version, "build_id", bl.ID, "host_id", bl.HostID, "why", why)
}

// versionInfo is what the catalog keeps of a version (TemplateVersion.Info).
type versionInfo struct {
	templates.UserRootFS
	DiskBytes int64 `json:"disk_bytes,omitempty"`
}

// versionOf is the catalog's record of version u, as its host describes it.
func versionOf(u templates.UserRootFS) (catalog.TemplateVersion, error) {
	info, err := json.Marshal(versionInfo{UserRootFS: u, DiskBytes: u.DiskBytes})
	return catalog.TemplateVersion{Version: u.Version, Info: info}, err
}

// addVersion adds ver to vs, kept oldest first.
func addVersion(vs []catalog.TemplateVersion, ver catalog.TemplateVersion) []catalog.TemplateVersion {
	i, _ := slices.BinarySearchFunc(vs, ver.Version, func(x catalog.TemplateVersion, v int) int { return cmp.Compare(x.Version, v) })
	return slices.Insert(vs, i, ver)
}

// versionIndex is the index of version v in tp.Versions, -1 if none.
func versionIndex(tp catalog.Template, v int) int {
	return slices.IndexFunc(tp.Versions, func(x catalog.TemplateVersion) bool { return x.Version == v })
}

// running returns the build with id the catalog says is running, and its
// template's name.
func (t *Templates) running(ctx context.Context, id string) (string, catalog.TemplateBuild, bool, error) {
	ts, err := t.r.cfg.Catalog.ListTemplates(ctx)
	if err != nil {
		return "", catalog.TemplateBuild{}, false, err
	}
	for _, tp := range ts {
		for _, b := range tp.Builds {
			if b.ID == id {
				return tp.Name, b, true, nil
			}
		}
	}
	return "", catalog.TemplateBuild{}, false, nil
}

// members returns the template builds of every host connected, by id.
func (t *Templates) members() map[string]builds.Builder {
	t.r.mu.Lock()
	defer t.r.mu.Unlock()
	out := map[string]builds.Builder{}
	for id, m := range t.r.members {
		if m.client != nil && m.rec.State != catalog.HostLost {
			out[id] = m.client.Builds()
		}
	}
	return out
}

// locate returns the builder of the host that runs (or ran) build id, its
// status (with the host's id), and, while the catalog says it runs, its
// record.
func (t *Templates) locate(ctx context.Context, id string) (builds.Builder, builds.Status, func(builds.Status) error, error) {
	name, bl, ok, err := t.running(ctx, id)
	if err != nil {
		return nil, builds.Status{}, nil, err
	}
	if ok {
		b, err := t.builderOf(bl.HostID)
		if err != nil {
			return nil, builds.Status{}, nil, err
		}
		st, err := b.Get(ctx, id)
		if err != nil {
			return nil, builds.Status{}, nil, err
		}
		st.HostID = bl.HostID
		rec := func(st builds.Status) error {
			if err := t.record(ctx, name, bl, st); err != nil {
				return &controlplane.Error{Kind: controlplane.Unavailable, Msg: "the build ended, but its version is not recorded yet; retry in a few seconds", Err: err}
			}
			return nil
		}
		return b, st, rec, nil
	}
	// Ended: its host still remembers it (for tmplbuild's Retention).
	for hostID, b := range t.connected() {
		if st, err := b.Get(ctx, id); err == nil {
			st.HostID = hostID
			return b, st, func(builds.Status) error { return nil }, nil
		}
	}
	return nil, builds.Status{}, nil, fmt.Errorf("template build %q: %w", id, builds.ErrNotFound)
}

func (t *Templates) Get(ctx context.Context, id string) (builds.Status, error) {
	_, st, rec, err := t.locate(ctx, id)
	if err != nil {
		return builds.Status{}, err
	}
	return st, rec(st)
}

func (t *Templates) Follow(ctx context.Context, id string, line func(string)) (builds.Status, error) {
	b, at, rec, err := t.locate(ctx, id)
	if err != nil {
		return builds.Status{}, err
	}
	st, err := b.Follow(ctx, id, line)
	st.HostID = at.HostID
	if err != nil {
		return st, err
	}
	return st, rec(st)
}

// List returns the builds every connected host remembers and those the
// catalog says run on a host that is not connected (lost, or not back
// yet: as "running", with their host_id; a Get of one answers 503 naming
// the host), newest first.
func (t *Templates) List(ctx context.Context) ([]builds.Status, error) {
	var out []builds.Status
	seen := map[string]bool{}
	for id, b := range t.connected() {
		sts, err := b.List(ctx)
		if err != nil {
			t.log.Warn("list a host's template builds", "host_id", id, "err", err)
			continue
		}
		for _, st := range sts {
			st.HostID = id
			out = append(out, st)
			seen[st.ID] = true
		}
	}
	ts, err := t.r.cfg.Catalog.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	for _, tp := range ts {
		for _, bl := range tp.Builds {
			if !seen[bl.ID] {
				out = append(out, builds.Status{ID: bl.ID, Name: tp.Name, State: builds.StateRunning,
					CreatedAt: bl.CreatedAt, Owner: bl.Owner, HostID: bl.HostID})
			}
		}
	}
	slices.SortFunc(out, func(a, b builds.Status) int {
		if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// Remove removes "NAME" (every version) or "NAME:N" from the registry,
// then asks every connected host to remove its copy and its bakes (each
// removes what it holds from the object store too), best effort: a host
// that is away keeps an unused copy.
func (t *Templates) Remove(ctx context.Context, ref string) error {
	name, v, err := templates.SplitRef(ref)
	if err != nil {
		return fmt.Errorf("%w: no user template %q", templates.ErrNotFound, ref)
	}
	_, err = t.r.cfg.Catalog.UpdateTemplate(ctx, name, func(tp *catalog.Template) error {
		if len(tp.Builds) > 0 {
			b := tp.Builds[0]
			if t.lost(b.HostID) {
				return fmt.Errorf("%w: template %s is being built on host %s, which stopped heartbeating: its version is recorded if the host comes back and finishes it; forgetting the host (DELETE /v1/hosts/%s) gives up on it",
					builds.ErrConflict, name, b.HostID, b.HostID)
			}
			return fmt.Errorf("template %s is being built (on host %s): %w", name, b.HostID, builds.ErrConflict)
		}
		if v == 0 {
			tp.Versions = nil
			return nil
		}
		i := versionIndex(*tp, v)
		switch {
		case i < 0:
			return fmt.Errorf("%w: template %s has no version %d", templates.ErrNotFound, name, v)
		case i == len(tp.Versions)-1:
			return fmt.Errorf("%w: version %d is the latest of template %s; delete the whole template, or build a newer version first", templates.ErrConflict, v, name)
		}
		tp.Versions = slices.Delete(tp.Versions, i, i+1)
		return nil
	})
	if errors.Is(err, catalog.ErrNotFound) {
		return fmt.Errorf("%w: no user template %q", templates.ErrNotFound, ref)
	}
	if err != nil {
		return err
	}
	t.log.Info("template removed", "template", ref)
	for id, b := range t.connected() {
		err := b.Remove(ctx, ref)
		switch {
		case err == nil:
			t.log.Info("removed a host's copy of a deleted template", "host_id", id, "template", ref)
		case !errors.Is(err, templates.ErrNotFound):
			t.log.Warn("a host keeps its copy of a deleted template", "host_id", id, "template", ref, "err", err)
		}
	}
	return nil
}

// SetPublished publishes or withdraws versions of ref in the registry:
// "NAME:N" version N alone; "NAME" its latest version when publishing,
// every version when withdrawing (as template.Store.SetUserPublished).
func (t *Templates) SetPublished(ctx context.Context, ref string, published bool) error {
	name, v, err := templates.SplitRef(ref)
	if err != nil {
		return fmt.Errorf("%w: no user template %q", templates.ErrNotFound, ref)
	}
	_, err = t.r.cfg.Catalog.UpdateTemplate(ctx, name, func(tp *catalog.Template) error {
		l, ok := tp.Latest()
		switch {
		case !ok:
			return catalog.ErrNotFound // only its first build runs
		case v == 0 && published:
			v = l.Version
		case v == 0:
			tp.Published = nil
			return nil
		case versionIndex(*tp, v) < 0:
			return fmt.Errorf("%w: template %s has no version %d", templates.ErrNotFound, name, v)
		}
		tp.Published = slices.DeleteFunc(tp.Published, func(x int) bool { return x == v })
		if published {
			tp.Published = append(tp.Published, v)
		}
		return nil
	})
	if errors.Is(err, catalog.ErrNotFound) {
		return fmt.Errorf("%w: no user template %q", templates.ErrNotFound, name)
	}
	return err
}

// user describes version ver of tp.
func user(tp catalog.Template, ver catalog.TemplateVersion) (templates.UserRootFS, error) {
	var vi versionInfo
	if err := json.Unmarshal(ver.Info, &vi); err != nil {
		return templates.UserRootFS{}, fmt.Errorf("template %s: version %d: %w", tp.Name, ver.Version, err)
	}
	u := vi.UserRootFS
	u.Name, u.Version, u.Owner, u.DiskBytes = tp.Name, ver.Version, tp.Owner, vi.DiskBytes
	// The registry's, not the building host's description's.
	u.Published = tp.IsPublished(ver.Version)
	return u, nil
}

// get returns template name with at least one version.
func (t *Templates) get(ctx context.Context, name string) (catalog.Template, error) {
	tp, err := t.r.cfg.Catalog.GetTemplate(ctx, name)
	if err == nil && len(tp.Versions) == 0 {
		err = catalog.ErrNotFound
	}
	if errors.Is(err, catalog.ErrNotFound) {
		return tp, fmt.Errorf("%w: no user template %q", templates.ErrNotFound, name)
	}
	return tp, err
}

func (t *Templates) UserTemplate(ctx context.Context, ref string) (templates.UserRootFS, error) {
	name, v, err := templates.SplitRef(ref)
	if err != nil {
		return templates.UserRootFS{}, fmt.Errorf("%w: no user template %q", templates.ErrNotFound, ref)
	}
	tp, err := t.get(ctx, name)
	if err != nil {
		return templates.UserRootFS{}, err
	}
	if v == 0 {
		l, _ := tp.Latest()
		return user(tp, l)
	}
	i := versionIndex(tp, v)
	if i < 0 {
		return templates.UserRootFS{}, fmt.Errorf("%w: template %s has no version %d", templates.ErrNotFound, name, v)
	}
	return user(tp, tp.Versions[i])
}

func (t *Templates) UserTemplates(ctx context.Context) ([]templates.UserRootFS, error) {
	ts, err := t.r.cfg.Catalog.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	var out []templates.UserRootFS
	for _, tp := range ts {
		if l, ok := tp.Latest(); ok {
			u, err := user(tp, l)
			if err != nil {
				return nil, err
			}
			out = append(out, u)
		}
	}
	return out, nil
}

func (t *Templates) Versions(ctx context.Context, name string) ([]templates.UserRootFS, error) {
	tp, err := t.get(ctx, name)
	if err != nil {
		return nil, err
	}
	return versionsOf(tp)
}

// AllVersions implements tmplbuild.VersionLister: one catalog read.
func (t *Templates) AllVersions(ctx context.Context) (map[string][]templates.UserRootFS, error) {
	ts, err := t.r.cfg.Catalog.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string][]templates.UserRootFS{}
	for _, tp := range ts {
		if len(tp.Versions) == 0 {
			continue // only its first build runs
		}
		if out[tp.Name], err = versionsOf(tp); err != nil {
			return nil, err
		}
	}
	return out, nil
}

var _ builds.VersionLister = (*Templates)(nil)

func versionsOf(tp catalog.Template) ([]templates.UserRootFS, error) {
	out := make([]templates.UserRootFS, 0, len(tp.Versions))
	for _, ver := range tp.Versions {
		u, err := user(tp, ver)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}
