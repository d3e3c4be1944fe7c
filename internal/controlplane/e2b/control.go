package e2b

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// apiError is an error with the HTTP status and message E2B answers with.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func errStatus(status int, format string, args ...any) error {
	return &apiError{status: status, msg: fmt.Sprintf(format, args...)}
}

// status classifies err for E2B: its own errors as they are, a body over
// its cap (http.MaxBytesReader) as 413, the Backend's by Backend.Status, with PandaStack's 422 (invalid) as E2B's
// 400.
func (s *Server) status(err error) (int, string) {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae.status, ae.msg
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is larger than %d bytes", mbe.Limit)
	}
	st, msg := s.b.Status(err)
	if st == http.StatusUnprocessableEntity {
		st = http.StatusBadRequest
	}
	return st, msg
}

// writeError answers in E2B's error shape {"code": status, "message": …}:
// the SDK tests the body's code (404 → not found, or kill's false).
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	st, msg := s.status(err)
	if st >= 500 {
		s.log.Warn("e2b request failed", "method", r.Method, "path", r.URL.Path, "status", st, "err", err)
	}
	writeJSON(w, st, map[string]any{"code": st, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (s *Server) controlRoutes() *http.ServeMux {
	m := http.NewServeMux()
	// SDK >= 2.51 creates and connects under /v2, older ones under /.
	m.HandleFunc("POST /sandboxes", s.auth(s.create))
	m.HandleFunc("POST /v2/sandboxes", s.auth(s.create))
	m.HandleFunc("POST /sandboxes/{id}/connect", s.auth(s.connect))
	m.HandleFunc("POST /v2/sandboxes/{id}/connect", s.auth(s.connect))
	m.HandleFunc("GET /v2/sandboxes", s.auth(s.list))
	m.HandleFunc("GET /sandboxes", s.auth(s.list))
	m.HandleFunc("GET /sandboxes/{id}", s.auth(s.get))
	m.HandleFunc("DELETE /sandboxes/{id}", s.auth(s.kill))
	m.HandleFunc("POST /sandboxes/{id}/timeout", s.auth(s.setTimeout))
	m.HandleFunc("POST /sandboxes/{id}/pause", s.auth(s.pause))
	m.HandleFunc("POST /sandboxes/{id}/resume", s.auth(s.resume))
	m.HandleFunc("POST /sandboxes/{id}/fork", s.auth(s.fork))
	m.HandleFunc("PUT /sandboxes/{id}/network", s.auth(s.updateNetwork))
	s.volumeRoutes(m)
	for _, p := range []string{"GET /sandboxes/{id}/metrics", "POST /sandboxes/{id}/snapshots"} {
		m.HandleFunc(p, s.auth(func(w http.ResponseWriter, r *http.Request, _ string) {
			s.writeError(w, r, errStatus(http.StatusNotImplemented, "%s %s is not supported by PandaStack's E2B API yet", r.Method, r.Pattern[strings.Index(r.Pattern, " ")+1:]))
		}))
	}
	return m
}

// auth authenticates the X-API-KEY header (a PandaStack API key) and
// passes the key's id on. It reads no body: a request it refuses is
// answered at once, unread (see refuse).
func (s *Server) auth(h func(w http.ResponseWriter, r *http.Request, keyID string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		secret := strings.TrimSpace(r.Header.Get("X-API-KEY"))
		if secret == "" {
			secret, _ = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			secret = strings.TrimSpace(secret)
		}
		var keyID string
		err := errStatus(http.StatusUnauthorized, "missing API key: send X-API-KEY with a PandaStack API key")
		if secret != "" {
			keyID, err = s.b.Authenticate(r.Context(), secret)
		}
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		h(w, r, keyID)
	}
}

// maxJSONBody bounds a control-plane request's JSON body.
const maxJSONBody = 1 << 20

// decode reads a JSON body of at most maxJSONBody bytes (413 beyond); an
// empty one leaves v as it is.
func decode(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxJSONBody+1))
	if err != nil {
		return errStatus(http.StatusBadRequest, "read request body: %v", err)
	}
	if len(b) > maxJSONBody {
		return errStatus(http.StatusRequestEntityTooLarge, "the JSON body is larger than %d bytes", maxJSONBody)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return errStatus(http.StatusBadRequest, "invalid JSON body: %v", strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}

// sandboxJSON is E2B's Sandbox (create, connect) merged with its
// SandboxDetail and ListedSandbox (get, list): the SDK reads what it
// needs of each and ignores the rest.
type sandboxJSON struct {
	SandboxID          string            `json:"sandboxID"`
	TemplateID         string            `json:"templateID"`
	Alias              string            `json:"alias,omitempty"`
	ClientID           string            `json:"clientID"`
	EnvdVersion        string            `json:"envdVersion"`
	EnvdAccessToken    string            `json:"envdAccessToken,omitempty"`
	Domain             *string           `json:"domain"`
	TrafficAccessToken *string           `json:"trafficAccessToken"`
	StartedAt          string            `json:"startedAt"`
	EndAt              string            `json:"endAt"`
	State              string            `json:"state"`
	CPUCount           int               `json:"cpuCount"`
	MemoryMB           int               `json:"memoryMB"`
	DiskSizeMB         int               `json:"diskSizeMB"`
	Metadata           map[string]string `json:"metadata"`
	// AllowInternetAccess, Network and Lifecycle are SandboxDetail's
	// (getInfo).
	AllowInternetAccess bool          `json:"allowInternetAccess"`
	Network             networkJSON   `json:"network"`
	Lifecycle           lifecycleJSON `json:"lifecycle"`
	// VolumeMounts are the volumes it mounts (by name).
	VolumeMounts []VolumeMount `json:"volumeMounts"`
}

// networkJSON is E2B's SandboxNetworkConfig, as far as PandaStack has it.
type networkJSON struct {
	AllowOut []string `json:"allowOut"`
	DenyOut  []string `json:"denyOut"`
}

// lifecycleJSON is E2B's SandboxLifecycle: onTimeout "kill" or "pause";
// PandaStack does not resume a paused sandbox on traffic.
type lifecycleJSON struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// e2bState is E2B's state of a live sandbox: running or paused.
func e2bState(st string) string {
	switch st {
	case "paused", "pausing":
		return "paused"
	}
	return "running"
}

// gone reports whether a sandbox in PandaStack state st is, to E2B,
// not there any more (killed or expired).
func gone(st string) bool { return st == "stopped" || st == "stopping" }

// tokenView is which of a sandbox's tokens toJSON answers.
type tokenView int

const (
	noTokens     tokenView = iota // list
	trafficToken                  // get: the traffic access token
	allTokens                     // create, connect, fork: envd's access token too
)

func (s *Server) toJSON(sb Sandbox, tokens tokenView) sandboxJSON {
	out := sandboxJSON{
		SandboxID: sb.ID, TemplateID: sb.Template, Alias: sb.Template, ClientID: ClientID, EnvdVersion: EnvdVersion,
		StartedAt: sb.CreatedAt.UTC().Format(time.RFC3339Nano), State: e2bState(sb.State),
		CPUCount: sb.VCPUs, MemoryMB: sb.MemoryMiB, DiskSizeMB: sb.DiskMiB, Metadata: sb.Metadata,
		AllowInternetAccess: sb.Network.Internet,
		Network:             networkJSON{AllowOut: nonNil(sb.Network.AllowOut), DenyOut: nonNil(sb.Network.DenyOut)},
		Lifecycle:           lifecycleJSON{OnTimeout: cmp.Or(sb.OnExpire, "kill")},
		VolumeMounts:        sb.Volumes,
	}
	if out.VolumeMounts == nil {
		out.VolumeMounts = []VolumeMount{}
	}
	if tokens >= trafficToken {
		t := s.TrafficAccessToken(sb.ID)
		out.TrafficAccessToken = &t
	}
	if tokens == allTokens {
		out.EnvdAccessToken = s.AccessToken(sb.ID)
	}
	if s.domain != "" {
		d := s.domain
		out.Domain = &d
	}
	end := sb.ExpiresAt
	if end.IsZero() {
		end = time.Now()
	}
	out.EndAt = end.UTC().Format(time.RFC3339Nano)
	if out.Metadata == nil {
		out.Metadata = map[string]string{}
	}
	return out
}

// defaultTimeout is the TTL of a create without one: the SDK's documented
// default (SDK 2.51 no longer sends it).
const defaultTimeout = 300

// createBody is E2B's NewSandbox as far as PandaStack serves it; the
// fields it does not serve are in docs/e2b.md ("Not served yet").
type createBody struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int              `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *egressBody       `json:"network"`
	AutoPause           *bool             `json:"autoPause"`
	VolumeMounts        []VolumeMount     `json:"volumeMounts"`
}

// egressBody is the egress part of E2B's network config (create's
// network; the body of PUT /sandboxes/{id}/network, with
// allow_internet_access).
type egressBody struct {
	AllowOut            []string        `json:"allowOut"`
	DenyOut             []string        `json:"denyOut"`
	EgressProxy         json.RawMessage `json:"egressProxy"`
	Rules               json.RawMessage `json:"rules"`
	AllowInternetAccess *bool           `json:"allow_internet_access"`
}

// policy is the egress policy of e and allowInternet (nil: true): allowOut
// wins over denyOut, as in E2B. What PandaStack cannot do and a caller
// relies on for safety (an egress proxy, per-host rules) is refused
// rather than ignored.
func (e egressBody) policy(allowInternet *bool) (Network, error) {
	if present(e.EgressProxy) {
		return Network{}, errStatus(http.StatusBadRequest, "network.egressProxy is not supported by PandaStack: sandboxes reach the network directly, under allowOut/denyOut")
	}
	if present(e.Rules) && string(e.Rules) != "{}" {
		return Network{}, errStatus(http.StatusBadRequest, "network.rules (per-host request transforms) are not supported by PandaStack")
	}
	return Network{Internet: allowInternet == nil || *allowInternet, AllowOut: e.AllowOut, DenyOut: e.DenyOut}, nil
}

// request maps the body to a CreateRequest: allow_internet_access and
// network's allowOut/denyOut are the sandbox's egress policy
// (egressBody.policy), autoPause is on_expire "pause".
func (b createBody) request() (CreateRequest, error) {
	ttl := b.Timeout
	if ttl == nil {
		d := defaultTimeout
		ttl = &d
	}
	req := CreateRequest{Template: templateName(b.TemplateID), TTLSeconds: ttl, Metadata: b.Metadata, Env: b.EnvVars, Volumes: b.VolumeMounts}
	if b.AllowInternetAccess != nil || b.Network != nil {
		var e egressBody
		if b.Network != nil {
			e = *b.Network
		}
		n, err := e.policy(b.AllowInternetAccess)
		if err != nil {
			return req, err
		}
		req.Network = &n
	}
	if b.AutoPause != nil && *b.AutoPause {
		req.OnExpire = "pause"
	}
	return req, nil
}

// present reports whether a JSON field was given a value other than null.
func present(m json.RawMessage) bool { return len(m) > 0 && string(m) != "null" }

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (s *Server) create(w http.ResponseWriter, r *http.Request, keyID string) {
	var body createBody
	if err := decode(r, &body); err != nil {
		s.writeError(w, r, err)
		return
	}
	req, err := body.request()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.b.Create(r.Context(), keyID, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.toJSON(sb, allTokens))
}

// templateName maps an E2B template id to a PandaStack template: E2B's
// default "base" (and none) is PandaStack's base; the code interpreter
// SDK's default, "code-interpreter-v1", and "code-interpreter" are
// PandaStack's code-interpreter; any other name is looked up as it is.
func templateName(id string) string {
	switch id {
	case "":
		return "base"
	case "code-interpreter-v1", "code-interpreter":
		return "code-interpreter"
	}
	return id
}

// live returns the key's sandbox id unless it is gone (404 with E2B's body).
func (s *Server) live(r *http.Request, keyID string) (Sandbox, error) {
	id := r.PathValue("id")
	sb, err := s.b.Get(r.Context(), keyID, id)
	if err == nil && gone(sb.State) {
		err = errStatus(http.StatusNotFound, "sandbox %q not found", id)
	}
	if err != nil {
		if st, _ := s.status(err); st == http.StatusNotFound {
			err = errStatus(http.StatusNotFound, "sandbox %q not found", id)
		}
	}
	return sb, err
}

// connect answers POST /sandboxes/{id}/connect: 200 with the sandbox, or
// 201 if it was paused: E2B resumes a paused sandbox on connect.
func (s *Server) connect(w http.ResponseWriter, r *http.Request, keyID string) {
	s.wake(w, r, keyID, false)
}

// pause answers POST /sandboxes/{id}/pause: 204 once the sandbox is
// captured to disk; 409 (the SDK's false) if it is not running. The
// body's memory flag is ignored: PandaStack always keeps memory.
func (s *Server) pause(w http.ResponseWriter, r *http.Request, keyID string) {
	if err := decode(r, &struct{}{}); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.live(r, keyID)
	if err == nil {
		err = s.b.Pause(r.Context(), keyID, sb.ID)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// resume answers E2B's (deprecated) POST /sandboxes/{id}/resume: 201
// with the sandbox; 409 if it is not paused.
func (s *Server) resume(w http.ResponseWriter, r *http.Request, keyID string) {
	s.wake(w, r, keyID, true)
}

// wake answers connect and resume {timeout}: the sandbox, resumed (always
// if resume, else if it is paused; then 201, else 200), with its TTL set
// to the timeout if the request gives one.
func (s *Server) wake(w http.ResponseWriter, r *http.Request, keyID string, resume bool) {
	var req struct {
		Timeout *int `json:"timeout"`
	}
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.live(r, keyID)
	status := http.StatusOK
	if err == nil && (resume || e2bState(sb.State) == "paused") {
		sb, err = s.b.Resume(r.Context(), keyID, sb.ID)
		status = http.StatusCreated
	}
	if err == nil && req.Timeout != nil {
		if err = s.b.SetTTL(r.Context(), keyID, sb.ID, *req.Timeout); err == nil {
			sb, err = s.live(r, keyID)
		}
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, status, s.toJSON(sb, allTokens))
}

// fork answers POST /sandboxes/{id}/fork {count, timeout}: 201 with one
// {"sandbox"} (with its own envd access token) or {"error":{code,message}}
// per child; 404 (status and body) if the source is unknown.
func (s *Server) fork(w http.ResponseWriter, r *http.Request, keyID string) {
	var req struct {
		Count   *int `json:"count"`
		Timeout *int `json:"timeout"`
	}
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	sb, err := s.live(r, keyID)
	var children []ForkChild
	if err == nil {
		children, err = s.b.Fork(r.Context(), keyID, sb.ID, count, req.Timeout)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	type forkError struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	type forkChild struct {
		Sandbox *sandboxJSON `json:"sandbox,omitempty"`
		Error   *forkError   `json:"error,omitempty"`
	}
	out := make([]forkChild, len(children))
	for i, c := range children {
		if c.Err != nil {
			st, msg := s.status(c.Err)
			out[i].Error = &forkError{Code: st, Message: msg}
			continue
		}
		j := s.toJSON(c.Sandbox, allTokens)
		out[i].Sandbox = &j
	}
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, keyID string) {
	sb, err := s.live(r, keyID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.toJSON(sb, trafficToken))
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request, keyID string) {
	sb, err := s.live(r, keyID)
	if err == nil {
		err = s.b.Kill(r.Context(), keyID, sb.ID)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request, keyID string) {
	var req struct {
		Timeout *int `json:"timeout"`
	}
	if err := decode(r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if req.Timeout == nil {
		s.writeError(w, r, errStatus(http.StatusBadRequest, "timeout (seconds) is required"))
		return
	}
	sb, err := s.live(r, keyID)
	if err == nil {
		err = s.b.SetTTL(r.Context(), keyID, sb.ID, *req.Timeout)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// updateNetwork answers PUT /sandboxes/{id}/network: the body replaces
// the sandbox's whole egress policy (omitted lists are cleared, an omitted
// allow_internet_access is true), as E2B's does; 204.
func (s *Server) updateNetwork(w http.ResponseWriter, r *http.Request, keyID string) {
	var body egressBody
	if err := decode(r, &body); err != nil {
		s.writeError(w, r, err)
		return
	}
	n, err := body.policy(body.AllowInternetAccess)
	if err == nil {
		var sb Sandbox
		if sb, err = s.live(r, keyID); err == nil {
			err = s.b.SetNetwork(r.Context(), keyID, sb.ID, n)
		}
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// list answers GET /v2/sandboxes: state (running, paused; repeated or
// comma-separated), metadata (a URL-encoded query string of key=value
// pairs, as the SDK sends it) and template filter; one page, so no
// x-next-token (limit and nextToken are ignored).
func (s *Server) list(w http.ResponseWriter, r *http.Request, keyID string) {
	q := r.URL.Query()
	var f ListFilter
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			switch st {
			case "running":
				f.States = append(f.States, "starting", "running", "resuming")
			case "paused":
				f.States = append(f.States, "pausing", "paused")
			case "":
			default:
				s.writeError(w, r, errStatus(http.StatusBadRequest, "state %q must be running or paused", st))
				return
			}
		}
	}
	for _, v := range q["metadata"] {
		kv, err := url.ParseQuery(v)
		if err != nil {
			s.writeError(w, r, errStatus(http.StatusBadRequest, "metadata filter %q must be a query string of key=value pairs", v))
			return
		}
		for k, vs := range kv {
			if f.Metadata == nil {
				f.Metadata = map[string]string{}
			}
			f.Metadata[k] = vs[len(vs)-1]
		}
	}
	list, err := s.b.List(r.Context(), keyID, f)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := make([]sandboxJSON, 0, len(list))
	tmpl := q.Get("template")
	for _, sb := range list {
		if !gone(sb.State) && (tmpl == "" || sb.Template == tmpl || strings.HasPrefix(sb.Template, tmpl+":")) {
			out = append(out, s.toJSON(sb, noTokens))
		}
	}
	writeJSON(w, http.StatusOK, out)
}
