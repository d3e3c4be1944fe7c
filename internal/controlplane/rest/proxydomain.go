package rest

import (
	"errors"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// The proxy domain (Config.ProxyDomain): a request whose Host is
// {port}-{id}.{domain} is proxied to that port of that sandbox, whatever
// its path, so that each sandbox port is an origin of its own and browser
// applications work unchanged (absolute links, cookies, service workers).
// It is authenticated by, in this order:
//
//  1. ?panda_token={token} (a signed URL): checked, kept as a cookie of
//     that host (HttpOnly, SameSite=Lax, Secure over https, until the
//     token expires), then a GET or HEAD is redirected to the same URL
//     without it (the token leaves the address bar); other methods are
//     proxied without it.
//  2. a panda_token cookie valid for this host (any of them: a guest on a
//     sibling host can set cookies for the whole domain, not remove ours),
//     on a request the browser did not make for another site's page
//     (cookieSite): sibling hosts are the same site, so SameSite=Lax alone
//     would let tenant A's page use tenant B's cookie.
//  3. Authorization: Bearer {API key}, whose sandbox it must be.
//
// E2B's ports are not proxied that way: 49983-{id}.{domain} is envd and
// 49999-{id}.{domain} the code interpreter, where E2B's SDKs send their
// requests when E2B_SANDBOX_URL is not set (the sandboxes' domain that
// create answers is the proxy domain). The E2B layer serves both
// (e2b.Server.ServePort), authenticated by the sandbox's E2B tokens
// alone: envd is PandaStack's own (nothing listens on 49983 in a guest)
// and the code interpreter's server takes the same credentials as
// through E2B_SANDBOX_URL.

// validProxyDomain reports whether d can be a proxy domain: a lowercase
// DNS name of at least two labels, or localhost (*.localhost resolves to
// loopback: a test box).
func validProxyDomain(d string) bool {
	if d == "localhost" {
		return true
	}
	if len(d) > 200 || !strings.Contains(d, ".") {
		return false
	}
	for _, label := range strings.Split(d, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// proxyHost parses a Host of the proxy domain: {port}-{id}.{domain}, with
// or without a port. ok is false for any other host (the API's own).
func (s *Server) proxyHost(host string) (id string, port int, ok bool) {
	if s.cfg.ProxyDomain == "" {
		return "", 0, false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	label, ok := strings.CutSuffix(host, "."+s.cfg.ProxyDomain)
	if !ok || strings.Contains(label, ".") {
		return "", 0, false
	}
	portText, id, ok := strings.Cut(label, "-")
	if !ok {
		return "", 0, false
	}
	port, err := parsePort(portText)
	if err != nil {
		return "", 0, false
	}
	return id, port, true
}

// proxyDomain is middleware that serves requests to the proxy domain and
// passes every other one on.
func (s *Server) proxyDomain(next http.Handler) http.Handler {
	if s.cfg.ProxyDomain == "" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, port, ok := s.proxyHost(r.Host)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		if s.e2b.ServePort(w, r, id, port) {
			return
		}
		s.domainProxy(w, r, id, port)
	})
}

func (s *Server) domainProxy(w http.ResponseWriter, r *http.Request, id string, port int) {
	fail := func(err error) {
		s.writeError(w, r, err)
	}
	if !host.ValidID(id) {
		fail(notFound("sandbox %q not found", id))
		return
	}
	now := time.Now()
	query, given := withoutParam(r.URL.RawQuery, tokenParam)
	keepAuth := false
	var crossSite error // why a valid cookie did not count
	switch {
	case len(given) > 0:
		tok, err := s.tokenFor(given[0], id, port, now)
		if err != nil {
			fail(err)
			return
		}
		http.SetCookie(w, &http.Cookie{
			Name: tokenCookie, Value: given[0], Path: "/", Expires: tok.Expires,
			MaxAge:   max(1, int(tok.Expires.Sub(now).Seconds())),
			HttpOnly: true, Secure: requestScheme(r) == "https", SameSite: http.SameSiteLaxMode,
		})
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			loc := r.URL.EscapedPath()
			if query != "" {
				loc += "?" + query
			}
			w.Header().Set("Location", loc)
			w.WriteHeader(http.StatusFound)
			return
		}
		keepAuth = true
	case s.validCookie(r, id, port, now):
		crossSite = s.cookieSite(r, id)
		keepAuth = crossSite == nil
	}
	var sb catalog.Sandbox
	var err error
	if keepAuth {
		sb, err = s.cat.GetSandbox(r.Context(), id)
		if errors.Is(err, catalog.ErrNotFound) {
			err = notFound("sandbox %s not found", id)
		}
	} else {
		var c *caller
		if c, err = s.keyOf(r, "missing credentials: open a signed URL of this port (POST /v1/sandboxes/{id}/ports/{port}/url) or send Authorization: Bearer <key>"); err != nil {
			// Say why the cookie did not do, unless a key was tried.
			_, cerr := r.Cookie(tokenCookie)
			switch auth := r.Header.Get("Authorization"); {
			case crossSite != nil && !strings.HasPrefix(auth, "Bearer "):
				err = crossSite
			case cerr == nil && auth == "":
				err = s.cookieError(r, id, port, now)
			}
			fail(err)
			return
		}
		sb, err = s.cp.Sandbox(r.Context(), c.Key.ID, id)
	}
	if err != nil {
		fail(err)
		return
	}
	s.proxyTo(w, r, &proxyTarget{sb: sb, port: port, path: r.URL.EscapedPath(), query: query, keepAuth: keepAuth, domain: true})
}

// cookieSite returns nil if r, which carries a valid panda_token cookie of
// a port of sandbox id, may use it, and a 403 error if a browser sent it
// for another site's page. The proxy domain's hosts are one site (a
// sibling host is same-site, and gets SameSite=Lax cookies), so the
// browser's own word counts (Sec-Fetch-Site, which pages cannot set):
//
//   - same-origin, or none (the user typed the URL, a bookmark): allowed;
//   - same-site or cross-site: only a top-level navigation (GET or HEAD,
//     Sec-Fetch-Mode navigate, Sec-Fetch-Dest document: a link followed),
//     or a request from a page of another port of the same sandbox (its
//     Origin, else its Referer), which is the sandbox's own code anyway;
//     never a WebSocket, a fetch, a form POST, a frame of another
//     sandbox's page;
//   - no Sec-Fetch-Site (an older browser, curl): allowed without an
//     Origin, or with one of the same sandbox.
func (s *Server) cookieSite(r *http.Request, id string) error {
	sameSandbox := func(from string) bool {
		u, err := url.Parse(from)
		if err != nil || u.Host == "" {
			return false
		}
		oid, _, ok := s.proxyHost(u.Host)
		return ok && oid == id
	}
	origin := r.Header.Get("Origin")
	var why string
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "same-origin", "none":
		return nil
	case "":
		if origin == "" || sameSandbox(origin) {
			return nil
		}
		why = "its Origin is another host"
	default:
		ws := strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
		if !ws && (r.Method == http.MethodGet || r.Method == http.MethodHead) &&
			r.Header.Get("Sec-Fetch-Mode") == "navigate" && r.Header.Get("Sec-Fetch-Dest") == "document" {
			return nil
		}
		from := origin
		if from == "" {
			from = r.Header.Get("Referer")
		}
		if from != "" && sameSandbox(from) {
			return nil
		}
		if len(site) > 32 {
			site = site[:32] + "…"
		}
		why = "Sec-Fetch-Site: " + strings.ToValidUTF8(site, "\uFFFD")
	}
	return errorf(controlplane.Forbidden,
		"refused: a page of another site made this request (%s), which would have used this host's panda_token cookie; "+
			"only this port's own pages, a link followed to it, or a request with an API key (Authorization: Bearer) may use it", why)
}

// tokenFor checks that tok is valid and is for port of sandbox id.
func (s *Server) tokenFor(tok, id string, port int, now time.Time) (portToken, error) {
	t, err := parseToken(s.urlSecret, tok, now)
	if err != nil {
		return t, err
	}
	if t.SandboxID != id || t.Port != port {
		return t, errorf(controlplane.Forbidden, "this signed URL is for port %d of sandbox %s, not this host", t.Port, t.SandboxID)
	}
	return t, nil
}

// validCookie reports whether r has a panda_token cookie valid for port of
// sandbox id.
func (s *Server) validCookie(r *http.Request, id string, port int, now time.Time) bool {
	for _, c := range r.Cookies() {
		if c.Name == tokenCookie {
			if _, err := s.tokenFor(c.Value, id, port, now); err == nil {
				return true
			}
		}
	}
	return false
}

// cookieError is why r's panda_token cookies are not valid (validCookie
// said so): the first one's error, an expiry preferred.
func (s *Server) cookieError(r *http.Request, id string, port int, now time.Time) error {
	var first error
	for _, c := range r.Cookies() {
		if c.Name != tokenCookie {
			continue
		}
		_, err := s.tokenFor(c.Value, id, port, now)
		if ae, ok := err.(*controlplane.Error); ok && strings.Contains(ae.Msg, "expired") {
			return err
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// withoutParam removes every name=… from a raw query, keeping the rest as
// sent, and returns its values.
func withoutParam(raw, name string) (string, []string) {
	if raw == "" {
		return "", nil
	}
	var keep, vals []string
	for _, part := range strings.Split(raw, "&") {
		k, v, _ := strings.Cut(part, "=")
		if uk, err := url.QueryUnescape(k); err == nil && uk == name {
			if uv, err := url.QueryUnescape(v); err == nil {
				vals = append(vals, uv)
			}
			continue
		}
		keep = append(keep, part)
	}
	return strings.Join(keep, "&"), vals
}

// portHost is the proxy-domain host of a port of a sandbox.
func portHost(port int, id, domain string) string {
	return strconv.Itoa(port) + "-" + id + "." + domain
}
