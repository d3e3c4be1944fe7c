package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/catalog"
	"github.com/pandastack/pandastack/internal/failpoint"
	"github.com/pandastack/pandastack/internal/host"
	"github.com/pandastack/pandastack/internal/lifecycle"
)

// MaxForkCount bounds the children of one fork request.
const MaxForkCount = 64

type forkChildJSON struct {
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
	Error   *errorDetail `json:"error,omitempty"`
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Count *int `json:"count"`
	}
	if err := decodeJSON(r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	if count < 1 || count > MaxForkCount {
		s.writeError(w, r, invalid("count must be between 1 and %d", MaxForkCount))
		return
	}
	parent, err := s.running(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	o, err := s.fork(callerOf(r).Key, parent, count)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	_, val, err := o.wait(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, val)
}

// fork reserves count children of parent against the key's quota and
// forks them, detached from the request: children a client never hears of
// still end up recorded (running, or gone if they failed). A child over
// quota is reported in its slot and not attempted.
func (s *Server) fork(key catalog.Key, parent catalog.Sandbox, count int) (*op, error) {
	return s.detach(parent.ID, "fork", func(ctx context.Context) (catalog.Sandbox, any, error) {
		t0 := time.Now()
		out := make([]forkChildJSON, count)
		var ids []string
		slot := map[string]int{}
		now := time.Now().UTC()
		ttl := s.ttlOf(parent)
		var quotaErr error
		for i := 0; i < count; i++ {
			child := catalog.Sandbox{
				ID: host.NewID(), KeyID: key.ID, Template: parent.Template, HostID: parent.HostID, State: catalog.StateStarting,
				MemoryMiB: parent.MemoryMiB, VCPUs: parent.VCPUs, DiskMiB: parent.DiskMiB, Metadata: parent.Metadata, Env: parent.Env,
				TTLSeconds: int(ttl.Seconds()), OnExpire: parent.OnExpire, ParentID: parent.ID,
				CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(ttl),
			}
			s.setBusy(child.ID, true) // before the record exists: Resync leaves it alone
			if err := s.reserve(ctx, key, child); err != nil {
				s.setBusy(child.ID, false)
				quotaErr = err
				ae := classify(err)
				out[i].Error = &errorDetail{Code: ae.Code, Message: ae.Message}
				continue
			}
			slot[child.ID] = i
			ids = append(ids, child.ID)
		}
		defer func() {
			for _, id := range ids {
				s.setBusy(id, false)
			}
		}()
		if len(ids) == 0 {
			return catalog.Sandbox{}, nil, quotaErr
		}
		res, err := s.host.Fork(ctx, parent.ID, ids)
		if err != nil {
			for _, id := range ids {
				s.cat.DeleteSandbox(context.WithoutCancel(ctx), id)
			}
			return catalog.Sandbox{}, nil, err
		}
		for j, id := range ids { // children come back in request order
			i := slot[id]
			c := res.Children[j]
			if c.Err != nil {
				s.cat.DeleteSandbox(context.WithoutCancel(ctx), id)
				ae := classify(c.Err)
				if ae.Code == "internal" {
					s.log.Error("fork child failed", "parent_id", parent.ID, "sandbox_id", id, "err", c.Err)
				}
				out[i].Error = &errorDetail{Code: ae.Code, Message: ae.Message}
				continue
			}
			sb, err := s.started(ctx, id, ttl)
			if err != nil {
				ae := classify(err)
				out[i].Error = &errorDetail{Code: ae.Code, Message: ae.Message}
				continue
			}
			j := toJSON(sb)
			out[i].Sandbox = &j
		}
		s.metrics.forks.Inc()
		s.metrics.forkPauseSeconds.Observe(res.Capture.Paused.Seconds())
		s.log.Info("sandbox forked", "sandbox_id", parent.ID, "children", len(ids), "paused_ms", res.Capture.PausedMS,
			"dirty_mib", res.Capture.DirtyBytes>>20, "dur_ms", time.Since(t0).Milliseconds())
		return parent, map[string]any{
			"children":         out,
			"parent_paused_ms": res.Capture.PausedMS,
			"dirty_bytes":      res.Capture.DirtyBytes,
		}, nil
	})
}

// limits are a key's quota limits: its own, else the server's defaults.
func (s *Server) limits(key catalog.Key) catalog.Limits {
	pick := func(own, def int) int {
		if own != 0 {
			return own
		}
		return def
	}
	return catalog.Limits{
		Sandboxes: pick(key.MaxSandboxes, s.cfg.MaxSandboxesPerKey),
		MemoryMiB: pick(key.MaxMemoryMiB, s.cfg.MaxMemoryMiBPerKey),
		VCPUs:     pick(key.MaxVCPUs, s.cfg.MaxVCPUsPerKey),
		DiskMiB:   pick(key.MaxDiskMiB, s.cfg.MaxDiskMiBPerKey),
	}
}

// reserve records a new sandbox against the key's quota.
func (s *Server) reserve(ctx context.Context, key catalog.Key, sb catalog.Sandbox) error {
	if err := s.cat.ReserveSandbox(ctx, sb, s.limits(key)); err != nil {
		return fmt.Errorf("reserve sandbox: %w", err)
	}
	return nil
}

type snapshotJSON struct {
	ID        string    `json:"id"`
	Name      string    `json:"name,omitempty"`
	SandboxID string    `json:"sandbox_id"`
	Template  string    `json:"template"`
	MemoryMiB int       `json:"memory_mib"`
	VCPUs     int       `json:"vcpus"`
	SizeBytes int64     `json:"size_bytes"`
	CreatedAt time.Time `json:"created_at"`
}

func snapToJSON(sn catalog.Snapshot) snapshotJSON {
	return snapshotJSON{ID: sn.ID, Name: sn.Name, SandboxID: sn.SandboxID, Template: sn.Template,
		MemoryMiB: sn.MemoryMiB, VCPUs: sn.VCPUs, SizeBytes: sn.SizeBytes, CreatedAt: sn.CreatedAt.UTC()}
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"name"`
	}
	if err := decodeJSON(r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	if len(req.Name) > 128 || strings.ContainsRune(req.Name, 0) || !utf8.ValidString(req.Name) {
		s.writeError(w, r, invalid("name must be at most 128 bytes of UTF-8, without NUL"))
		return
	}
	sb, err := s.running(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	o, err := s.snapshot(callerOf(r).Key, sb, req.Name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	_, val, err := o.wait(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, val)
}

// snapshot takes a snapshot of a running sandbox, detached from the
// request: once the host has it on stable storage it is recorded for the
// key (a crash in between is repaired by Resync).
func (s *Server) snapshot(key catalog.Key, sb catalog.Sandbox, name string) (*op, error) {
	return s.detach(sb.ID, "snapshot", func(ctx context.Context) (catalog.Sandbox, any, error) {
		id := host.NewID()
		si, err := s.host.Snapshot(ctx, sb.ID, id)
		if err != nil {
			return sb, nil, err
		}
		failpoint.Hit("api-snapshot-taken")
		sn := catalog.Snapshot{
			ID: id, KeyID: key.ID, SandboxID: sb.ID, Name: name, HostID: sb.HostID,
			Template: sb.Template, MemoryMiB: si.Spec.MemoryMiB, VCPUs: si.Spec.VCPUs, SizeBytes: si.SizeBytes,
			CreatedAt: si.CreatedAt,
		}
		if err := s.cat.CreateSnapshot(ctx, sn, s.limits(key)); err != nil {
			if derr := s.host.DeleteSnapshot(context.WithoutCancel(ctx), id); derr != nil {
				s.log.Error("delete unrecorded snapshot", "snapshot_id", id, "err", derr)
			}
			return sb, nil, err
		}
		s.metrics.snapshots.Inc()
		return sb, snapToJSON(sn), nil
	})
}

// ownedSnapshot returns the caller's snapshot from the URL.
func (s *Server) ownedSnapshot(ctx context.Context, r *http.Request, id string) (catalog.Snapshot, error) {
	if !host.ValidID(id) {
		return catalog.Snapshot{}, notFound("snapshot %q not found", id)
	}
	sn, err := s.cat.GetSnapshot(ctx, id)
	if errors.Is(err, catalog.ErrNotFound) || (err == nil && sn.KeyID != callerOf(r).Key.ID) {
		return catalog.Snapshot{}, notFound("snapshot %s not found", id)
	}
	return sn, err
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	list, err := s.cat.ListSnapshots(r.Context(), callerOf(r).Key.ID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]snapshotJSON, 0, len(list))
	for _, sn := range list {
		out = append(out, snapToJSON(sn))
	}
	writeJSON(w, http.StatusOK, map[string]any{"snapshots": out})
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := s.ownedSnapshot(r.Context(), r, chi.URLParam(r, "snapID"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snapToJSON(sn))
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	sn, err := s.ownedSnapshot(r.Context(), r, chi.URLParam(r, "snapID"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.host.DeleteSnapshot(r.Context(), sn.ID); err != nil && !errors.Is(err, host.ErrNotFound) {
		s.writeError(w, r, err)
		return
	}
	// Not found: a reconciliation finished this delete meanwhile.
	if err := s.cat.DeleteSnapshot(r.Context(), sn.ID); err != nil && !errors.Is(err, catalog.ErrNotFound) {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	s.lifecycleOp(w, r, s.pause, catalog.StateRunning)
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) {
	s.lifecycleOp(w, r, s.resume, catalog.StatePaused)
}

// lifecycleOp serves pause and resume: the sandbox must be in state from
// (or already in the operation: the request joins it), the operation runs
// detached, and the answer is the sandbox as it left it. A client that
// goes away does not cancel it; GET tells how it ended (state, last_error).
func (s *Server) lifecycleOp(w http.ResponseWriter, r *http.Request, run func(id string) (*op, error), from string) {
	if err := decodeJSON(r, &struct{}{}, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.owned(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	o, err := run(sb.ID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, _, err = o.wait(r.Context())
	if err != nil {
		var sc *stateConflict
		if errors.As(err, &sc) {
			err = conflict("sandbox %s is %s, not %s", sc.id, sc.state, from)
		}
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.withMemory(r.Context(), sb))
}

type hostJSON struct {
	ID                 string  `json:"id"`
	State              string  `json:"state"`
	Accel              string  `json:"accel"`
	Sandboxes          int     `json:"sandboxes"`
	VCPUs              int     `json:"vcpus"`
	MemoryMiB          int     `json:"memory_mib"`
	MemoryAvailableMiB int     `json:"memory_available_mib"`
	MemoryAllocatedMiB int     `json:"memory_allocated_mib"`
	SandboxesPSSMiB    float64 `json:"sandboxes_pss_mib"`
	SandboxesPrivMiB   float64 `json:"sandboxes_private_mib"`
}

// listHosts describes the hosts. An admin key sees every sandbox on them;
// other keys see the machines' capacity and only their own sandboxes.
func (s *Server) listHosts(w http.ResponseWriter, r *http.Request) {
	h := hostJSON{ID: s.cfg.HostID, State: "ready", Accel: string(s.host.Accel())}
	res := host.LocalResources()
	if rr, ok := s.host.(host.ResourceReporter); ok {
		var err error
		if res, err = rr.Resources(r.Context()); err != nil {
			h.State = "unreachable"
			s.log.Warn("host resources", "host_id", s.cfg.HostID, "err", err)
		}
	}
	h.VCPUs, h.MemoryMiB, h.MemoryAvailableMiB = res.VCPUs, res.MemoryMiB, res.MemoryAvailableMiB
	var running []string
	key := callerOf(r).Key
	if key.Admin {
		infos, err := s.host.List(r.Context())
		if err != nil {
			s.log.Warn("list sandboxes of host", "host_id", s.cfg.HostID, "err", err)
		}
		for _, info := range infos {
			if info.State == lifecycle.Running {
				running = append(running, info.ID)
				h.MemoryAllocatedMiB += info.MemoryMiB
			}
		}
	} else {
		own, err := s.cat.ListSandboxes(r.Context(), catalog.SandboxFilter{KeyID: key.ID, HostID: s.cfg.HostID, States: []string{catalog.StateRunning}})
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		for _, sb := range own {
			running = append(running, sb.ID)
			h.MemoryAllocatedMiB += sb.MemoryMiB
		}
	}
	var pss, priv int64
	for _, id := range running {
		h.Sandboxes++
		if m, err := s.host.Memory(r.Context(), id); err == nil {
			pss += m.PSSBytes
			priv += m.PrivateBytes
		}
	}
	h.SandboxesPSSMiB, h.SandboxesPrivMiB = mib(pss), mib(priv)
	writeJSON(w, http.StatusOK, map[string]any{"hosts": []hostJSON{h}})
}
