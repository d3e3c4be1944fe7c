package rest

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
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/scheduler"
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
			return errorf(controlplane.TooLarge, "JSON body is larger than %d bytes", maxJSONBody)
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
	LastError  string            `json:"last_error,omitempty"`
	ParentID   string            `json:"parent_id,omitempty"`
	SnapshotID string            `json:"snapshot_id,omitempty"`
	Network    netpolicy.Policy  `json:"network"`
	// NetworkOff: the sandbox's host runs without sandbox networking, so
	// the guest reaches nothing whatever Network says (the policy applies
	// if it resumes on a host with networking).
	NetworkOff bool        `json:"network_off,omitempty"`
	Memory     *memoryJSON `json:"memory,omitempty"`
	// Stored and StoreError are a paused sandbox's capture in the object
	// store (its host's: local, uploading, durable).
	Stored     string `json:"stored,omitempty"`
	StoreError string `json:"store_error,omitempty"`
	// Volumes are the volumes it mounts, by name (their id if deleted).
	Volumes []sandboxVolumeJSON `json:"volumes,omitempty"`
}

// sandboxVolumeJSON is one volume a sandbox mounts.
type sandboxVolumeJSON struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only"`
}

type memoryJSON struct {
	PrivateMiB float64         `json:"private_mib"`
	SharedMiB  float64         `json:"shared_mib"`
	PSSMiB     float64         `json:"pss_mib"`
	Lazy       *lazyMemoryJSON `json:"lazy,omitempty"`
}

// lazyMemoryJSON is host.LazyMemStats in MiB.
type lazyMemoryJSON struct {
	ImageMiB   float64 `json:"image_mib"`
	ReadMiB    float64 `json:"read_mib"`
	FetchedMiB float64 `json:"fetched_mib"`
	LocalMiB   float64 `json:"local_mib"`
}

func toMemoryJSON(m host.MemStats) *memoryJSON {
	out := &memoryJSON{PrivateMiB: mib(m.PrivateBytes), SharedMiB: mib(m.SharedBytes), PSSMiB: mib(m.PSSBytes)}
	if l := m.Lazy; l != nil {
		out.Lazy = &lazyMemoryJSON{ImageMiB: mib(l.ImageBytes), ReadMiB: mib(l.ReadBytes), FetchedMiB: mib(l.FetchedBytes), LocalMiB: mib(l.LocalBytes)}
	}
	return out
}

func (s *Server) toJSON(sb catalog.Sandbox) sandboxJSON {
	out := sandboxJSON{
		ID: sb.ID, Template: sb.Template, State: sb.State, MemoryMiB: sb.MemoryMiB, VCPUs: sb.VCPUs,
		CreatedAt: sb.CreatedAt.UTC(), TTLSeconds: sb.TTLSeconds, OnExpire: sb.OnExpire,
		Metadata: sb.Metadata, HostID: sb.HostID, StopReason: sb.StopReason, LastError: sb.LastError,
		ParentID: sb.ParentID, SnapshotID: sb.SnapshotID, Network: controlplane.PolicyOf(sb.Network),
		NetworkOff: s.networkOff(sb.HostID),
	}
	if out.Metadata == nil {
		out.Metadata = map[string]string{}
	}
	for _, m := range sb.Volumes {
		name := m.VolumeID
		if v, err := s.cat.GetVolume(context.Background(), m.VolumeID); err == nil {
			name = v.Name
		}
		out.Volumes = append(out.Volumes, sandboxVolumeJSON{Name: name, Path: m.Path, ReadOnly: m.ReadOnly})
	}
	if !sb.ExpiresAt.IsZero() && sb.State != catalog.StateStopped {
		t := sb.ExpiresAt.UTC()
		out.ExpiresAt = &t
	}
	return out
}

// networkOff reports that host id is known to run without sandbox
// networking (a host that cannot say now, lost or not connected: false).
func (s *Server) networkOff(id string) bool {
	h := s.host
	if s.cfg.Fleet != nil {
		var err error
		if h, err = s.cfg.Fleet.Host(id); err != nil {
			return false
		}
	}
	nr, ok := h.(host.NetworkReporter)
	return ok && nr.NetworkOff()
}

func mib(b int64) float64 { return float64(b*10/(1<<20)) / 10 }

// StateLost is the state a sandbox shows while its host is lost (its
// record keeps the state it had: the sandbox is back as it was if the
// host returns). Paused sandboxes show paused: they resume elsewhere.
const StateLost = "lost"

// hostLost reports whether sb is live on a host that is lost.
func (s *Server) hostLost(sb catalog.Sandbox) bool {
	if s.cfg.Fleet == nil || sb.State == catalog.StateStopped || sb.State == catalog.StatePaused {
		return false
	}
	_, err := s.cfg.Fleet.Host(sb.HostID)
	return errors.Is(err, controlplane.ErrHostLost)
}

// withMemory adds live memory figures for a running sandbox.
func (s *Server) withMemory(ctx context.Context, sb catalog.Sandbox) sandboxJSON {
	out := s.toJSON(sb)
	if s.hostLost(sb) {
		out.State = StateLost
		return out
	}
	if sb.State == catalog.StatePaused {
		if info, err := s.host.Get(ctx, sb.ID); err == nil {
			out.Stored, out.StoreError = info.Stored, info.StoreError
		}
	}
	if sb.State == catalog.StateRunning {
		if m, err := s.host.Memory(ctx, sb.ID); err == nil {
			out.Memory = toMemoryJSON(m)
		}
	}
	return out
}

type createRequest struct {
	Template   string            `json:"template"`
	SnapshotID string            `json:"snapshot_id"`
	TTLSeconds *int              `json:"ttl_seconds"`
	MemoryMiB  int               `json:"memory_mib"`
	VCPUs      int               `json:"vcpus"`
	Metadata   map[string]string `json:"metadata"`
	Env        map[string]string `json:"env"`
	OnExpire   string            `json:"on_expire"`
	// Network is decoded by network.ParsePolicy (defaults, unknown
	// fields, entries checked there).
	Network json.RawMessage `json:"network"`
	// Placement is decoded by scheduler.Placement.
	Placement scheduler.Placement               `json:"placement"`
	Volumes   []controlplane.VolumeMountRequest `json:"volumes"`
	Progress  func(string)                      `json:"-"` // set for ?progress=1
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if err := decodeJSON(r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	if r.URL.Query().Get("progress") != "1" {
		sb, err := s.cp.Create(r.Context(), callerOf(r).Key, controlplane.CreateRequest(req))
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		writeJSON(w, http.StatusCreated, s.withMemory(r.Context(), sb))
		return
	}
	// ?progress=1: NDJSON, as a bake's; the progress of what the create
	// does first (fetch, bake), then done with the sandbox, or error.
	out := newNDJSON(w)
	req.Progress = func(msg string) { out.send(map[string]string{"type": "progress", "message": msg}) }
	sb, err := s.cp.Create(r.Context(), callerOf(r).Key, controlplane.CreateRequest(req))
	if err != nil {
		ae := s.logFailure(r, err)
		out.send(map[string]any{"type": "error", "error": errorDetail{Code: ae.Code, Message: ae.Message}})
		return
	}
	out.send(map[string]any{"type": "done", "sandbox": s.withMemory(r.Context(), sb)})
}

// owned returns the caller's sandbox id from the URL; another key's
// sandbox is not found, exactly like a missing one.
func (s *Server) owned(r *http.Request) (catalog.Sandbox, error) {
	return s.cp.Sandbox(r.Context(), callerOf(r).Key.ID, chi.URLParam(r, "id"))
}

// running is owned plus a check that the sandbox can take commands.
func (s *Server) running(r *http.Request) (catalog.Sandbox, error) {
	sb, err := s.owned(r)
	if err != nil {
		return sb, err
	}
	if sb.State != catalog.StateRunning {
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
	writeJSON(w, http.StatusOK, s.withMemory(r.Context(), sb))
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := catalog.SandboxFilter{KeyID: callerOf(r).Key.ID}
	switch st := q.Get("state"); {
	case st == "":
		f.States = controlplane.LiveStates
	case lifecycle.State(st).Valid():
		f.States = []string{st}
	default:
		s.writeError(w, r, invalid("state must be one of starting, running, pausing, paused, resuming, stopping, stopped"))
		return
	}
	for _, kv := range q["metadata"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			s.writeError(w, r, invalid("metadata filter %q must be key=value", kv))
			return
		}
		if strings.ContainsRune(kv, 0) || !utf8.ValidString(kv) {
			s.writeError(w, r, invalid("metadata filter %q must be valid UTF-8 without NUL", kv))
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
		out = append(out, s.withMemory(r.Context(), sb))
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}

func (s *Server) killSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.owned(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.cp.Stop(r.Context(), sb.ID, "killed"); err != nil {
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
	ttl, err := s.cp.TTL(req.TTLSeconds)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err = s.cp.SetTTL(r.Context(), sb.ID, ttl)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.withMemory(r.Context(), sb))
}

// setNetwork changes a sandbox's egress policy: the fields given replace
// the current ones (PATCH), the rest stay. A running sandbox's rules change
// at once; a paused one's at its resume.
func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Internet *bool     `json:"internet"`
		AllowOut *[]string `json:"allow_out"`
		DenyOut  *[]string `json:"deny_out"`
	}
	if err := decodeJSON(r, &req, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.owned(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	p := controlplane.PolicyOf(sb.Network)
	if req.Internet != nil {
		p.Internet = *req.Internet
	}
	if req.AllowOut != nil {
		p.AllowOut = *req.AllowOut
	}
	if req.DenyOut != nil {
		p.DenyOut = *req.DenyOut
	}
	if sb, err = s.cp.SetNetwork(r.Context(), sb, p); err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.withMemory(r.Context(), sb))
}
