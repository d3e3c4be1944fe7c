package storesync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/internal/capture"
	"github.com/pandastack/pandastack/internal/storage/objstore"
)

// User templates in the object store (docs/storage.md).
//
// The host that builds a version of a user template uploads it, before
// the build succeeds, as the chunkstore set userfs/NAME/vN (rootfs.ext4;
// its templates.UserRootFS as the set's Meta). Any other host asked to
// create a sandbox of NAME:N that it lacks downloads that set and installs
// it under the same number (template.Store.InstallUserReplica), then bakes
// it as it would its own. A version number never names two builds (the
// template store never reuses one), so a host's copy of NAME:N is never
// stale. Removing versions deletes their sets; garbage collection then
// removes the chunks no other set uses.

// userfsName is the set name of version v of user template name.
func userfsName(name string, v int) string { return fmt.Sprintf("userfs/%s/v%d", name, v) }

// parseUserfsName is userfsName's inverse (false: not a set of a user
// template's version).
func parseUserfsName(set string) (string, int, bool) {
	rest, ok := strings.CutPrefix(set, "userfs/")
	if !ok {
		return "", 0, false
	}
	name, vs, ok := strings.Cut(rest, "/v")
	v, err := strconv.Atoi(vs)
	if !ok || err != nil || v < 1 || name == "" || strings.Contains(name, "/") {
		return "", 0, false
	}
	return name, v, true
}

// StoredUserTemplates lists the versions of user templates whose set the
// object store holds ("NAME:N", one listing of userfs/): every host's
// builds, this fleet's. Without a store: none.
func (s *Sync) StoredUserTemplates(ctx context.Context) ([]string, error) {
	if s.cfg.Store == nil {
		return nil, nil
	}
	names, err := s.cfg.Store.NamesUnder(ctx, "userfs/")
	if err != nil {
		return nil, fmt.Errorf("list the user templates in the object store: %w", err)
	}
	var out []string
	for _, n := range names {
		if name, v, ok := parseUserfsName(n); ok {
			out = append(out, templates.Ref(name, v))
		}
	}
	return out, nil
}

// PublishUserTemplate uploads version u of a user template, whose
// directory dir holds its rootfs.ext4. Without an object store it does
// nothing.
func (s *Sync) PublishUserTemplate(ctx context.Context, u templates.UserRootFS, dir string) error {
	if s.cfg.Store == nil {
		return nil
	}
	if u.Version < 1 {
		return fmt.Errorf("publish template %s: %w: no version", u.Name, host.ErrInvalid)
	}
	meta, err := json.Marshal(u)
	if err != nil {
		return err
	}
	_, st, err := s.cfg.Store.UploadMeta(ctx, userfsName(u.Name, u.Version), map[string]string{capture.DiskFile: filepath.Join(dir, capture.DiskFile)}, meta, nil)
	if err != nil {
		return err
	}
	s.log.Info("user template uploaded to the object store", "template", templates.Ref(u.Name, u.Version),
		"chunks_uploaded", st.ChunksUploaded, "chunks_shared", st.ChunksShared, "bytes_uploaded", st.BytesUploaded)
	return nil
}

// UnpublishUserTemplate deletes the sets of versions of user template
// name from the object store (those it has not are fine), then, if it
// deleted one, collects the garbage.
func (s *Sync) UnpublishUserTemplate(ctx context.Context, name string, versions []int) error {
	if s.cfg.Store == nil || len(versions) == 0 {
		return nil
	}
	var errs []error
	deleted := 0
	for _, v := range versions {
		err := s.cfg.Store.Delete(ctx, userfsName(name, v))
		switch {
		case err == nil:
			deleted++
		case !errors.Is(err, objstore.ErrNotFound):
			errs = append(errs, err)
		}
	}
	if deleted > 0 {
		// Another host's delete of the same versions (every copy goes)
		// collects nothing more.
		s.StartGC()
	}
	return errors.Join(errs...)
}

// ReplicateUserTemplate makes sure this host holds user template ref when
// ref pins a version ("NAME:N", as the control plane names the template of
// every create): if it lacks it and the object store has it, it downloads
// and installs it. Otherwise, and for every other ref, it does nothing:
// the template store's Lookup then says whether the template exists.
func (s *Sync) ReplicateUserTemplate(ctx context.Context, ref string, progress templates.Progress) error {
	if s.cfg.Store == nil {
		return nil
	}
	// A built-in has no versions, and a user template's name is never a
	// built-in's: a pinned ref is a user template's.
	name, v, err := templates.SplitRef(ref)
	if err != nil || v == 0 {
		return nil
	}
	if _, err := s.cfg.Templates.UserRootFS(ref); err == nil {
		return nil
	}
	// One download per version: concurrent creates share it.
	_, err, _ = s.replicas.Do(ref, func() (any, error) {
		if _, err := s.cfg.Templates.UserRootFS(ref); err == nil {
			return nil, nil // fetched by a download that just ended
		}
		return nil, s.fetchUserTemplate(ctx, name, v, progress)
	})
	return err
}

// fetchUserTemplate downloads version v of user template name from the
// object store and installs it; nothing if the store has no such version.
func (s *Sync) fetchUserTemplate(ctx context.Context, name string, v int, progress templates.Progress) error {
	ref := templates.Ref(name, v)
	m, err := s.cfg.Store.Manifest(ctx, userfsName(name, v))
	if errors.Is(err, objstore.ErrNotFound) {
		return nil
	}
	if err != nil {
		return s.LookupError(ctx, "template", ref, err)
	}
	var u templates.UserRootFS
	if err := json.Unmarshal(m.Meta, &u); err != nil || u.Name != name || u.Version != v {
		s.log.Error("user template's metadata in the object store is unreadable", "template", ref, "err", err)
		return fmt.Errorf("template %s: %w: its record in the object store is unreadable", ref, host.ErrCorrupt)
	}
	if progress != nil {
		progress(fmt.Sprintf("fetching template %s from the object store (built on another host)", ref))
	}
	t0 := time.Now()
	dir, err := s.cfg.Templates.StageUserRootFS(name)
	if err != nil {
		return fmt.Errorf("fetch template %s: %w", ref, classifyIO(err))
	}
	if err := s.cfg.Store.DownloadManifest(ctx, m, dir); err != nil {
		os.RemoveAll(dir)
		if errors.Is(err, objstore.ErrUnavailable) {
			return s.LookupError(ctx, "template", ref, err)
		}
		return fmt.Errorf("fetch template %s: %w", ref, classifyIO(err))
	}
	if err := s.cfg.Templates.InstallUserReplica(dir, u); err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("fetch template %s: %w", ref, classifyIO(err))
	}
	s.log.Info("user template fetched from the object store", "template", ref, "dur_ms", time.Since(t0).Milliseconds(), "size_bytes", u.SizeBytes)
	return nil
}

// SweepUserCopies removes this host's copies of user template versions
// (templates.UserRootFS.Copy: numbered by a fleet's registry, each in the
// store from before its build succeeded) whose set the object store does
// not have, with their bakes, and returns how many it removed: versions
// deleted while this host was away, or whose build stopped before its
// upload. Versions it built before it joined a fleet are kept. One
// listing of the store's userfs/ sets. Call it before the host builds or
// creates anything (a build's version is not uploaded
// yet while it runs). Without a store it does nothing; with a store that
// cannot be reached it removes nothing.
func (s *Sync) SweepUserCopies(ctx context.Context) (int, error) {
	if s.cfg.Store == nil {
		return 0, nil
	}
	users, err := s.cfg.Templates.UserRootFSes()
	if err != nil || len(users) == 0 {
		return 0, err
	}
	names, err := s.cfg.Store.NamesUnder(ctx, "userfs/")
	if err != nil {
		return 0, fmt.Errorf("list the user templates in the object store: %w", err)
	}
	published := map[string]bool{}
	for _, n := range names {
		published[n] = true
	}
	removed := 0
	for _, latest := range users {
		vs, err := s.cfg.Templates.UserVersions(latest.Name)
		if err != nil {
			return removed, err
		}
		for _, u := range vs {
			if !u.Copy {
				continue // not the fleet's: built before this host joined one
			}
			if published[userfsName(u.Name, u.Version)] {
				continue
			}
			ref := templates.Ref(u.Name, u.Version)
			if err := s.cfg.Templates.RemoveUserCopy(u.Name, u.Version); err != nil && !errors.Is(err, templates.ErrNotFound) {
				return removed, fmt.Errorf("remove template %s: %w", ref, err)
			}
			s.log.Info("removed a copy of a user template the object store no longer has", "template", ref)
			removed++
		}
	}
	return removed, nil
}
