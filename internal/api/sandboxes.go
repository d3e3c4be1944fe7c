package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/catalog"
	"github.com/pandastack/pandastack/internal/template"
)

const maxJSONBody = 1 << 20

// decodeJSON reads a JSON request body strictly: at most 1 MiB, valid
// UTF-8, no unknown fields, nothing after the value. An empty body decodes
// to the zero value when allowEmpty.
func decodeJSON(r *http.Request, v any, allowEmpty bool) error {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxJSONBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errorf(http.StatusRequestEntityTooLarge, "payload_too_large", "JSON body is larger than %d bytes", maxJSONBody)
		}
		return badRequest("read request body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if allowEmpty {
			return nil
		}
		return badRequest("request body is empty; send a JSON object")
	}
	if !utf8.Valid(body) {
		return badRequest("request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("malformed JSON: %v", jsonErrorText(err))
	}
	if dec.More() {
		return badRequest("malformed JSON: unexpected data after the object")
	}
	return nil
}

func jsonErrorText(err error) string {
	var ute *json.UnmarshalTypeError
	if errors.As(err, &ute) {
		return fmt.Sprintf("field %q must be %s", ute.Field, ute.Type.String())
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// sandboxJSON is the Sandbox schema.
type sandboxJSON struct {
	ID         string            `json:"id"`
	Template   string            `json:"template"`
	State      string            `json:"state"`
	MemoryMiB  int               `json:"memory_mib"`
	VCPUs      int               `json:"vcpus"`
	CreatedAt  time.Time         `json:"created_at"`
	ExpiresAt  *time.Time        `json:"expires_at"`
	TTLSeconds int               `json:"ttl_seconds"`
	OnExpire   string            `json:"on_expire,omitempty"`
	Metadata   map[string]string `json:"metadata"`
	HostID     string            `json:"host_id"`
	StopReason string            `json:"stop_reason,omitempty"`
	ParentID   string            `json:"parent_id,omitempty"`
	SnapshotID string            `json:"snapshot_id,omitempty"`
	Memory     *memoryJSON       `json:"memory,omitempty"`
}

type memoryJSON struct {
	PrivateMiB float64 `json:"private_mib"`
	SharedMiB  float64 `json:"shared_mib"`
	PSSMiB     float64 `json:"pss_mib"`
}

func toJSON(sb catalog.Sandbox) sandboxJSON {
	out := sandboxJSON{
		ID: sb.ID, Template: sb.Template, State: sb.State, MemoryMiB: sb.MemoryMiB, VCPUs: sb.VCPUs,
		CreatedAt: sb.CreatedAt.UTC(), TTLSeconds: sb.TTLSeconds, OnExpire: sb.OnExpire,
		Metadata: sb.Metadata, HostID: sb.HostID, StopReason: sb.StopReason,
		ParentID: sb.ParentID, SnapshotID: sb.SnapshotID,
	}
	if out.Metadata == nil {
		out.Metadata = map[string]string{}
	}
	if !sb.ExpiresAt.IsZero() && sb.State != stateStopped {
		t := sb.ExpiresAt.UTC()
		out.ExpiresAt = &t
	}
	return out
}

func mib(b int64) float64 { return float64(b*10/(1<<20)) / 10 }

// withMemory adds live memory figures for a running sandbox.
func (s *Server) withMemory(sb catalog.Sandbox) sandboxJSON {
	out := toJSON(sb)
	if sb.State == stateRunning {
		if m, err := s.host.Memory(sb.ID); err == nil {
			out.Memory = &memoryJSON{PrivateMiB: mib(m.PrivateBytes), SharedMiB: mib(m.SharedBytes), PSSMiB: mib(m.PSSBytes)}
		}
	}
	return out
}

const (
	stateStarting = "starting"
	stateRunning  = "running"
	statePaused   = "paused"
	stateStopped  = "stopped"
)

type createRequest struct {
	Template   string            `json:"template"`
	SnapshotID string            `json:"snapshot_id"`
	TTLSeconds *int              `json:"ttl_seconds"`
	MemoryMiB  int               `json:"memory_mib"`
	VCPUs      int               `json:"vcpus"`
	Metadata   map[string]string `json:"metadata"`
	Env        map[string]string `json:"env"`
	OnExpire   string            `json:"on_expire"`
}

func (s *Server) ttl(seconds *int) (time.Duration, error) {
	if seconds == nil {
		return s.cfg.DefaultTTL, nil
	}
	d := time.Duration(*seconds) * time.Second
	if *seconds < 1 || d > s.cfg.MaxTTL {
		return 0, invalid("ttl_seconds must be between 1 and %d", int(s.cfg.MaxTTL.Seconds()))
	}
	return d, nil
}

func validateLabels(what string, m map[string]string, maxN int) error {
	if len(m) > maxN {
		return invalid("%s has %d entries, at most %d allowed", what, len(m), maxN)
	}
	for k, v := range m {
		if k == "" || len(k) > 256 || len(v) > 4096 || strings.ContainsRune(k, 0) || strings.ContainsRune(v, 0) {
			return invalid("%s entry %q is invalid (keys 1-256 bytes, values up to 4096, no NUL)", what, k)
		}
	}
	return nil
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if err := decodeJSON(r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.create(r.Context(), callerOf(r).Key, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.withMemory(sb))
}

func (s *Server) create(ctx context.Context, key catalog.Key, req createRequest) (catalog.Sandbox, error) {
	ttl, err := s.ttl(req.TTLSeconds)
	if err != nil {
		return catalog.Sandbox{}, err
	}
	if err := validateLabels("metadata", req.Metadata, 64); err != nil {
		return catalog.Sandbox{}, err
	}
	if err := validateLabels("env", req.Env, 256); err != nil {
		return catalog.Sandbox{}, err
	}
	for k := range req.Env {
		if strings.ContainsRune(k, '=') {
			return catalog.Sandbox{}, invalid("env name %q must not contain '='", k)
		}
	}
	switch req.OnExpire {
	case "", "kill":
		req.OnExpire = "kill"
	case "pause":
	default:
		return catalog.Sandbox{}, invalid("on_expire must be \"kill\" or \"pause\"")
	}
	var p template.Params
	if req.SnapshotID != "" {
		sn, err := s.cat.GetSnapshot(ctx, req.SnapshotID)
		if errors.Is(err, catalog.ErrNotFound) || (err == nil && sn.KeyID != key.ID) || !agent.ValidID(req.SnapshotID) {
			return catalog.Sandbox{}, notFound("snapshot %s not found", req.SnapshotID)
		}
		if err != nil {
			return catalog.Sandbox{}, fmt.Errorf("get snapshot: %w", err)
		}
		if (req.Template != "" && req.Template != sn.Template) || (req.MemoryMiB != 0 && req.MemoryMiB != sn.MemoryMiB) || (req.VCPUs != 0 && req.VCPUs != sn.VCPUs) {
			return catalog.Sandbox{}, invalid("a sandbox created from a snapshot has the snapshot's template (%s), memory (%d MiB) and vcpus (%d)", sn.Template, sn.MemoryMiB, sn.VCPUs)
		}
		p = template.Params{Name: sn.Template, MemoryMiB: sn.MemoryMiB, VCPUs: sn.VCPUs}
	} else {
		p = s.host.TemplateParams(req.Template, req.MemoryMiB, req.VCPUs)
		if err := p.Validate(); err != nil {
			return catalog.Sandbox{}, invalid("%v", strings.TrimPrefix(err.Error(), "invalid template parameters: "))
		}
		if _, _, err := s.host.Templates().Lookup(p); err != nil {
			return catalog.Sandbox{}, err
		}
	}
	now := time.Now().UTC()
	sb := catalog.Sandbox{
		ID: agent.NewID(), KeyID: key.ID, Template: p.Name, HostID: s.cfg.HostID, State: stateStarting,
		MemoryMiB: p.MemoryMiB, VCPUs: p.VCPUs, Metadata: req.Metadata, Env: req.Env,
		TTLSeconds: int(ttl.Seconds()), OnExpire: req.OnExpire, SnapshotID: req.SnapshotID,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(ttl),
	}
	// Busy from before the record exists: Resync leaves it alone.
	s.setBusy(sb.ID, true)
	defer s.setBusy(sb.ID, false)
	if err := s.reserve(ctx, key, sb); err != nil {
		return catalog.Sandbox{}, fmt.Errorf("create sandbox: %w", err)
	}
	t0 := time.Now()
	_, err = s.host.Create(ctx, agent.CreateRequest{
		ID: sb.ID, Template: p.Name, MemoryMiB: p.MemoryMiB, VCPUs: p.VCPUs, Env: req.Env, SnapshotID: req.SnapshotID,
		Owner: key.ID,
	})
	if err != nil {
		s.metrics.creates.WithLabelValues("error").Inc()
		// The record only held the quota reservation.
		if derr := s.cat.DeleteSandbox(context.WithoutCancel(ctx), sb.ID); derr != nil {
			s.log.Error("remove record of failed create", "sandbox_id", sb.ID, "err", derr)
		}
		return catalog.Sandbox{}, err
	}
	s.metrics.createSeconds.Observe(time.Since(t0).Seconds())
	s.metrics.creates.WithLabelValues("ok").Inc()
	sb, err = s.markRunning(ctx, sb.ID, ttl)
	if err != nil {
		s.host.Kill(context.WithoutCancel(ctx), sb.ID)
		return catalog.Sandbox{}, fmt.Errorf("record sandbox: %w", err)
	}
	s.log.Info("sandbox created", "sandbox_id", sb.ID, "key_id", key.ID, "template", p.Key(), "snapshot_id", req.SnapshotID, "dur_ms", time.Since(t0).Milliseconds())
	return sb, nil
}

// owned returns the caller's sandbox id from the URL; another key's
// sandbox is not found, exactly like a missing one.
func (s *Server) owned(r *http.Request) (catalog.Sandbox, error) {
	id := chi.URLParam(r, "id")
	if !agent.ValidID(id) {
		return catalog.Sandbox{}, notFound("sandbox %q not found", id)
	}
	sb, err := s.cat.GetSandbox(r.Context(), id)
	if errors.Is(err, catalog.ErrNotFound) || (err == nil && sb.KeyID != callerOf(r).Key.ID) {
		return catalog.Sandbox{}, notFound("sandbox %s not found", id)
	}
	if err != nil {
		return catalog.Sandbox{}, fmt.Errorf("get sandbox: %w", err)
	}
	return sb, nil
}

// running is owned plus a check that the sandbox can take commands.
func (s *Server) running(r *http.Request) (catalog.Sandbox, error) {
	sb, err := s.owned(r)
	if err != nil {
		return sb, err
	}
	if sb.State != stateRunning {
		return sb, conflict("sandbox %s is %s, not running", sb.ID, sb.State)
	}
	return sb, nil
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.owned(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.withMemory(sb))
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := catalog.SandboxFilter{KeyID: callerOf(r).Key.ID}
	switch st := q.Get("state"); st {
	case "":
		f.States = []string{stateStarting, stateRunning, statePaused}
	case stateStarting, stateRunning, statePaused, stateStopped:
		f.States = []string{st}
	default:
		s.writeError(w, r, invalid("state must be one of starting, running, paused, stopped"))
		return
	}
	for _, kv := range q["metadata"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			s.writeError(w, r, invalid("metadata filter %q must be key=value", kv))
			return
		}
		if f.Metadata == nil {
			f.Metadata = map[string]string{}
		}
		f.Metadata[k] = v
	}
	list, err := s.cat.ListSandboxes(r.Context(), f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]sandboxJSON, 0, len(list))
	for _, sb := range list {
		out = append(out, s.withMemory(sb))
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}

func (s *Server) killSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.owned(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.stop(r.Context(), sb.ID, "killed"); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTTL(w http.ResponseWriter, r *http.Request) {
	var req struct {
		TTLSeconds *int `json:"ttl_seconds"`
	}
	if err := decodeJSON(r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.TTLSeconds == nil {
		s.writeError(w, r, invalid("ttl_seconds is required"))
		return
	}
	sb, err := s.owned(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ttl, err := s.ttl(req.TTLSeconds)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err = s.cat.UpdateSandbox(r.Context(), sb.ID, func(x *catalog.Sandbox) error {
		if x.State == stateStopped {
			return conflict("sandbox %s is stopped", x.ID)
		}
		now := time.Now().UTC()
		x.TTLSeconds = int(ttl.Seconds())
		x.ExpiresAt = now.Add(ttl)
		x.UpdatedAt = now
		return nil
	})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.withMemory(sb))
}

func (s *Server) setBusy(id string, busy bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if busy {
		s.busy[id] = true
	} else {
		delete(s.busy, id)
	}
}

// stop kills a sandbox on its host and records it as stopped. Stopping a
// stopped sandbox is a no-op.
func (s *Server) stop(ctx context.Context, id, reason string) error {
	ctx = context.WithoutCancel(ctx)
	sb, err := s.cat.GetSandbox(ctx, id)
	if err != nil {
		return fmt.Errorf("stop sandbox: %w", err)
	}
	if sb.State == stateStopped {
		return nil
	}
	if err := s.host.Kill(ctx, id); err != nil && !errors.Is(err, agent.ErrNotFound) {
		return fmt.Errorf("kill sandbox %s: %w", id, err)
	}
	return s.markStopped(ctx, id, reason)
}

// markRunning records that a sandbox runs; its TTL counts from now, when
// it became usable. It completes even if ctx is canceled: the sandbox runs.
func (s *Server) markRunning(ctx context.Context, id string, ttl time.Duration) (catalog.Sandbox, error) {
	return s.cat.UpdateSandbox(context.WithoutCancel(ctx), id, func(x *catalog.Sandbox) error {
		now := time.Now().UTC()
		x.State = stateRunning
		x.ExpiresAt = now.Add(ttl)
		x.UpdatedAt = now
		return nil
	})
}

func (s *Server) markStopped(ctx context.Context, id, reason string) error {
	_, err := s.cat.UpdateSandbox(ctx, id, func(x *catalog.Sandbox) error {
		if x.State == stateStopped {
			return nil
		}
		now := time.Now().UTC()
		x.State = stateStopped
		x.StopReason = reason
		x.StoppedAt = now
		x.UpdatedAt = now
		return nil
	})
	if err != nil {
		return fmt.Errorf("record stop of %s: %w", id, err)
	}
	s.log.Info("sandbox stopped", "sandbox_id", id, "reason", reason)
	return nil
}

// StopForShutdown stops a sandbox because the server is shutting down.
func (s *Server) StopForShutdown(ctx context.Context, id string) error {
	return s.stop(ctx, id, "server_shutdown")
}

// SandboxExited is the host agent's OnExit callback: a VMM died by itself
// or, if cause is ErrHostShutdown, a host agent stopped it as it shut down.
func (s *Server) SandboxExited(id string, cause error) {
	reason := "vmm_exited"
	if errors.Is(cause, ErrHostShutdown) {
		reason = "host_shutdown"
	}
	s.log.Warn("sandbox stopped by its host", "sandbox_id", id, "reason", reason, "err", cause)
	if err := s.markStopped(context.Background(), id, reason); err != nil && !errors.Is(err, catalog.ErrNotFound) {
		s.log.Error("record vmm exit", "sandbox_id", id, "err", err)
	}
}

// Reconcile makes the catalog and the host agree after a restart of the
// all-in-one server: see Resync; adopted is what the host recovered.
func (s *Server) Reconcile(ctx context.Context, adopted []agent.Recovered) error {
	return s.Resync(ctx, func(context.Context) ([]agent.Info, error) {
		var live []agent.Info
		for _, rc := range adopted {
			if rc.Err != nil {
				continue
			}
			if info, err := s.host.Get(rc.ID); err == nil {
				live = append(live, info)
			}
		}
		return live, nil
	})
}

// errChanged aborts a catalog update whose record changed since Resync
// read it.
var errChanged = errors.New("changed meanwhile")

// Resync makes the catalog agree with what the host lists (list: the
// host's sandboxes), after a restart or when the server reconnects to a
// remote host that it may have missed events from. Live catalog entries of
// this host that the host does not have are marked stopped (vmm_exited,
// or host_restarted if they were still starting); sandboxes the host has
// that the catalog does not list as live are killed; a sandbox the host
// has paused (or running) takes that state in the catalog.
//
// It is safe while requests are served: the catalog is read before the
// host is listed, sandboxes being created or forked (busy) are left
// alone, and a record that changed since it was read is not touched.
func (s *Server) Resync(ctx context.Context, list func(context.Context) ([]agent.Info, error)) error {
	live, err := s.cat.ListSandboxes(ctx, catalog.SandboxFilter{HostID: s.cfg.HostID, States: []string{stateStarting, stateRunning, statePaused}})
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	infos, err := list(ctx)
	if err != nil {
		return fmt.Errorf("reconcile: list host sandboxes: %w", err)
	}
	alive := map[string]agent.State{}
	for _, info := range infos {
		alive[info.ID] = info.State
	}
	known := map[string]bool{}
	for _, sb := range live {
		known[sb.ID] = true
		if s.isBusy(sb.ID) {
			continue
		}
		st, ok := alive[sb.ID]
		var update func(x *catalog.Sandbox) error
		switch {
		case ok && sb.State != stateStarting && string(st) == sb.State:
			continue
		case ok && sb.State != stateStarting && (st == agent.StateRunning || st == agent.StatePaused):
			// e.g. a crash between pausing and recording it
			s.log.Info("sandbox state from its host", "sandbox_id", sb.ID, "state", st, "recorded", sb.State)
			update = func(x *catalog.Sandbox) error {
				x.State = string(st)
				if st == agent.StatePaused {
					x.ExpiresAt = time.Time{}
				}
				return nil
			}
		case ok && sb.State != stateStarting:
			continue // starting or stopping on the host: the next resync sees how it ends
		default:
			if ok {
				s.host.Kill(ctx, sb.ID) // a create that never finished
			}
			reason := "vmm_exited"
			if sb.State == stateStarting {
				reason = "host_restarted"
			}
			update = func(x *catalog.Sandbox) error {
				now := time.Now().UTC()
				x.State, x.StopReason, x.StoppedAt = stateStopped, reason, now
				return nil
			}
		}
		_, err := s.cat.UpdateSandbox(ctx, sb.ID, func(x *catalog.Sandbox) error {
			if x.State != sb.State || !x.UpdatedAt.Equal(sb.UpdatedAt) {
				return errChanged
			}
			if err := update(x); err != nil {
				return err
			}
			x.UpdatedAt = time.Now().UTC()
			return nil
		})
		if errors.Is(err, errChanged) || errors.Is(err, catalog.ErrNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("reconcile %s: %w", sb.ID, err)
		}
	}
	for id := range alive {
		if known[id] || s.isBusy(id) {
			continue
		}
		// Created since the catalog was read?
		if sb, err := s.cat.GetSandbox(ctx, id); err == nil && sb.State != stateStopped {
			continue
		}
		s.log.Warn("killing sandbox unknown to the catalog", "sandbox_id", id)
		s.host.Kill(ctx, id)
	}
	return nil
}

func (s *Server) isBusy(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.busy[id]
}

// Run enforces TTLs (a sandbox past its expiry is stopped within a few
// hundred milliseconds) and forgets long-stopped sandboxes, until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	lastPurge := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		now := time.Now().UTC()
		due, err := s.cat.Due(ctx, now)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Error("list expired sandboxes", "err", err)
			}
			continue
		}
		for _, sb := range due {
			if sb.HostID != s.cfg.HostID || sb.State == stateStarting {
				continue
			}
			s.mu.Lock()
			busy := s.busy[sb.ID]
			if !busy {
				s.busy[sb.ID] = true
			}
			s.mu.Unlock()
			if busy {
				continue
			}
			go func() {
				defer s.setBusy(sb.ID, false)
				if sb.OnExpire == "pause" && sb.State == stateRunning {
					if _, err := s.pause(ctx, sb.ID); err == nil {
						s.metrics.expired.Inc()
						return
					} else {
						s.log.Error("pause expired sandbox; killing it instead", "sandbox_id", sb.ID, "err", err)
					}
				}
				if err := s.stop(ctx, sb.ID, "expired"); err != nil {
					if errors.Is(err, ErrUnavailable) {
						// Retried every tick until the host is back;
						// its absence is logged where it is noticed.
						s.log.Debug("expire sandbox", "sandbox_id", sb.ID, "err", err)
						return
					}
					s.log.Error("expire sandbox", "sandbox_id", sb.ID, "err", err)
				}
				s.metrics.expired.Inc()
			}()
		}
		if time.Since(lastPurge) > time.Minute {
			lastPurge = time.Now()
			if _, err := s.cat.PurgeStopped(ctx, now.Add(-s.cfg.StoppedRetention)); err != nil && ctx.Err() == nil {
				s.log.Error("purge stopped sandboxes", "err", err)
			}
		}
	}
}
