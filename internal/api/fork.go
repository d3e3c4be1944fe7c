package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/catalog"
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
	key := callerOf(r).Key
	ctx := r.Context()
	t0 := time.Now()

	// Reserve quota for each child first; a child over quota is reported
	// in its slot and not attempted.
	out := make([]forkChildJSON, count)
	var ids []string
	slot := map[string]int{}
	now := time.Now().UTC()
	ttl := time.Duration(parent.TTLSeconds) * time.Second
	if ttl <= 0 {
		ttl = s.cfg.DefaultTTL
	}
	var quotaErr error
	for i := 0; i < count; i++ {
		child := catalog.Sandbox{
			ID: agent.NewID(), KeyID: key.ID, Template: parent.Template, HostID: parent.HostID, State: stateStarting,
			MemoryMiB: parent.MemoryMiB, VCPUs: parent.VCPUs, Metadata: parent.Metadata, Env: parent.Env,
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
		s.writeError(w, r, quotaErr)
		return
	}
	res, err := s.host.Fork(ctx, parent.ID, ids)
	if err != nil {
		for _, id := range ids {
			s.cat.DeleteSandbox(context.WithoutCancel(ctx), id)
		}
		s.writeError(w, r, err)
		return
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
		sb, err := s.markRunning(ctx, id, ttl)
		if err != nil {
			s.host.Kill(context.WithoutCancel(ctx), id)
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
	writeJSON(w, http.StatusOK, map[string]any{
		"children":         out,
		"parent_paused_ms": res.Capture.PausedMS,
		"dirty_bytes":      res.Capture.DirtyBytes,
	})
}

// reserve records a new sandbox against the key's quota.
func (s *Server) reserve(ctx context.Context, key catalog.Key, sb catalog.Sandbox) error {
	maxN, maxMem := s.cfg.MaxSandboxesPerKey, s.cfg.MaxMemoryMiBPerKey
	if key.MaxSandboxes != 0 {
		maxN = key.MaxSandboxes
	}
	if key.MaxMemoryMiB != 0 {
		maxMem = key.MaxMemoryMiB
	}
	if err := s.cat.ReserveSandbox(ctx, sb, maxN, maxMem); err != nil {
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
	if len(req.Name) > 128 || strings.ContainsRune(req.Name, 0) {
		s.writeError(w, r, invalid("name must be at most 128 characters"))
		return
	}
	sb, err := s.running(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	id := agent.NewID()
	si, err := s.host.Snapshot(r.Context(), sb.ID, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sn := catalog.Snapshot{
		ID: id, KeyID: callerOf(r).Key.ID, SandboxID: sb.ID, Name: req.Name, HostID: sb.HostID,
		Template: sb.Template, MemoryMiB: si.Spec.MemoryMiB, VCPUs: si.Spec.VCPUs, SizeBytes: si.SizeBytes,
		CreatedAt: si.CreatedAt,
	}
	if err := s.cat.CreateSnapshot(r.Context(), sn); err != nil {
		s.host.DeleteSnapshot(id)
		s.writeError(w, r, err)
		return
	}
	s.metrics.snapshots.Inc()
	writeJSON(w, http.StatusCreated, snapToJSON(sn))
}

// ownedSnapshot returns the caller's snapshot from the URL.
func (s *Server) ownedSnapshot(ctx context.Context, r *http.Request, id string) (catalog.Snapshot, error) {
	if !agent.ValidID(id) {
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
	if err := s.host.DeleteSnapshot(sn.ID); err != nil && !errors.Is(err, agent.ErrNotFound) {
		s.writeError(w, r, err)
		return
	}
	if err := s.cat.DeleteSnapshot(r.Context(), sn.ID); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) {
	if err := decodeJSON(r, &struct{}{}, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.running(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err = s.pause(r.Context(), sb.ID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toJSON(sb))
}

// pause captures a running sandbox to disk and stops its VMM. A paused
// sandbox does not expire.
func (s *Server) pause(ctx context.Context, id string) (catalog.Sandbox, error) {
	if _, err := s.host.Pause(ctx, id); err != nil {
		return catalog.Sandbox{}, err
	}
	s.metrics.pauses.Inc()
	return s.cat.UpdateSandbox(context.WithoutCancel(ctx), id, func(x *catalog.Sandbox) error {
		x.State = statePaused
		x.ExpiresAt = time.Time{}
		x.UpdatedAt = time.Now().UTC()
		return nil
	})
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) {
	if err := decodeJSON(r, &struct{}{}, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.owned(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if sb.State != statePaused {
		s.writeError(w, r, conflict("sandbox %s is %s, not paused", sb.ID, sb.State))
		return
	}
	if _, err := s.host.Resume(r.Context(), sb.ID); err != nil {
		if !errors.Is(err, agent.ErrConflict) {
			// A failed resume loses the sandbox (its capture is consumed).
			s.markStopped(context.WithoutCancel(r.Context()), sb.ID, "resume_failed")
		}
		s.writeError(w, r, err)
		return
	}
	ttl := time.Duration(sb.TTLSeconds) * time.Second
	if ttl <= 0 {
		ttl = s.cfg.DefaultTTL
	}
	sb, err = s.markRunning(r.Context(), sb.ID, ttl)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.withMemory(sb))
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

// Resources are a host machine's CPUs and memory.
type Resources struct {
	VCPUs              int `json:"vcpus"`
	MemoryMiB          int `json:"memory_mib"`
	MemoryAvailableMiB int `json:"memory_available_mib"`
}

// LocalResources describes the machine this process runs on.
func LocalResources() Resources {
	total, avail := meminfo()
	return Resources{VCPUs: runtime.NumCPU(), MemoryMiB: total, MemoryAvailableMiB: avail}
}

// ResourceReporter is an optional ability of a Host that runs on another
// machine: that machine's resources (an error: it cannot be reached). A
// Host without it runs on this machine.
type ResourceReporter interface {
	Resources(ctx context.Context) (Resources, error)
}

func (s *Server) listHosts(w http.ResponseWriter, r *http.Request) {
	h := hostJSON{ID: s.cfg.HostID, State: "ready", Accel: string(s.host.Accel())}
	res := LocalResources()
	if rr, ok := s.host.(ResourceReporter); ok {
		var err error
		if res, err = rr.Resources(r.Context()); err != nil {
			h.State = "unreachable"
			s.log.Warn("host resources", "host_id", s.cfg.HostID, "err", err)
		}
	}
	h.VCPUs, h.MemoryMiB, h.MemoryAvailableMiB = res.VCPUs, res.MemoryMiB, res.MemoryAvailableMiB
	var pss, priv int64
	for _, info := range s.host.List() {
		if info.State != agent.StateRunning {
			continue
		}
		h.Sandboxes++
		h.MemoryAllocatedMiB += info.MemoryMiB
		if m, err := s.host.Memory(info.ID); err == nil {
			pss += m.PSSBytes
			priv += m.PrivateBytes
		}
	}
	h.SandboxesPSSMiB, h.SandboxesPrivMiB = mib(pss), mib(priv)
	writeJSON(w, http.StatusOK, map[string]any{"hosts": []hostJSON{h}})
}

// meminfo reads MemTotal and MemAvailable in MiB.
func meminfo() (total, avail int) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "MemTotal:":
			total = v >> 10
		case "MemAvailable:":
			avail = v >> 10
		}
	}
	return total, avail
}
