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
	"github.com/pandastack/pandastack/internal/catalog"
	"github.com/pandastack/pandastack/internal/control"
	"github.com/pandastack/pandastack/internal/host"
	"github.com/pandastack/pandastack/internal/lifecycle"
	"github.com/pandastack/pandastack/internal/network"
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
			return errorf(control.TooLarge, "JSON body is larger than %d bytes", maxJSONBody)
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
	Network    network.Policy    `json:"network"`
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
		Metadata: sb.Metadata, HostID: sb.HostID, StopReason: sb.StopReason, LastError: sb.LastError,
		ParentID: sb.ParentID, SnapshotID: sb.SnapshotID, Network: fromCatalogNetwork(sb.Network),
	}
	if out.Metadata == nil {
		out.Metadata = map[string]string{}
	}
	if !sb.ExpiresAt.IsZero() && sb.State != catalog.StateStopped {
		t := sb.ExpiresAt.UTC()
		out.ExpiresAt = &t
	}
	return out
}

func mib(b int64) float64 { return float64(b*10/(1<<20)) / 10 }

// withMemory adds live memory figures for a running sandbox.
func (s *Server) withMemory(ctx context.Context, sb catalog.Sandbox) sandboxJSON {
	out := toJSON(sb)
	if sb.State == catalog.StateRunning {
		if m, err := s.host.Memory(ctx, sb.ID); err == nil {
			out.Memory = &memoryJSON{PrivateMiB: mib(m.PrivateBytes), SharedMiB: mib(m.SharedBytes), PSSMiB: mib(m.PSSBytes)}
		}
	}
	return out
}

// liveStates are every state but stopped.
var liveStates = func() []string {
	var out []string
	for _, st := range lifecycle.Live {
		out = append(out, string(st))
	}
	return out
}()

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
	key := callerOf(r).Key
	sb, hreq, err := s.newSandbox(r.Context(), key, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err = s.create(r.Context(), key, sb, hreq)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.withMemory(r.Context(), sb))
}

// newSandbox validates a create request and returns the record to
// reserve and the host's request.
func (s *Server) newSandbox(ctx context.Context, key catalog.Key, req createRequest) (catalog.Sandbox, host.CreateRequest, error) {
	ttl, err := s.ttl(req.TTLSeconds)
	if err != nil {
		return catalog.Sandbox{}, host.CreateRequest{}, err
	}
	if err := validateLabels("metadata", req.Metadata, 64); err != nil {
		return catalog.Sandbox{}, host.CreateRequest{}, err
	}
	if err := validateLabels("env", req.Env, 256); err != nil {
		return catalog.Sandbox{}, host.CreateRequest{}, err
	}
	for k := range req.Env {
		if strings.ContainsRune(k, '=') {
			return catalog.Sandbox{}, host.CreateRequest{}, invalid("env name %q must not contain '='", k)
		}
	}
	switch req.OnExpire {
	case "", "kill":
		req.OnExpire = "kill"
	case "pause":
	default:
		return catalog.Sandbox{}, host.CreateRequest{}, invalid("on_expire must be \"kill\" or \"pause\"")
	}
	policy := network.DefaultPolicy()
	if len(req.Network) > 0 && string(req.Network) != "null" {
		var err error
		if policy, err = network.ParsePolicy(req.Network); err != nil {
			return catalog.Sandbox{}, host.CreateRequest{}, err
		}
	}
	var p template.Params
	diskMiB := 0
	if req.SnapshotID != "" {
		sn, err := s.cat.GetSnapshot(ctx, req.SnapshotID)
		if errors.Is(err, catalog.ErrNotFound) || (err == nil && sn.KeyID != key.ID) || !host.ValidID(req.SnapshotID) {
			return catalog.Sandbox{}, host.CreateRequest{}, notFound("snapshot %s not found", req.SnapshotID)
		}
		if err != nil {
			return catalog.Sandbox{}, host.CreateRequest{}, fmt.Errorf("get snapshot: %w", err)
		}
		if (req.Template != "" && req.Template != sn.Template && req.Template+":" != strings.SplitAfter(sn.Template, ":")[0]) || (req.MemoryMiB != 0 && req.MemoryMiB != sn.MemoryMiB) || (req.VCPUs != 0 && req.VCPUs != sn.VCPUs) {
			return catalog.Sandbox{}, host.CreateRequest{}, invalid("a sandbox created from a snapshot has the snapshot's template (%s), memory (%d MiB) and vcpus (%d)", sn.Template, sn.MemoryMiB, sn.VCPUs)
		}
		p = template.Params{Name: sn.Template, MemoryMiB: sn.MemoryMiB, VCPUs: sn.VCPUs}
		if t, _, err := s.host.Templates().Lookup(ctx, p); err == nil && t != nil {
			diskMiB = t.DiskMiB
		}
	} else {
		p = s.host.TemplateParams(req.Template, req.MemoryMiB, req.VCPUs)
		// A user template is created from one version, which the sandbox
		// records ("NAME:N"): a rebuild does not change what it runs.
		ref, err := s.resolveTemplate(key, p.Name)
		if err != nil {
			return catalog.Sandbox{}, host.CreateRequest{}, err
		}
		p.Name = ref
		if err := p.Validate(); err != nil {
			return catalog.Sandbox{}, host.CreateRequest{}, invalid("%v", strings.TrimPrefix(err.Error(), "invalid template parameters: "))
		}
		t, reason, err := s.host.Templates().Lookup(ctx, p)
		if errors.Is(err, template.ErrNotFound) && !key.Admin {
			// The store's message lists every template, others' too.
			return catalog.Sandbox{}, host.CreateRequest{}, notFound("template %q not found", p.Name)
		}
		if err != nil {
			return catalog.Sandbox{}, host.CreateRequest{}, err
		}
		if t == nil && !key.Admin && !allowedShape(p) {
			// Creating with a shape never baked bakes it: a new template
			// on disk. Keys other than admin ones get a bounded set.
			return catalog.Sandbox{}, host.CreateRequest{}, invalid("template %s has never been baked with %d MiB and %d vCPUs (%s); "+
				"without an admin key, memory_mib and vcpus must be powers of two (e.g. 512, 1024, 2048 MiB and 1, 2, 4 vCPUs)",
				p.Name, p.MemoryMiB, p.VCPUs, reason)
		}
		if t != nil {
			diskMiB = t.DiskMiB
		}
	}
	now := time.Now().UTC()
	sb := catalog.Sandbox{
		ID: host.NewID(), KeyID: key.ID, Template: p.Name, HostID: s.cfg.HostID, State: catalog.StateStarting,
		MemoryMiB: p.MemoryMiB, VCPUs: p.VCPUs, DiskMiB: diskMiB, Metadata: req.Metadata, Env: req.Env,
		Network:    toCatalogNetwork(policy),
		TTLSeconds: int(ttl.Seconds()), OnExpire: req.OnExpire, SnapshotID: req.SnapshotID,
		CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(ttl),
	}
	hreq := host.CreateRequest{Template: p.Name, MemoryMiB: p.MemoryMiB, VCPUs: p.VCPUs, Env: req.Env, SnapshotID: req.SnapshotID,
		Network: policy}
	return sb, hreq, nil
}

// allowedShape reports whether a key without admin rights may bake p's
// shape by creating a sandbox with it: powers of two only, so that the
// templates any key can make are few.
func allowedShape(p template.Params) bool {
	pow2 := func(n int) bool { return n > 0 && n&(n-1) == 0 }
	return pow2(p.MemoryMiB) && pow2(p.VCPUs)
}

// owned returns the caller's sandbox id from the URL; another key's
// sandbox is not found, exactly like a missing one.
func (s *Server) owned(r *http.Request) (catalog.Sandbox, error) {
	id := chi.URLParam(r, "id")
	if !host.ValidID(id) {
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
		f.States = liveStates
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
	sb, err = s.applyTTL(r.Context(), sb.ID, ttl)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.withMemory(r.Context(), sb))
}

// applyTTL sets a sandbox's TTL, counted from now (from its resume if it
// is paused); a stopped or stopping sandbox's is a conflict.
func (s *Server) applyTTL(ctx context.Context, id string, ttl time.Duration) (catalog.Sandbox, error) {
	return s.cat.UpdateSandbox(ctx, id, func(x *catalog.Sandbox) error {
		switch x.State {
		case catalog.StateStopped, catalog.StateStopping:
			return conflict("sandbox %s is %s", x.ID, x.State)
		}
		now := time.Now().UTC()
		x.TTLSeconds = int(ttl.Seconds())
		// A paused sandbox does not expire: its new TTL counts from its
		// resume (so does a pausing one's; a resuming one's from now).
		if x.State == catalog.StatePaused || x.State == catalog.StatePausing {
			x.ExpiresAt = time.Time{}
		} else {
			x.ExpiresAt = now.Add(ttl)
		}
		x.UpdatedAt = now
		return nil
	})
}

func toCatalogNetwork(p network.Policy) catalog.Network {
	return catalog.Network{Internet: p.Internet, AllowOut: p.AllowOut, DenyOut: p.DenyOut}
}

func fromCatalogNetwork(n catalog.Network) network.Policy {
	p := network.Policy{Internet: n.Internet, AllowOut: n.AllowOut, DenyOut: n.DenyOut}
	if p.AllowOut == nil {
		p.AllowOut = []string{}
	}
	if p.DenyOut == nil {
		p.DenyOut = []string{}
	}
	return p
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
	p := fromCatalogNetwork(sb.Network)
	if req.Internet != nil {
		p.Internet = *req.Internet
	}
	if req.AllowOut != nil {
		p.AllowOut = *req.AllowOut
	}
	if req.DenyOut != nil {
		p.DenyOut = *req.DenyOut
	}
	if sb, err = s.applyNetwork(r.Context(), sb, p); err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.withMemory(r.Context(), sb))
}

// applyNetwork gives sandbox sb the egress policy p: on its host, then in
// its record.
func (s *Server) applyNetwork(ctx context.Context, sb catalog.Sandbox, p network.Policy) (catalog.Sandbox, error) {
	if err := p.Validate(); err != nil {
		return sb, err
	}
	p = p.Canonical()
	switch sb.State {
	case catalog.StateStopped, catalog.StateStopping:
		return sb, conflict("sandbox %s is %s", sb.ID, sb.State)
	}
	// The host first: if it cannot apply the policy, the record keeps
	// the old one, which is what the sandbox still has.
	if err := s.host.SetNetwork(ctx, sb.ID, p); err != nil {
		return sb, err
	}
	return s.cat.UpdateSandbox(context.WithoutCancel(ctx), sb.ID, func(x *catalog.Sandbox) error {
		x.Network = toCatalogNetwork(p)
		x.UpdatedAt = time.Now().UTC()
		return nil
	})
}
