// Package e2b serves the wire protocol of E2B (e2b.dev) so that the
// official e2b SDKs run unmodified against PandaStack: the control plane
// (create, connect, list, get, set timeout, kill under /sandboxes and
// /v2/sandboxes, authenticated with X-API-KEY) and envd, the in-sandbox
// API (Connect RPC with the JSON codec for process.Process and
// filesystem.Filesystem, and GET/POST /files), on the same listener as the
// REST API. envd requests are told apart by their E2b-Sandbox-Id header
// (what the SDK sends when E2B_SANDBOX_URL points here) and authenticated
// with the sandbox's X-Access-Token, derived from a server secret.
// Requests for the code interpreter (@e2b/code-interpreter: the same
// header and E2b-Sandbox-Port 49999) are authenticated with the sandbox's
// X-Access-Token or E2B-Traffic-Access-Token and reverse-proxied to the
// guest's own code server on that port (code.go). On the proxy domain,
// the hosts 49983-ID.DOMAIN and 49999-ID.DOMAIN are envd's and the code
// interpreter's in the same way (ServePort).
//
// It owns only the translation: sandboxes, keys and guests are reached
// through a Backend (implemented by package api), whose errors it turns
// into E2B's shapes by the HTTP status the Backend classifies them as.
// The wire details it follows are in docs/e2b.md.
package e2b

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/pandastack/pandastack/internal/contract/host"
)

// EnvdVersion is the envd version reported to SDKs. The SDK gates
// features on it: >= 0.4.0 lets the server pick the default user, >= 0.5.7
// allows octet-stream uploads. Features of later versions that are not
// served (polling watchers, file metadata) answer unimplemented or are ignored.
const EnvdVersion = "0.6.13"

// ClientID is reported as every sandbox's clientID (E2B's node id).
const ClientID = "pandastack"

// Sandbox is a sandbox as E2B shows it.
type Sandbox struct {
	ID        string
	Template  string
	State     string // PandaStack's state: starting, running, paused, stopped, …
	Metadata  map[string]string
	MemoryMiB int
	VCPUs     int
	DiskMiB   int
	CreatedAt time.Time
	ExpiresAt time.Time // zero: does not expire (paused)
	Network   Network
	OnExpire  string // what the TTL's end does: "kill" or "pause"
	// Volumes are the volumes it mounts, by name.
	Volumes []VolumeMount
}

// Network is a sandbox's egress policy in PandaStack's terms (package
// network): the internet or not, and the addresses, CIDRs and domains it
// may (AllowOut, winning) or may not (DenyOut) reach beyond that.
type Network struct {
	Internet bool
	AllowOut []string
	DenyOut  []string
}

// CreateRequest is what a create asks of the Backend.
type CreateRequest struct {
	Template   string
	TTLSeconds *int // nil: the server's default
	Metadata   map[string]string
	Env        map[string]string
	Network    *Network // nil: the server's default policy
	OnExpire   string   // "": kill
	// Volumes are the key's volumes it mounts.
	Volumes []VolumeMount
}

// ForkChild is one child of a Fork: its sandbox, or why it failed
// (Err, classified by Status).
type ForkChild struct {
	Sandbox Sandbox
	Err     error
}

// ListFilter selects sandboxes in Backend.List. Empty States: every live
// state.
type ListFilter struct {
	States   []string
	Metadata map[string]string
}

// Backend is what the E2B layer needs from PandaStack. keyID methods act
// on the key's own sandboxes only: another key's sandbox is not found.
// Errors are classified by Status.
type Backend interface {
	// Authenticate returns the id of the API key whose secret this is; an
	// unknown or revoked key is an error that Status classifies as 401.
	Authenticate(ctx context.Context, secret string) (keyID string, err error)
	Create(ctx context.Context, keyID string, req CreateRequest) (Sandbox, error)
	Get(ctx context.Context, keyID, id string) (Sandbox, error)
	List(ctx context.Context, keyID string, f ListFilter) ([]Sandbox, error)
	Kill(ctx context.Context, keyID, id string) error
	SetTTL(ctx context.Context, keyID, id string, seconds int) error
	// SetNetwork replaces the key's sandbox's egress policy.
	SetNetwork(ctx context.Context, keyID, id string, n Network) error
	// Pause captures the key's running sandbox to disk and waits for it;
	// an error Status classifies as 409 if it is not running (paused).
	Pause(ctx context.Context, keyID, id string) error
	// Resume restores the key's paused sandbox, waits for it and returns
	// it running; an error classified 409 if it is not paused.
	Resume(ctx context.Context, keyID, id string) (Sandbox, error)
	// Fork forks the key's running sandbox count times and waits: one
	// ForkChild per child, in order. ttlSeconds nil: the source's TTL.
	Fork(ctx context.Context, keyID, id string, count int, ttlSeconds *int) ([]ForkChild, error)
	// Guest reaches the guest agent of sandbox id, whoever owns it (the
	// caller has proved access with the sandbox's access token); an
	// error if it is not running.
	Guest(ctx context.Context, id string) (host.Guest, error)
	// Running lists the ids of the running sandboxes of every key: a
	// signed file URL (uploadUrl, downloadUrl) names no sandbox, only its
	// signature, made with one sandbox's access token, tells which.
	Running(ctx context.Context) ([]string, error)
	// AcquireGuest takes one of the guest-request slots of sandbox id and
	// of the key that owns it (the limits of the REST API's exec and file
	// calls), held until release is called; an error that Status
	// classifies as 429 when none is free, as 404 if there is no such
	// sandbox. The caller has proved access with the sandbox's token.
	AcquireGuest(ctx context.Context, id string) (release func(), err error)
	// MaxUploadBytes bounds the body of one upload (POST /files): the
	// REST API's upload limit.
	MaxUploadBytes() int64
	// Proxy reverse-proxies r, whose body it has not read, to port of
	// sandbox id's guest, whoever owns the sandbox (the caller has proved
	// access with the sandbox's token), through the REST API's port
	// proxy: its guards (no credential of this server reaches the guest:
	// not X-Access-Token, E2B-Traffic-Access-Token, an API key in any
	// header), its limits per sandbox and key, and its connections, which
	// end when the sandbox stops. It returns an error, having written
	// nothing, if the sandbox is not there or not running, or the host
	// cannot reach guests; otherwise it has answered r (with an error of
	// its own if the guest could not be reached).
	Proxy(w http.ResponseWriter, r *http.Request, id string, port int) error
	// Status classifies err: an HTTP status and a message for users.
	Status(err error) (status int, message string)
}

// Server serves the E2B protocol. Create it with New; it starts no
// goroutines.
type Server struct {
	b      Backend
	secret []byte
	domain string // the sandboxes' domain; "": none
	log    *slog.Logger

	control *http.ServeMux
	envd    *http.ServeMux
	// errs writes the errors of Connect RPCs refused before their handler
	// (serveEnvd) as connect's own handlers would.
	errs *connect.ErrorWriter

	// search lets one search for the signer of an anonymous signed file
	// URL run at a time (signer); it guards tokens, the access tokens of
	// the running sandboxes the last search tried.
	search chan struct{}
	tokens map[string]string
	// work counts the access tokens derived and the signatures checked,
	// for the tests of what an unauthenticated request may cost.
	work struct{ tokens, signatures atomic.Int64 }

	mu    sync.Mutex
	users map[string]defaultUser // sandbox id → its default user
	procs map[procKey]procMeta   // processes started by Start, until seen to exit
}

// New returns a server. secret derives the sandboxes' envd access tokens
// (at least 16 bytes; keep it across restarts for tokens to stay valid).
// domain, if not empty, is reported as every sandbox's domain: the SDK's
// getHost(port) is then PORT-ID.domain, which the server must serve (its
// proxy domain).
func New(b Backend, secret []byte, domain string, log *slog.Logger) (*Server, error) {
	if len(secret) < 16 {
		return nil, errors.New("e2b: secret of fewer than 16 bytes")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{b: b, secret: secret, domain: domain, log: log, users: map[string]defaultUser{}, procs: map[procKey]procMeta{},
		errs: connect.NewErrorWriter(), search: make(chan struct{}, 1)}
	s.control = s.controlRoutes()
	s.envd = s.envdRoutes()
	return s, nil
}

// Intercept is middleware that serves E2B requests and passes the rest to
// next: a request with an E2b-Sandbox-Id header is the code
// interpreter's if its E2b-Sandbox-Port is CodePort, else envd's, and so
// is a signed file URL (GET or POST /files?…&signature=…); one whose
// method and path are a route of E2B's control plane is the control
// plane's. Neither set of paths overlaps PandaStack's /v1 API. All
// authenticate a request before they read a byte of its body
// (serveEnvd, serveCode, auth).
func (s *Server) Intercept(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("E2b-Sandbox-Id")
		if id != "" && strings.TrimSpace(r.Header.Get("E2b-Sandbox-Port")) == strconv.Itoa(CodePort) {
			s.serveCode(w, r, id)
			return
		}
		if id != "" || signedFileURL(r) {
			s.serveEnvd(w, r, id)
			return
		}
		if _, pattern := s.control.Handler(r); pattern != "" {
			s.control.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// AccessToken is sandbox id's envd access token: an HMAC of its id, so
// that it needs no storage and dies with the secret.
func (s *Server) AccessToken(id string) string {
	s.work.tokens.Add(1)
	m := hmac.New(sha256.New, s.secret)
	m.Write([]byte("e2b envd access token\x00" + id))
	return hex.EncodeToString(m.Sum(nil))
}

func (s *Server) validToken(id, token string) bool {
	return token != "" && hmac.Equal([]byte(token), []byte(s.AccessToken(id)))
}
