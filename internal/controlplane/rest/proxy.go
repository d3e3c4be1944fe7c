package rest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/e2b"
)

// The port proxy: HTTP requests (WebSocket upgrades and other streams
// included) reverse-proxied to a TCP port of a running sandbox's guest,
// over connections its Host opens (host.GuestDialer). Four ways in, one way
// through (proxyTo):
//
//   - /v1/sandboxes/{id}/ports/{port}/{path...}: an API key, the sandbox
//     must be the key's; the Authorization header is not passed on.
//   - /p/{token}/{path...}: a signed URL (porturl.go), no key.
//   - Host {port}-{id}.{ProxyDomain}, any path: an API key, or a signed
//     token given once as ?panda_token= and then kept in a cookie of that
//     host (proxyDomain); but for E2B's ports (envd's 49983, the code
//     interpreter's 49999), which are the E2B layer's.
//   - E2B's code interpreter (package e2b, e2bBackend.Proxy): the
//     sandbox's E2B access or traffic token, by E2b-Sandbox-Id and
//     E2b-Sandbox-Port headers or by its host on the proxy domain; the
//     Authorization header is not passed on.
//
// No credential of this server is passed to the guest, whichever way the
// request came in (guardRequest): not the API key's Authorization header,
// nor any other header value that is an API key (X-API-Key, E2B's), nor a
// "bearer.<key>" WebSocket subprotocol, nor the sandbox's E2B access token
// (X-Access-Token) or traffic token (E2B-Traffic-Access-Token), nor a
// signed token (the panda_token cookie and query parameter). Anything else is the guest's: an Authorization header that
// came with a signed URL is the guest application's own, unless it holds
// an API key.
//
// Guest answers are served to browsers, so the proxy adds what keeps a
// guest's page from reaching anything but its own port (guardResponse).
// Under the API's own address (the two path routes) the page would share
// the origin of the web console, which keeps the signed-in key in
// sessionStorage: each answer gets Content-Security-Policy "sandbox"
// without allow-same-origin, so the page runs in an opaque origin of its
// own (no access to the console's storage, cookies or windows, no service
// worker on the origin), plus nosniff and no-referrer (the token in the
// path must not leak to third parties); Service-Worker-Allowed and
// Clear-Site-Data are dropped, and a request for a service worker script
// is refused before it reaches the guest. On the proxy domain every port
// is an origin of its own already: the sandbox CSP keeps allow-same-origin
// there, so browser applications keep their cookies, storage and service
// workers.
//
// Requests in flight through the proxy, WebSockets for their whole life,
// count against their own limits per sandbox and per key
// (Config.MaxProxyRequestsPerSandbox, ...PerKey), not against the guest
// agent's (exec, files): a busy web application must not starve the
// sandbox's exec and file requests, nor they it.

// Proxy defaults (Config).
const (
	DefaultMaxProxyRequestsPerSandbox = 256
	DefaultMaxProxyRequestsPerKey     = 1024
	DefaultProxyHeaderTimeout         = 2 * time.Minute
	// proxyDialTimeout bounds opening a connection to a guest.
	proxyDialTimeout = 10 * time.Second
	// Idle keep-alive connections to guests: per sandbox and port, and in
	// all.
	proxyIdlePerPort = 8
	proxyIdleTotal   = 256
	proxyIdleTimeout = 30 * time.Second
	// tokenParam and tokenCookie carry a signed token on the proxy domain.
	tokenParam  = "panda_token"
	tokenCookie = "panda_token"
)

// proxyTarget is where a proxied request goes and how it came in.
type proxyTarget struct {
	sb   catalog.Sandbox
	port int
	// prefix is the public path before the guest's path ("" on the proxy
	// domain): X-Forwarded-Prefix, and prepended to redirects the guest
	// answers with an absolute path.
	prefix string
	path   string // the guest's path, escaped, starting with "/"
	query  string // raw, without our token
	// keepAuth: the Authorization header is not the credential that let
	// the request in; pass it on (unless it holds an API key).
	keepAuth bool
	// domain: the request came in on the proxy domain ({port}-{id}.DOMAIN,
	// an origin of its own), not under the API's address.
	domain bool
	// e2b: the request came through the E2B layer (the code interpreter),
	// let in by the sandbox's E2B token: X-Access-Token and
	// E2B-Traffic-Access-Token are dropped whatever they hold.
	e2b bool
}

type proxyCtxKey struct{}

// guestProxy is the reverse proxy and its connections to guests.
type guestProxy struct {
	s      *Server
	dialer host.GuestDialer // nil: no sandbox networking
	tr     *http.Transport
	rp     *httputil.ReverseProxy

	mu     sync.Mutex
	conns  map[string]map[*proxyConn]struct{} // by sandbox id
	closed bool
}

func newGuestProxy(s *Server) *guestProxy {
	p := &guestProxy{s: s, conns: map[string]map[*proxyConn]struct{}{}}
	p.dialer, _ = s.host.(host.GuestDialer)
	// One transport: its pool is keyed by the URL's host, which is
	// "{id}:{port}", so that idle connections are kept per sandbox and
	// port. HTTP/1.1 only (guests' servers are plain HTTP).
	p.tr = &http.Transport{
		DialContext:           p.dial,
		MaxIdleConns:          proxyIdleTotal,
		MaxIdleConnsPerHost:   proxyIdlePerPort,
		IdleConnTimeout:       proxyIdleTimeout,
		ResponseHeaderTimeout: s.cfg.ProxyHeaderTimeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      p.tr,
		FlushInterval:  -1, // every write at once: SSE, streamed bodies
		ErrorHandler:   p.fail,
		ModifyResponse: p.modifyResponse,
		ErrorLog:       log.New(debugWriter{s.log}, "port proxy: ", 0),
	}
	return p
}

// debugWriter logs the reverse proxy's own complaints (a client that went
// away mid-body) at debug level.
type debugWriter struct{ log *slog.Logger }

func (d debugWriter) Write(p []byte) (int, error) {
	d.log.Debug(strings.TrimSpace(string(p)))
	return len(p), nil
}

// dial is the transport's DialContext: addr is "{id}:{port}".
func (p *guestProxy) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	id, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, err := strconv.Atoi(ps)
	if err != nil {
		return nil, err
	}
	if p.dialer == nil {
		return nil, fmt.Errorf("dial sandbox %s: the host has no sandbox networking: %w", id, errors.ErrUnsupported)
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("%w: the server is shutting down", host.ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(ctx, proxyDialTimeout)
	defer cancel()
	c, err := p.dialer.DialGuest(ctx, id, port)
	if err != nil {
		return nil, err
	}
	pc := &proxyConn{Conn: c, p: p, id: id}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return nil, fmt.Errorf("%w: the server is shutting down", host.ErrUnavailable)
	}
	if p.conns[id] == nil {
		p.conns[id] = map[*proxyConn]struct{}{}
	}
	p.conns[id][pc] = struct{}{}
	return pc, nil
}

// proxyConn is a connection to a guest, known to its proxy until closed.
type proxyConn struct {
	net.Conn
	p    *guestProxy
	id   string
	once sync.Once
}

func (c *proxyConn) Close() error {
	c.once.Do(func() {
		c.p.mu.Lock()
		delete(c.p.conns[c.id], c)
		if len(c.p.conns[c.id]) == 0 {
			delete(c.p.conns, c.id)
		}
		c.p.mu.Unlock()
	})
	return c.Conn.Close()
}

// closeSandbox closes every connection to sandbox id's guest: it stopped or
// paused, and what went through them (WebSockets, streams) ends now rather
// than when the peer's TCP gives up.
func (p *guestProxy) closeSandbox(id string) {
	p.mu.Lock()
	var cs []*proxyConn
	for c := range p.conns[id] {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
}

// close closes every connection and refuses new ones. Idempotent.
func (p *guestProxy) close() {
	p.mu.Lock()
	p.closed = true
	var cs []*proxyConn
	for _, m := range p.conns {
		for c := range m {
			cs = append(cs, c)
		}
	}
	p.mu.Unlock()
	for _, c := range cs {
		c.Close()
	}
	p.tr.CloseIdleConnections()
}

// open is the number of connections to guests, for the metrics.
func (p *guestProxy) open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, m := range p.conns {
		n += len(m)
	}
	return n
}

// rewrite makes the outbound request: the guest's path and query, the
// public Host, X-Forwarded-* and without our credentials.
func (p *guestProxy) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(proxyCtxKey{}).(*proxyTarget)
	u := &url.URL{Scheme: "http", Host: net.JoinHostPort(t.sb.ID, strconv.Itoa(t.port))}
	u.Path, _ = url.PathUnescape(t.path) // checked by proxyTo
	u.RawPath = t.path
	u.RawQuery, _ = withoutParam(t.query, tokenParam)
	pr.Out.URL = u
	pr.Out.Host = pr.In.Host
	p.guardRequest(pr.Out.Header, t)
	if xff, ok := pr.In.Header["X-Forwarded-For"]; ok {
		pr.Out.Header["X-Forwarded-For"] = xff // SetXForwarded appends to it
	}
	pr.SetXForwarded()
	pr.Out.Header.Set("X-Forwarded-Host", requestHost(pr.In))
	pr.Out.Header.Set("X-Forwarded-Proto", requestScheme(pr.In))
	if t.prefix != "" {
		pr.Out.Header.Set("X-Forwarded-Prefix", t.prefix)
	}
}

// guardRequest removes from h, a request on its way to the guest, every
// credential of this server (see the top of this file).
func (p *guestProxy) guardRequest(h http.Header, t *proxyTarget) {
	if !t.keepAuth {
		h.Del("Authorization")
	} else {
		dropValues(h, "Authorization", holdsAPIKey)
	}
	dropValues(h, "X-Api-Key", holdsAPIKey)
	for _, e := range []struct {
		header string
		token  func(string) string
	}{{"X-Access-Token", p.s.e2b.AccessToken}, {"E2b-Traffic-Access-Token", p.s.e2b.TrafficAccessToken}} {
		switch {
		case t.e2b:
			h.Del(e.header)
		case len(h.Values(e.header)) > 0: // an HMAC: only when there is one
			tok := e.token(t.sb.ID)
			dropValues(h, e.header, func(v string) bool { return strings.TrimSpace(v) == tok })
		}
	}
	dropCookie(h, tokenCookie)
	dropBearerProtocols(h)
}

// holdsAPIKey reports whether a header value holds an API key of this
// server: any of its words (an Authorization header's scheme and
// credentials) starts with the prefix every key has.
func holdsAPIKey(v string) bool {
	for _, f := range strings.Fields(v) {
		if strings.HasPrefix(f, apiKeyPrefix) {
			return true
		}
	}
	return false
}

// dropValues removes the values of header name that drop reports.
func dropValues(h http.Header, name string, drop func(string) bool) {
	vals := h.Values(name)
	if len(vals) == 0 {
		return
	}
	var keep []string
	for _, v := range vals {
		if !drop(v) {
			keep = append(keep, v)
		}
	}
	h.Del(name)
	for _, v := range keep {
		h.Add(name, v)
	}
}

// dropBearerProtocols removes from a WebSocket handshake's
// Sec-WebSocket-Protocol every subprotocol that carries a key (bearer.…,
// in any case, or any that holds the key prefix), keeping the others in
// their order: the guest then chooses among the client's own, and the
// client accepts its choice (or none).
func dropBearerProtocols(h http.Header) {
	const name = "Sec-WebSocket-Protocol"
	vals := h.Values(name)
	if len(vals) == 0 {
		return
	}
	var keep []string
	for _, v := range vals {
		for p := range strings.SplitSeq(v, ",") {
			p = strings.TrimSpace(p)
			if p == "" || strings.HasPrefix(strings.ToLower(p), wsBearerPrefix) || strings.Contains(p, apiKeyPrefix) {
				continue
			}
			keep = append(keep, p)
		}
	}
	h.Del(name)
	if len(keep) > 0 {
		h.Set(name, strings.Join(keep, ", "))
	}
}

// The Content-Security-Policy the proxy adds to every guest answer (a
// further header: browsers enforce every policy they get, so a guest's own
// cannot loosen it). Under the API's address the sandbox has no
// allow-same-origin: the page's origin is opaque, apart from the console's.
const (
	sandboxFlags = "allow-scripts allow-forms allow-popups allow-popups-to-escape-sandbox allow-modals allow-downloads"
	pathCSP      = "sandbox " + sandboxFlags
	domainCSP    = "sandbox allow-same-origin " + sandboxFlags
)

// modifyResponse keeps redirects to an absolute path under the prefix the
// guest is served at, and guards the answer.
func (p *guestProxy) modifyResponse(res *http.Response) error {
	t := res.Request.Context().Value(proxyCtxKey{}).(*proxyTarget)
	if loc := res.Header.Get("Location"); t.prefix != "" && strings.HasPrefix(loc, "/") && !strings.HasPrefix(loc, "//") {
		res.Header.Set("Location", t.prefix+loc)
	}
	guardResponse(res.Header, t.domain)
	scopeCookies(res.Header, t.prefix)
	return nil
}

// scopeCookies keeps the cookies a guest sets to itself: without a Domain
// attribute (a guest could otherwise set cookies for the API's parent
// domain, or for every sandbox of the proxy domain, tossing cookies at
// other tenants' ports), and, on a path route (prefix, the public path the
// guest is served under), with a Path under that prefix, so that they are
// not sent with the console's or another sandbox's requests. A line that
// does not parse as a cookie is dropped.
func scopeCookies(h http.Header, prefix string) {
	lines := h.Values("Set-Cookie")
	if len(lines) == 0 {
		return
	}
	h.Del("Set-Cookie")
	for _, line := range lines {
		c, err := http.ParseSetCookie(line)
		if err != nil {
			continue
		}
		c.Domain = ""
		if prefix != "" && c.Path != "" {
			c.Path = prefix + "/" + strings.TrimLeft(c.Path, "/")
		}
		if v := c.String(); v != "" {
			h.Add("Set-Cookie", v)
		}
	}
}

// guardResponse sets the headers of a guest's answer that keep its page to
// itself (see the top of this file). The guest's own headers of the same
// names are replaced; its Content-Security-Policy stays, next to ours.
func guardResponse(h http.Header, domain bool) {
	if domain {
		h.Add("Content-Security-Policy", domainCSP)
		return
	}
	// A script at a path under the API's origin could widen a service
	// worker's scope to the whole origin; Clear-Site-Data would sign the
	// console out.
	h.Del("Service-Worker-Allowed")
	h.Del("Clear-Site-Data")
	h.Add("Content-Security-Policy", pathCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
}

// fail answers a request the guest could not be reached for (before any of
// the guest's answer was sent).
func (p *guestProxy) fail(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client went away
	}
	t := r.Context().Value(proxyCtxKey{}).(*proxyTarget)
	ae := classify(p.classify(t, err))
	p.s.log.Debug("port proxy failed", "sandbox_id", t.sb.ID, "port", t.port, "status", ae.Status, "err", err)
	writeJSON(w, ae.Status, errorBody{Error: errorDetail{Code: ae.Code, Message: ae.Message}})
}

// errNoNetworking: the hosts cannot dial guests.
var errNoNetworking = errorf(controlplane.NotImplemented,
	"this server cannot reach ports in sandboxes: its host has no sandbox networking")

// errOldAgent: the host has no network to its guests and reaches their
// ports through their guest agents, but this one is too old for it.
var errOldAgent = errorf(controlplane.NotImplemented,
	"this server reaches ports in sandboxes through their guest agent (its host has no sandbox networking), and this sandbox's is too old for it: recreate the sandbox from a current template")

// classify turns a failure to reach the guest into what users see.
func (p *guestProxy) classify(t *proxyTarget, err error) *controlplane.Error {
	var ne net.Error
	switch {
	case errors.Is(err, host.ErrUnavailable), errors.Is(err, host.ErrNotFound), errors.Is(err, host.ErrConflict),
		errors.Is(err, host.ErrInvalid), errors.Is(err, host.ErrNotReady):
		return controlplane.Classify(err)
	case errors.Is(err, errors.ErrUnsupported):
		return errOldAgent
	case guestproto.CodeOf(err) == guestproto.CodeBusy:
		return errorf(controlplane.TooManyRequests, "too many connections to the ports of sandbox %s at once; retry when some have closed", t.sb.ID)
	case errors.Is(err, syscall.ECONNREFUSED) && t.e2b && t.port == e2b.CodePort:
		return errorf(controlplane.BadGateway, "sandbox %s has no code interpreter: create it from the code-interpreter template (E2B's code-interpreter-v1)", t.sb.ID)
	case errors.Is(err, syscall.ECONNREFUSED):
		return errorf(controlplane.BadGateway, "nothing listens on port %d in sandbox %s (connection refused)", t.port, t.sb.ID)
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return errorf(controlplane.Timeout, "port %d of sandbox %s did not answer in time", t.port, t.sb.ID)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET):
		return errorf(controlplane.BadGateway, "the server on port %d of sandbox %s closed the connection without answering", t.port, t.sb.ID)
	}
	msg := err.Error()
	if len(msg) > 256 {
		msg = msg[:256] + "…"
	}
	return errorf(controlplane.BadGateway, "port %d of sandbox %s: %s", t.port, t.sb.ID, strings.ToValidUTF8(msg, "\uFFFD"))
}

// proxyTo proxies r to t, whose sandbox the caller may reach.
func (s *Server) proxyTo(w http.ResponseWriter, r *http.Request, t *proxyTarget) {
	if t.sb.State != catalog.StateRunning {
		s.writeError(w, r, conflict("sandbox %s is %s, not running", t.sb.ID, t.sb.State))
		return
	}
	if _, err := url.PathUnescape(t.path); err != nil {
		s.writeError(w, r, badRequest("the path %q is not validly escaped", t.path))
		return
	}
	if !t.domain && r.Header.Get("Service-Worker") != "" {
		// A browser fetching a service worker's script: under the API's
		// address it would be registered for the console's origin.
		s.writeError(w, r, errorf(controlplane.Forbidden,
			"service workers cannot be served from a sandbox port under the API's address (/p/… or /v1/sandboxes/…/ports/…); serve the application on the proxy domain ({port}-{id}.DOMAIN), where each port is an origin of its own"))
		return
	}
	release, err := s.proxies.acquire(t.sb.ID, t.sb.KeyID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer release()
	if s.proxy.dialer == nil {
		s.writeError(w, r, errNoNetworking)
		return
	}
	// Read the request body while the answer streams (a full-duplex
	// exchange over HTTP/1.1).
	http.NewResponseController(w).EnableFullDuplex()
	s.proxy.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), proxyCtxKey{}, t)))
}

// parsePort reads a port from a path segment.
func parsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 || s != strconv.Itoa(p) {
		return 0, invalid("port %q must be a number from 1 to 65535", s)
	}
	return p, nil
}

// redirectSlash answers a path that names a port (or a signed URL) but no
// path in it with a redirect to the same path with a slash: relative links
// in what the guest serves then resolve under it. The Location is relative
// (its last segment), so that it works behind any path prefix.
func redirectSlash(w http.ResponseWriter, r *http.Request) {
	p := r.URL.EscapedPath()
	loc := p[strings.LastIndexByte(p, '/')+1:] + "/"
	if r.URL.RawQuery != "" {
		loc += "?" + r.URL.RawQuery
	}
	w.Header().Set("Location", loc)
	w.WriteHeader(http.StatusPermanentRedirect)
}

// portProxy serves /v1/sandboxes/{id}/ports/{port}[/{path...}] (API key).
func (s *Server) portProxy(w http.ResponseWriter, r *http.Request) {
	portParam := chi.URLParam(r, "port")
	port, err := parsePort(portParam)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.owned(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	prefix := "/v1/sandboxes/" + chi.URLParam(r, "id") + "/ports/" + portParam
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), prefix)
	if !ok {
		s.writeError(w, r, notFound("no such endpoint: %s %s", r.Method, r.URL.Path))
		return
	}
	if rest == "" {
		redirectSlash(w, r)
		return
	}
	s.proxyTo(w, r, &proxyTarget{sb: sb, port: port, prefix: s.publicPath + prefix, path: rest, query: r.URL.RawQuery})
}

// signedProxy serves /p/{token}[/{path...}] (a signed URL, no key).
func (s *Server) signedProxy(w http.ResponseWriter, r *http.Request) {
	tokParam := chi.URLParam(r, "token")
	tok, err := parseToken(s.urlSecret, tokParam, time.Now())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	sb, err := s.cat.GetSandbox(r.Context(), tok.SandboxID)
	if errors.Is(err, catalog.ErrNotFound) {
		err = notFound("sandbox %s not found", tok.SandboxID)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	prefix := "/p/" + tokParam
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), prefix)
	if !ok {
		s.writeError(w, r, notFound("no such endpoint: %s %s", r.Method, r.URL.Path))
		return
	}
	if rest == "" {
		redirectSlash(w, r)
		return
	}
	s.proxyTo(w, r, &proxyTarget{sb: sb, port: tok.Port, prefix: s.publicPath + prefix, path: rest, query: r.URL.RawQuery, keepAuth: true})
}

// portURLRequest is the body of POST .../ports/{port}/url.
type portURLRequest struct {
	TTLSeconds *int `json:"ttl_seconds"`
}

// DefaultPortURLTTL is how long a signed URL lasts when the request says
// nothing (at most Config.MaxTTL).
const DefaultPortURLTTL = time.Hour

// portURL signs a URL to a port of the caller's sandbox.
func (s *Server) portURL(w http.ResponseWriter, r *http.Request) {
	var req portURLRequest
	if err := decodeJSON(r, &req, true); err != nil {
		s.writeError(w, r, err)
		return
	}
	port, err := parsePort(chi.URLParam(r, "port"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ttl := min(DefaultPortURLTTL, s.cp.Config().MaxTTL)
	if req.TTLSeconds != nil {
		d := time.Duration(*req.TTLSeconds) * time.Second
		if *req.TTLSeconds < 1 || d > s.cp.Config().MaxTTL {
			s.writeError(w, r, invalid("ttl_seconds must be between 1 and %d", int(s.cp.Config().MaxTTL.Seconds())))
			return
		}
		ttl = d
	}
	sb, err := s.owned(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if sb.State == catalog.StateStopped || sb.State == catalog.StateStopping {
		s.writeError(w, r, conflict("sandbox %s is %s", sb.ID, sb.State))
		return
	}
	// Whole seconds, rounded up: the URL lasts at least ttl.
	exp := time.Now().Add(ttl)
	if exp.Nanosecond() != 0 {
		exp = exp.Truncate(time.Second).Add(time.Second)
	}
	tok := portToken{SandboxID: sb.ID, Port: port, Expires: exp.UTC()}.sign(s.urlSecret)
	writeJSON(w, http.StatusOK, map[string]any{"url": s.signedURL(r, tok, sb.ID, port), "expires_at": exp.UTC()})
}

// signedURL is the URL of a token: on the proxy domain if there is one
// ({scheme}://{port}-{id}.{domain}/?panda_token=…), else under the
// server's base URL ({base}/p/{token}/).
func (s *Server) signedURL(r *http.Request, tok, id string, port int) string {
	base := s.baseURL(r)
	if s.cfg.ProxyDomain != "" {
		host := portHost(port, id, s.cfg.ProxyDomain)
		if p := base.Port(); p != "" {
			host = net.JoinHostPort(host, p)
		}
		u := url.URL{Scheme: base.Scheme, Host: host, Path: "/", RawQuery: tokenParam + "=" + tok}
		return u.String()
	}
	base.Path = strings.TrimRight(base.Path, "/") + "/p/" + tok + "/"
	base.RawPath = ""
	return base.String()
}

// baseURL is the server's public base URL: Config.PublicURL, else the
// scheme and host the request came to (X-Forwarded-Proto and
// X-Forwarded-Host of a proxy in front first).
func (s *Server) baseURL(r *http.Request) *url.URL {
	if s.publicURL != nil {
		u := *s.publicURL
		return &u
	}
	return &url.URL{Scheme: requestScheme(r), Host: requestHost(r)}
}

// requestScheme is the scheme the client used: https if the request came
// over TLS or a proxy in front says so (X-Forwarded-Proto).
func requestScheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	switch v := strings.ToLower(firstValue(r.Header.Get("X-Forwarded-Proto"))); v {
	case "http", "https":
		return v
	}
	return "http"
}

// requestHost is the host the client asked for: X-Forwarded-Host of a
// proxy in front, else Host.
func requestHost(r *http.Request) string {
	if v := firstValue(r.Header.Get("X-Forwarded-Host")); v != "" && validHostHeader(v) {
		return v
	}
	return r.Host
}

func firstValue(v string) string {
	v, _, _ = strings.Cut(v, ",")
	return strings.TrimSpace(v)
}

// validHostHeader reports whether v can be a Host: a name or address and
// a port, nothing that would change a URL built with it.
func validHostHeader(v string) bool {
	if v == "" || len(v) > 255 {
		return false
	}
	for _, c := range v {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-.:[]_", c)) {
			return false
		}
	}
	return true
}

// dropCookie removes the cookie name from h's Cookie headers.
func dropCookie(h http.Header, name string) {
	lines := h.Values("Cookie")
	if len(lines) == 0 {
		return
	}
	var keep []string
	for _, line := range lines {
		for _, part := range strings.Split(line, ";") {
			part = strings.TrimSpace(part)
			if part == "" || strings.HasPrefix(part, name+"=") {
				continue
			}
			keep = append(keep, part)
		}
	}
	h.Del("Cookie")
	if len(keep) > 0 {
		h.Set("Cookie", strings.Join(keep, "; "))
	}
}
