package rest

// What a revoked key leaves behind, and how an operator removes it.
// Revoking a key (DELETE /v1/keys/{id}) stops its sandboxes, ends its
// event streams and its build requests being received, and cancels its
// builds queued or running. Its snapshots, volumes and templates stay
// (another key may use a published template; the operator decides): POST
// /v1/keys/{id}/purge, on a revoked key only, deletes them — the
// snapshots from the host's disk and the object store, the volumes with
// their files, every version of its templates — and anything a revoke left (a sandbox whose stop
// failed, a build still running). It touches nothing of another key's
// (sandboxes and snapshots of other keys made from its published
// templates keep working from their own files, as after a forced
// delete), and is idempotent: a second purge finds nothing.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// revokedWhy is the error of a build canceled because its key was revoked.
const revokedWhy = "the build was canceled: its API key was revoked"

// cancelBuilds cancels the builds of key keyID that are queued or running
// and returns them.
func (s *Server) cancelBuilds(ctx context.Context, keyID string) ([]builds.Status, error) {
	b, err := s.cp.Builds()
	if err != nil {
		return nil, nil // this server builds nothing
	}
	active, err := s.cp.ActiveBuilds(ctx, keyID)
	if err != nil || len(active) == 0 {
		return nil, err
	}
	c, ok := b.(builds.Canceler)
	if !ok {
		return nil, errorf(controlplane.NotImplemented, "this server's template builder cannot cancel builds")
	}
	var out []builds.Status
	var errs []error
	for _, st := range active {
		if _, err := c.Cancel(ctx, st.ID, revokedWhy); err != nil && !errors.Is(err, builds.ErrNotFound) {
			errs = append(errs, fmt.Errorf("cancel template build %s: %w", st.ID, err))
			continue
		}
		out = append(out, st)
	}
	return out, errors.Join(errs...)
}

// purgeJSON is the answer of POST /v1/keys/{id}/purge.
type purgeJSON struct {
	KeyID            string         `json:"key_id"`
	BuildsCanceled   int            `json:"builds_canceled"`
	SandboxesStopped int            `json:"sandboxes_stopped"`
	SnapshotsDeleted int            `json:"snapshots_deleted"`
	VolumesDeleted   int            `json:"volumes_deleted"`
	TemplatesDeleted []string       `json:"templates_deleted"`
	Failed           []purgeFailure `json:"failed"`
}

// purgeFailure is something a purge could not remove; purging again
// retries it.
type purgeFailure struct {
	What  string      `json:"what"`
	Error errorDetail `json:"error"`
}

// canceledBuildWait bounds how long a purge waits for the builds it
// canceled to end before it deletes their templates.
const canceledBuildWait = time.Minute

// purgeKey is POST /v1/keys/{keyID}/purge (admin keys): see the top of
// this file.
func (s *Server) purgeKey(w http.ResponseWriter, r *http.Request) {
	if err := requireAdmin(r); err != nil {
		s.writeError(w, r, err)
		return
	}
	id := chi.URLParam(r, "keyID")
	if !validKeyID(id) {
		s.writeError(w, r, notFound("key %q not found", id))
		return
	}
	k, err := s.cat.GetKey(r.Context(), id)
	if errors.Is(err, catalog.ErrNotFound) {
		s.writeError(w, r, notFound("key %s not found", id))
		return
	}
	if err != nil {
		s.writeError(w, r, fmt.Errorf("get key: %w", err))
		return
	}
	if !k.Revoked() {
		s.writeError(w, r, conflict("key %s is not revoked: revoke it first (DELETE /v1/keys/%s); a purge deletes its snapshots, volumes and templates", id, id))
		return
	}
	ctx := r.Context()
	out := purgeJSON{KeyID: id, TemplatesDeleted: []string{}, Failed: []purgeFailure{}}
	fail := func(what string, err error) {
		ae := s.logFailure(r, err)
		out.Failed = append(out.Failed, purgeFailure{What: what, Error: errorDetail{Code: ae.Code, Message: ae.Message}})
	}

	s.endBuildRequests(id)
	canceled, err := s.cancelBuilds(ctx, id)
	if err != nil {
		fail("template builds", err)
	}
	out.BuildsCanceled = len(canceled)
	if b, err := s.cp.Builds(); err == nil && len(canceled) > 0 {
		wctx, cancel := context.WithTimeout(ctx, canceledBuildWait)
		for _, st := range canceled {
			b.Follow(wctx, st.ID, func(string) {}) // until it has ended
		}
		cancel()
	}

	live, err := s.cat.ListSandboxes(ctx, catalog.SandboxFilter{KeyID: id, States: controlplane.LiveStates})
	if err != nil {
		fail("sandboxes", fmt.Errorf("list sandboxes: %w", err))
	}
	for _, sb := range live {
		if err := s.cp.Stop(ctx, sb.ID, "key_revoked"); err != nil {
			fail("sandbox "+sb.ID, err)
			continue
		}
		out.SandboxesStopped++
	}

	snaps, err := s.cat.ListSnapshots(ctx, id)
	if err != nil {
		fail("snapshots", fmt.Errorf("list snapshots: %w", err))
	}
	for _, sn := range snaps {
		if sn.KeyID != id {
			continue // never another key's
		}
		if err := s.cp.DeleteSnapshot(ctx, sn.ID); err != nil {
			fail("snapshot "+sn.ID, err)
			continue
		}
		out.SnapshotsDeleted++
	}

	vols, err := s.cat.ListVolumes(ctx, id)
	if err != nil {
		fail("volumes", fmt.Errorf("list volumes: %w", err))
	}
	for _, v := range vols {
		if v.KeyID != id {
			continue // never another key's
		}
		if err := s.cp.DeleteVolume(ctx, v, true); err != nil {
			fail("volume "+v.Name, err)
			continue
		}
		out.VolumesDeleted++
	}

	if b, err := s.cp.Builds(); err == nil {
		us, err := b.UserTemplates(ctx)
		if err != nil {
			fail("templates", err)
		}
		for _, u := range us {
			if u.Owner == "" || u.Owner != id {
				continue
			}
			if err := b.Remove(ctx, u.Name); err != nil {
				fail("template "+u.Name, err)
				continue
			}
			out.TemplatesDeleted = append(out.TemplatesDeleted, u.Name)
		}
	}
	s.log.Info("api key purged", "key_id", id, "builds_canceled", out.BuildsCanceled, "sandboxes_stopped", out.SandboxesStopped,
		"snapshots_deleted", out.SnapshotsDeleted, "volumes_deleted", out.VolumesDeleted, "templates_deleted", len(out.TemplatesDeleted), "failed", len(out.Failed),
		"by", callerOf(r).Key.ID)
	writeJSON(w, http.StatusOK, out)
}
