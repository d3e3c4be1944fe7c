// Package apifuzz fuzzes the REST API (with E2B's routes, the port proxy
// and the proxy domain on the same listener) through the real router
// (api.New(...).Handler(), served over HTTP) with a real SQLite catalog
// and the in-memory hosttest host, whose sandboxes have fake guests. It
// is a package of its own so that its fuzz workers do not each run
// package api's TestMain, which starts a host agent and boots a guest.
package restfuzz

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/controlplane/console"
)

// Flags of a fuzz input: which credentials the request carries.
const (
	authAdmin = 1 << iota // Authorization: the admin key
	authUser              // Authorization: the user key (admin wins if both)
	jsonType              // Content-Type: application/json
	envdUser              // E2b-Sandbox-Id and X-Access-Token of the user's running sandbox
	e2bUser               // X-API-KEY: the user key (E2B's control plane)
)

// requestTimeout bounds one request: a handler that has not answered
// after it counts as a hang. bodyTime is how long a streamed answer is
// read before the client hangs up.
const (
	requestTimeout = 10 * time.Second
	bodyTime       = 200 * time.Millisecond
)

// FuzzAPI sends arbitrary requests (method, target, body, the Host
// header, any other headers, and the credentials flags picks) to the API
// and checks that each is answered in time, and:
//
//   - never with a 5xx but 501 (what this server does not do) and 502
//     from the port proxy (the hosttest host answers every call with a
//     classified error, its guests answer everything);
//   - every error answer is the API's JSON error object
//     {"error":{"code","message"}} (E2B's routes: {"code","message"});
//   - every sandbox or snapshot id the host is handed is host.ValidID (so
//     a parsed path or proxy-domain Host never yields another);
//   - a sandbox's guest agent or port is reached only by a request that
//     carries its owner's API key, its envd access token or a signed port
//     URL made for it, and a port only of a sandbox and at a port the
//     request names (its path, its proxy-domain Host or its token);
//   - no guest web server receives the credential that let the request in:
//     the API key of a key-authenticated request (Authorization or
//     Sec-WebSocket-Protocol), or a signed token (panda_token, as a
//     parameter or a cookie);
//   - no answer holds an API key or a sandbox's access token the request
//     did not send, but to that sandbox's owner;
//   - a template build's context is never left on disk: it is handed to
//     the builder or removed.
//
// In target, host, headers and body, $ADMIN and $USER stand for the keys,
// $ENVD and $ENVDA for the access tokens of the user's and the admin's
// running sandbox, $PTOKEN and $PTOKENA for signed tokens of their port
// 8000: inputs can so move credentials where the server does not expect
// them. headers holds "Name: value" lines.
func FuzzAPI(f *testing.F) {
	for _, s := range seeds {
		f.Add(s.method, s.target, []byte(s.body), s.flags, s.host, s.headers)
	}
	w := newWorld(f)
	client := &http.Client{
		Transport:     &http.Transport{DisableKeepAlives: true, DisableCompression: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	f.Fuzz(func(t *testing.T, method, target string, body []byte, flags uint8, hostHdr, headers string) {
		target, hostHdr, headers = w.expand(target), w.expand(hostHdr), w.expand(headers)
		body = []byte(w.expand(string(body)))
		// What an HTTP/1.1 client would not send: a request line or
		// header it cannot write.
		if !strings.HasPrefix(target, "/") || strings.ContainsAny(target, " \r\n\x00") || strings.ContainsAny(hostHdr, " \r\n\x00/") {
			return
		}
		if _, err := url.ParseRequestURI(target); err != nil {
			return // the HTTP server answers 400 itself
		}
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, w.srv.URL, bytes.NewReader(body))
		if err != nil {
			return // an invalid method
		}
		req.URL.Opaque = target // sent as it is
		if hostHdr == "" {
			hostHdr = "api.test"
		}
		req.Host = hostHdr
		switch {
		case flags&authAdmin != 0:
			req.Header.Set("Authorization", "Bearer "+w.admin)
		case flags&authUser != 0:
			req.Header.Set("Authorization", "Bearer "+w.user)
		}
		if flags&jsonType != 0 {
			req.Header.Set("Content-Type", "application/json")
		}
		if flags&envdUser != 0 {
			req.Header.Set("E2b-Sandbox-Id", sandboxUser)
			req.Header.Set("X-Access-Token", w.envd[sandboxUser])
		}
		if flags&e2bUser != 0 {
			req.Header.Set("X-API-KEY", w.user)
		}
		for _, line := range strings.Split(headers, "\n") {
			k, v, ok := strings.Cut(line, ":")
			if k = strings.TrimSpace(k); ok && k != "" {
				req.Header.Add(k, strings.TrimSpace(v))
			}
		}

		if strings.HasPrefix(target, "//") {
			// The client would send it as the scheme-relative
			// "http://…" (absolute form): send that form with the Host,
			// and the server reads the same Host and path.
			req.URL.Opaque = "//" + hostHdr + target
		}

		w.host.begin()
		w.log.Reset()
		res, err := client.Do(req)
		req.URL.Opaque = target // what the checks read
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("%s %s (Host %q): no answer after %s; server log:\n%s", method, target, hostHdr, requestTimeout, w.log.String())
			}
			var ue *url.Error
			refused := strings.Contains(err.Error(), "net/http: ") || strings.Contains(err.Error(), "invalid") || strings.Contains(err.Error(), "malformed")
			if errors.As(err, &ue) && refused && !strings.Contains(err.Error(), "connection broken") && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				return // a request line or header the client refuses to write
			}
			t.Fatalf("%s %s (Host %q, headers %q): %v; server log:\n%s", method, target, hostHdr, headers, err, w.log.String())
		}
		// A streamed answer (events, exec streams, watches) is read for
		// bodyTime, then the client hangs up, as one that has seen enough.
		stop := time.AfterFunc(bodyTime, func() { res.Body.Close() })
		out, _ := io.ReadAll(io.LimitReader(res.Body, 4<<20))
		stop.Stop()
		res.Body.Close()
		if res.StatusCode == http.StatusBadRequest && strings.HasPrefix(res.Header.Get("Content-Type"), "text/plain") && strings.HasPrefix(string(out), "400 Bad Request") {
			return // net/http refused the request (a Host it cannot take, ...) before any handler
		}
		defer w.heal(t)

		where := fmt.Sprintf("%s %s (Host %q, headers %q, body %q, flags %d)", method, target, hostHdr, headers, body, flags)
		w.checkAnswer(t, where, req, res, out)
		w.checkHost(t, where, req, body)
		w.checkSecrets(t, where, req, body, res, out)
		// A build's context is the builder's once handed over (which
		// removes it); every other way out removes it.
		if left, _ := filepath.Glob(filepath.Join(w.contexts, "*")); len(left) > 0 {
			t.Fatalf("%s: build contexts left behind: %v", where, left)
		}
	})
}

// expand replaces the input's placeholders with the world's credentials.
func (w *world) expand(s string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	return strings.NewReplacer(
		"$ADMIN", w.admin, "$USER", w.user,
		"$ENVDA", w.envd[sandboxAdmin], "$ENVD", w.envd[sandboxUser],
		"$PTOKENA", w.ports[sandboxAdmin], "$PTOKEN", w.ports[sandboxUser],
	).Replace(s)
}

// proxied reports whether r goes through the port proxy: a signed URL, a
// port of a sandbox, or the proxy domain.
func proxied(r *http.Request) bool {
	p := r.URL.Opaque
	if _, ok := proxyHost(r.Host); ok {
		return true
	}
	return strings.HasPrefix(p, "/p/") || strings.Contains(p, "/ports/") && strings.HasPrefix(p, "/v1/sandboxes/")
}

// codeRoute reports whether r is for the code interpreter of sandbox id
// ("": any): /v1/sandboxes/{id}/code…, which reaches the guest's port
// 49999 (its fake guest's answers are no code server's: 502).
func codeRoute(r *http.Request, id string) bool {
	rest, ok := strings.CutPrefix(r.URL.Opaque, "/v1/sandboxes/")
	if !ok {
		return false
	}
	sb, rest, _ := strings.Cut(rest, "/")
	rest, _, _ = strings.Cut(rest, "?")
	return (id == "" || sb == id) && (rest == "code" || strings.HasPrefix(rest, "code/"))
}

// proxyHost is the sandbox label of a proxy-domain Host as the server
// reads it ({port}-{id}, the port in decimal, 1 to 65535): lower case,
// without port or trailing dot.
func proxyHost(h string) (string, bool) {
	if hh, _, err := net.SplitHostPort(h); err == nil {
		h = hh
	}
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	label, ok := strings.CutSuffix(h, "."+proxyDomain)
	if !ok || strings.Contains(label, ".") {
		return "", false
	}
	ps, _, ok := strings.Cut(label, "-")
	port, err := strconv.Atoi(ps)
	return label, ok && err == nil && port >= 1 && port <= 65535 && ps == strconv.Itoa(port)
}

// checkAnswer holds the answer to its shape: status, error body, JSON.
func (w *world) checkAnswer(t *testing.T, where string, req *http.Request, res *http.Response, b []byte) {
	ct := res.Header.Get("Content-Type")
	if path, _, _ := strings.Cut(req.URL.Opaque, "?"); (path == "/" || strings.HasPrefix(path, console.AssetPrefix)) && strings.HasPrefix(ct, "text/html") {
		return // the web console's page (503 where its bundle is not built, as in a fresh checkout)
	}
	switch {
	case res.StatusCode == http.StatusNotImplemented && errorCode(b) == "not_implemented":
	case res.StatusCode == http.StatusBadGateway && proxied(req):
	case res.StatusCode == http.StatusBadGateway && codeRoute(req, "") && errorCode(b) == "guest_error":
	case res.StatusCode >= 500:
		t.Fatalf("%s: status %d, body %s; server log:\n%s", where, res.StatusCode, b, w.log.String())
	}
	envd := req.Header.Get("E2b-Sandbox-Id") != "" || strings.Contains(req.URL.Opaque, "signature=")
	if envd && len(b) == 0 && (res.StatusCode == http.StatusMethodNotAllowed || res.StatusCode == http.StatusUnsupportedMediaType) {
		return // connect-go's own answer to an RPC of the wrong method or codec (as E2B's envd)
	}
	if res.StatusCode >= 400 && !proxied(req) {
		if ct != "application/json" {
			t.Fatalf("%s: status %d with Content-Type %q, want application/json; body %s", where, res.StatusCode, ct, b)
		}
		// E2B's routes (outside /v1: its control plane, envd's) answer
		// in E2B's shape, {"code": status, "message": …} (Connect's
		// envd RPCs {"code": "not_found", …}), as its SDK expects.
		var e2b struct {
			Code    any     `json:"code"`
			Message *string `json:"message"`
		}
		if (envd || !strings.HasPrefix(req.URL.Opaque, "/v1/")) && json.Unmarshal(b, &e2b) == nil && e2b.Code != nil && e2b.Message != nil && *e2b.Message != "" {
			return
		}
		if errorCode(b) == "" {
			t.Fatalf("%s: status %d, body %s: not an error object {\"error\":{\"code\",\"message\"}}", where, res.StatusCode, b)
		}
	} else if strings.HasPrefix(ct, "application/json") && !json.Valid(b) && len(b) < 4<<20 {
		t.Fatalf("%s: status %d, Content-Type JSON but the body is not: %q", where, res.StatusCode, b)
	}
}

// errorCode is the code of an API error body, "" if it is not one.
func errorCode(b []byte) string {
	var e struct {
		Error *struct {
			Code    *string `json:"code"`
			Message *string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil || e.Error == nil || e.Error.Code == nil || e.Error.Message == nil || *e.Error.Message == "" {
		return ""
	}
	return *e.Error.Code
}

// normal is the text of a request, percent-decoded and without line
// breaks (which a base64 decoder skips), to look for credentials in.
func normal(parts ...string) string {
	s := strings.Join(parts, "\x00")
	if u, err := url.PathUnescape(s); err == nil {
		s = u
	}
	return strings.NewReplacer("\r", "", "\n", "").Replace(s)
}

// requestText is everything a request carried.
func requestText(req *http.Request, body []byte) string {
	var h strings.Builder
	req.Header.Write(&h)
	return normal(req.URL.Opaque, req.Host, h.String(), string(body))
}

// checkHost holds what reached the host to what the request may reach.
func (w *world) checkHost(t *testing.T, where string, req *http.Request, body []byte) {
	w.host.mu.Lock()
	defer w.host.mu.Unlock()
	for _, id := range w.host.ids {
		if !host.ValidID(id) {
			t.Fatalf("%s: the host was handed id %q, which host.ValidID refuses", where, id)
		}
	}
	text := requestText(req, body)
	label, onDomain := proxyHost(req.Host)
	for _, r := range w.host.reached {
		owner, fixed := w.owner(r.id), w.records[r.id].ID != ""
		if !fixed {
			t.Fatalf("%s: reached sandbox %s, which the world does not have", where, r.id)
		}
		if !strings.Contains(text, owner) && !strings.Contains(text, w.envd[r.id]) && !strings.Contains(text, w.ports[r.id]) {
			t.Fatalf("%s: reached sandbox %s (port %d) without its owner's key, its access token or its signed URL", where, r.id, r.port)
		}
		if r.port == 0 {
			continue
		}
		named := onDomain && label == strconv.Itoa(r.port)+"-"+r.id ||
			strings.Contains(text, "/sandboxes/"+r.id+"/ports/"+strconv.Itoa(r.port)) ||
			r.port == 8000 && strings.Contains(text, w.ports[r.id]) ||
			r.port == 49999 && codeRoute(req, r.id)
		if !named {
			t.Fatalf("%s: dialled port %d of sandbox %s, which the request does not name", where, r.port, r.id)
		}
	}
	tokens := []string{w.ports[sandboxUser], w.ports[sandboxAdmin]}
	keyAuth := !strings.HasPrefix(req.URL.Opaque, "/p/") && !(onDomain && (strings.Contains(text, tokens[0]) || strings.Contains(text, tokens[1])))
	for _, p := range w.host.proxied {
		if _, ok := p.req.URL.Query()["panda_token"]; ok {
			t.Fatalf("%s: the guest's server got the panda_token parameter: %s", where, p.req.URL)
		}
		for _, c := range p.req.Cookies() {
			if c.Name == "panda_token" {
				t.Fatalf("%s: the guest's server got the panda_token cookie", where)
			}
		}
		if !keyAuth {
			continue
		}
		for _, name := range []string{"Authorization", "Sec-WebSocket-Protocol"} {
			v := normal(strings.Join(p.header.Values(name), ","))
			if strings.Contains(v, w.admin) || strings.Contains(v, w.user) {
				t.Fatalf("%s: the guest's server got the API key that let the request in, in %s: %q", where, name, v)
			}
		}
	}
}

// checkSecrets holds the answer to the secrets it may show: an API key
// or access token only if the request sent it (an echo), a sandbox's
// access token also to its owner.
func (w *world) checkSecrets(t *testing.T, where string, req *http.Request, body []byte, res *http.Response, out []byte) {
	var h strings.Builder
	res.Header.Write(&h)
	answer := normal(h.String(), string(out))
	text := requestText(req, body)
	for name, secret := range map[string]string{"admin key": w.admin, "user key": w.user} {
		if strings.Contains(answer, secret) && !strings.Contains(text, secret) {
			t.Fatalf("%s: the answer holds the %s", where, name)
		}
	}
	for id, tok := range w.envd {
		if strings.Contains(answer, tok) && !strings.Contains(text, tok) && !strings.Contains(text, w.owner(id)) {
			t.Fatalf("%s: the answer holds the access token of sandbox %s, whose owner's key the request does not hold", where, id)
		}
	}
}

// seeds are one or more requests per route, valid and not; ids of the
// world's sandboxes (and "abc", one it does not have) and placeholders for
// its credentials.
var seeds = []struct {
	method, target, body string
	flags                uint8
	host, headers        string
}{
	{"GET", "/healthz", "", 0, "", ""},
	{"GET", "/metrics", "", 0, "", ""},
	{"GET", "/metrics", "", authAdmin, "", ""},
	{"GET", "/v1/openapi.yaml", "", 0, "", ""},
	{"GET", "/", "", 0, "", ""},
	{"GET", "/nope", "", authAdmin, "", ""},
	{"PATCH", "/v1/sandboxes", "", authAdmin, "", ""},
	{"GET", "/v1/sandboxes", "", 0, "", ""},
	{"GET", "/v1/sandboxes", "", authUser, "", ""},
	{"GET", "/v1/sandboxes", "", 0, "", "Authorization: Bearer  $USER "},
	{"GET", "/v1/sandboxes", "", 0, "", "Authorization: bearer $USER"},
	{"GET", "/v1/sandboxes", "", 0, "", "Upgrade: websocket\nSec-WebSocket-Protocol: bearer.$USER"},
	// Issue 31, finding 3: the subprotocol key must not reach the guest.
	{"GET", "/v1/sandboxes/fuzzuser000000000001/ports/8000/ws", "", 0, "", "Upgrade: websocket\nConnection: Upgrade\nSec-WebSocket-Protocol: bearer.$USER"},
	{"GET", "/ws", "", 0, "8000-fuzzuser000000000001.sb.test", "Upgrade: websocket\nConnection: Upgrade\nSec-WebSocket-Protocol: bearer.$USER"},
	{"POST", "/v1/sandboxes", `{"template":"base","memory_mib":512,"vcpus":1,"ttl_seconds":60,"on_expire":"pause","metadata":{"a":"b"},"env":{"X":"1"}}`, authUser | jsonType, "", ""},
	{"POST", "/v1/sandboxes", `{"template":"base","network":{"internet":false,"allow_out":["example.com","*.x.example","10.0.0.0/8"]}}`, authUser | jsonType, "", ""},
	{"POST", "/v1/sandboxes", `{"template":"../etc","memory_mib":-1}`, authUser | jsonType, "", ""},
	{"POST", "/v1/sandboxes", `{"memory_mib":1e99,"vcpus":1.5,"ttl_seconds":-1}`, authUser, "", ""},
	{"POST", "/v1/sandboxes", `{"metadata":{"":"x","a\u0000":"y"},"env":{"A":"\u0000"}}`, authAdmin, "", ""},
	{"POST", "/v1/sandboxes", `{"snapshot_id":"snapabc"}`, authAdmin, "", ""},
	{"POST", "/v1/sandboxes", `{"unknown":1}{"x":2}`, authAdmin, "", ""},
	{"POST", "/v1/sandboxes", "[]", authAdmin, "", ""},
	{"POST", "/v1/sandboxes", "null", authAdmin, "", ""},
	{"POST", "/v1/sandboxes", "\"\xff\"", authAdmin, "", ""},
	{"POST", "/v1/sandboxes", "", authAdmin, "", ""},
	{"GET", "/v1/sandboxes?state=running&metadata=app%3Dfuzz&metadata=c%3D", "", authUser, "", ""},
	{"GET", "/v1/sandboxes?state=stopped&metadata=%25%3D_&metadata=%22%3D%5C", "", authAdmin, "", ""},
	{"GET", "/v1/sandboxes?metadata=a%00b%3Dc", "", authAdmin, "", ""},
	{"GET", "/v1/sandboxes?metadata=%3Dx&state=bogus", "", authAdmin, "", ""},
	{"GET", "/v1/sandboxes/fuzzuser000000000001", "", authUser, "", ""},
	{"GET", "/v1/sandboxes/fuzzadmin00000000001", "", authUser, "", ""},
	{"GET", "/v1/sandboxes/abc", "", authAdmin, "", ""},
	{"GET", "//v1/sandboxes", "", authUser, "", ""},
	{"GET", "//#", "0", envdUser | authAdmin | authUser | e2bUser, "", "0"},
	{"GET", "//x/../v1/sandboxes/fuzzuser000000000001/ports/8000/", "", authUser, "8000-fuzzuser000000000001.sb.test", ""},
	{"GET", "/v1/sandboxes/ABC%2F..", "", authAdmin, "", ""},
	{"DELETE", "/v1/sandboxes/fuzzuser000000000001", "", authUser, "", ""},
	{"PUT", "/v1/sandboxes/fuzzuser000000000001/ttl", `{"ttl_seconds":10}`, authUser, "", ""},
	{"PUT", "/v1/sandboxes/fuzzuser000000000001/ttl", `{"ttl_seconds":9223372036854775807}`, authUser, "", ""},
	{"PATCH", "/v1/sandboxes/fuzzuser000000000001/network", `{"internet":false,"deny_out":["*.example"]}`, authUser | jsonType, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/fork", `{"count":2}`, authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/fork", `{"count":-2}`, authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/snapshots", `{"name":"before"}`, authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/pause", "", authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000002/resume", "", authUser, "", ""},
	{"GET", "/v1/sandboxes/fuzzuser000000000001/commands", "", authUser, "", ""},
	{"GET", "/v1/snapshots", "", authUser, "", ""},
	{"GET", "/v1/snapshots/snapabc", "", authUser, "", ""},
	{"DELETE", "/v1/snapshots/snapabc", "", authAdmin, "", ""},
	{"GET", "/v1/hosts", "", authAdmin, "", ""},
	{"POST", "/v1/hosts/local/drain", "", authAdmin, "", ""},
	{"GET", "/v1/events", "", authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/exec", `{"cmd":"echo hi","timeout_seconds":5,"env":{"A":"b"},"cwd":"/work"}`, authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/exec", `{"argv":["ls","-l"],"stdin":"x","timeout_seconds":-1}`, authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzadmin00000000001/exec", `{"cmd":"id"}`, authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000002/exec", `{"cmd":"id"}`, authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/exec/stream", `{"cmd":"cat"}`, authUser, "", ""},
	{"GET", "/v1/sandboxes/fuzzuser000000000001/files?path=/etc/hosts", "", authUser, "", ""},
	{"PUT", "/v1/sandboxes/fuzzuser000000000001/files?path=/work/x&mode=0644", "hello", authUser, "", ""},
	{"DELETE", "/v1/sandboxes/fuzzuser000000000001/files?path=/work&recursive=true", "", authUser, "", ""},
	{"GET", "/v1/sandboxes/fuzzuser000000000001/files/list?path=%2F", "", authUser, "", ""},
	{"GET", "/v1/sandboxes/fuzzuser000000000001/files/stat?path=relative", "", authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/files/mkdir", `{"path":"/work/d"}`, authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/files/rename", `{"from":"/a","to":"/b"}`, authUser, "", ""},
	{"GET", "/v1/sandboxes/fuzzuser000000000001/watch?path=/work&recursive=true", "", authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/processes", `{"cmd":"sleep 1","pty":{"rows":24,"cols":80}}`, authUser, "", ""},
	{"GET", "/v1/sandboxes/fuzzuser000000000001/processes", "", authUser, "", ""},
	// The code interpreter (port 49999 of the guest).
	{"POST", "/v1/sandboxes/fuzzuser000000000001/code", `{"code":"1+1","language":"py","env":{"A":"1"},"timeout_seconds":5}`, authUser | jsonType, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/code", `{"code":"x","context_id":"../../contexts"}`, authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/code", `{"code":"x","language":"cobol","context_id":"a"}`, authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzadmin00000000001/code", `{"code":"1"}`, authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/code/contexts", `{"language":"js","cwd":"/tmp"}`, authUser, "", ""},
	{"GET", "/v1/sandboxes/fuzzuser000000000001/code/contexts", "", authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/code/contexts/ctx_1/restart", "", authUser, "", ""},
	{"DELETE", "/v1/sandboxes/fuzzuser000000000001/code/contexts/a%2F..%2Fb", "", authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/code/interrupt", `{"context_id":"ctx_1"}`, authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000002/code/interrupt", `{}`, authUser, "", ""},
	{"GET", "/v1/sandboxes/fuzzuser000000000001/processes/7/output?stdout_offset=0", "", authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/processes/7/stdin", "data", authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/processes/7/signal", `{"signal":"TERM"}`, authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/processes/7/resize", `{"rows":0,"cols":0}`, authUser, "", ""},
	{"GET", "/v1/sandboxes/fuzzuser000000000001/processes/7/tty", "", 0, "", "Upgrade: websocket\nConnection: Upgrade\nSec-WebSocket-Version: 13\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\nSec-WebSocket-Protocol: bearer.$USER"},
	{"GET", "/v1/sandboxes/fuzzuser000000000001/ports", "", authUser, "", ""},
	{"GET", "/v1/sandboxes/fuzzuser000000000001/ports/8000/a/b%2Fc?x=1", "", authUser, "", "Cookie: panda_token=$PTOKEN; other=1"},
	{"GET", "/v1/sandboxes/fuzzadmin00000000001/ports/8000/", "", authUser, "", ""},
	{"DELETE", "/v1/sandboxes/fuzzuser000000000001/ports/65536/", "", authUser, "", ""},
	{"OPTIONS", "/v1/sandboxes/fuzzuser000000000001/ports/80", "", authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/ports/8000/url", `{"ttl_seconds":60}`, authUser, "", ""},
	{"POST", "/v1/sandboxes/fuzzuser000000000001/ports/0/url", `{"ttl_seconds":-1}`, authUser, "", ""},
	{"GET", "/p/$PTOKEN/x?y=1", "", 0, "", ""},
	{"GET", "/p/$PTOKEN", "", 0, "", ""},
	{"POST", "/p/$PTOKEN/form", "a=1", 0, "", "Authorization: Basic dTpw\nCookie: session=guest"},
	{"GET", "/p/$PTOKENA/", "", authUser, "", ""},
	{"GET", "/p/AQAAAABpK9fkH0AUcm9ha3k2djNnZjl3Z2R6OWNzMzn0XkGyYBwE8Yg6aXUOJ7Dn/x?y=1", "", 0, "", ""},
	{"PUT", "/p/%2F..", "x", 0, "", ""},
	{"GET", "/", "", 0, "8000-fuzzuser000000000001.sb.test", ""},
	{"GET", "/?panda_token=$PTOKEN", "", 0, "8000-fuzzuser000000000001.sb.test", ""},
	{"POST", "/api?panda_token=$PTOKEN&x=1", "{}", 0, "8000-fuzzuser000000000001.sb.test:443", ""},
	{"GET", "/app", "", 0, "8000-fuzzuser000000000001.SB.TEST.", "Cookie: panda_token=$PTOKEN"},
	{"GET", "/app", "", 0, "8000-fuzzuser000000000001.sb.test", "Cookie: panda_token=$PTOKENA; panda_token=$PTOKEN"},
	{"GET", "/app", "", authUser, "8000-fuzzuser000000000001.sb.test", ""},
	{"GET", "/app", "", authUser, "8000-fuzzadmin00000000001.sb.test", ""},
	{"GET", "/", "", authUser, "8001-fuzzuser000000000001.sb.test", "Cookie: panda_token=$PTOKEN"},
	{"GET", "/", "", authUser, "0-fuzzuser000000000001.sb.test", ""},
	{"GET", "/", "", authUser, "99999-x.sb.test", ""},
	{"GET", "/", "", authUser, "8000-FUZZ-user.sb.test", ""},
	{"GET", "/", "", authUser, "8000-fuzzuser000000000001.x.sb.test", ""},
	{"GET", "/", "", authUser, "8000-fuzzuser000000000001.sb.test.evil", ""},
	{"GET", "/v1/sandboxes", "", authUser, "sb.test", ""},
	{"GET", "/v1/templates", "", authUser, "", ""},
	{"POST", "/v1/templates/base/bake", `{"memory_mib":512,"vcpus":1}`, authAdmin, "", ""},
	{"POST", "/v1/templates/..%2Fx/bake", `{}`, authAdmin, "", ""},
	{"POST", "/v1/templates", `{"name":"t","from_image":"127.0.0.1:9999/x"}`, authUser | jsonType, "", ""},
	{"POST", "/v1/templates", `{"name":"app","dockerfile":"FROM base\nRUN echo hi\n","build_args":{"A":"1"}}`, authUser | jsonType, "", ""},
	{"POST", "/v1/templates", buildBody(`{"name":"app"}`, "FROM base\nCOPY . /app\n", true), authUser, "", "Content-Type: multipart/form-data; boundary=" + buildBoundary},
	{"POST", "/v1/templates", buildBody(`{"name":"app","dockerfile_path":"Dockerfile"}`, "", true), authUser, "", "Content-Type: multipart/form-data; boundary=" + buildBoundary},
	{"POST", "/v1/templates", buildBody(`{"name":"app","from_image":"busybox"}`, "", true), authUser, "", "Content-Type: multipart/form-data; boundary=" + buildBoundary},
	{"POST", "/v1/templates", buildBody(`{"name":"app","bogus":1}`, "FROM base\n", true), authUser, "", "Content-Type: multipart/form-data; boundary=" + buildBoundary},
	{"POST", "/v1/templates", strings.Replace(buildBody(`{"name":"app"}`, "FROM base\n", true), "Dockerfile", "../../x", 1), authUser, "", "Content-Type: multipart/form-data; boundary=" + buildBoundary},
	{"POST", "/v1/templates/base/publish", "", authUser, "", ""},
	{"GET", "/v1/templates/builds", "", authUser, "", ""},
	{"POST", "/v1/keys", `{"name":"k","admin":false,"max_sandboxes":2,"max_memory_mib":512}`, authAdmin, "", ""},
	{"POST", "/v1/keys", `{"name":"k"}`, authUser, "", ""},
	{"GET", "/v1/keys", "", authAdmin, "", ""},
	{"DELETE", "/v1/keys/keyabc", "", authAdmin, "", ""},
	// E2B's control plane and envd.
	{"POST", "/sandboxes", `{"templateID":"base","timeout":60,"metadata":{"a":"b"}}`, e2bUser, "", ""},
	{"POST", "/v2/sandboxes", `{"templateID":"base","allow_internet_access":false}`, e2bUser, "", ""},
	{"GET", "/v2/sandboxes?state=running&metadata=app%3Dfuzz", "", e2bUser, "", ""},
	{"GET", "/sandboxes/fuzzadmin00000000001", "", e2bUser, "", ""},
	{"POST", "/sandboxes/fuzzuser000000000001/connect", `{"timeout":30}`, e2bUser, "", ""},
	{"POST", "/sandboxes/fuzzuser000000000002/connect", `{}`, 0, "", "X-API-KEY: $USER"},
	{"POST", "/sandboxes/fuzzadmin00000000001/connect", `{}`, e2bUser, "", ""},
	{"POST", "/sandboxes/fuzzuser000000000001/fork", `{"count":1}`, e2bUser, "", ""},
	{"DELETE", "/sandboxes/fuzzuser000000000001", "", 0, "", "Authorization: Bearer $USER"},
	{"POST", "/filesystem.Filesystem/Stat", `{"path":"/work"}`, envdUser | jsonType, "", ""},
	{"POST", "/filesystem.Filesystem/ListDir", `{"path":"/","depth":2}`, envdUser | jsonType, "", ""},
	{"POST", "/filesystem.Filesystem/Stat", `{"path":"/"}`, jsonType, "", "E2b-Sandbox-Id: fuzzadmin00000000001\nX-Access-Token: $ENVD"},
	{"POST", "/filesystem.Filesystem/Stat", `{"path":"/"}`, jsonType, "", "E2b-Sandbox-Id: fuzzadmin00000000001\nX-Access-Token: $ENVDA"},
	{"POST", "/filesystem.Filesystem/Stat", `{"path":"/"}`, jsonType, "", "E2b-Sandbox-Id: fuzzuser000000000001\nX-Access-Token: $USER"},
	{"POST", "/process.Process/Start", "\x00\x00\x00\x00\x18{\"process\":{\"cmd\":\"ls\"}}", envdUser, "", "Content-Type: application/connect+json"},
	{"POST", "/process.Process/List", `{}`, envdUser | jsonType, "", ""},
	{"GET", "/files?path=/work/a.txt&username=root", "", envdUser, "", ""},
	{"POST", "/files?path=/work/up.txt", "data", envdUser, "", "Content-Type: application/octet-stream"},
	{"GET", "/health", "", envdUser, "", ""},
	{"GET", "/files?path=/x&signature=v1_x&signature_expiration=99999999999", "", 0, "", ""},
	{"POST", "/v1/fleet/join", `{"token":"x"}`, 0, "", ""},
}

// buildBoundary is the multipart boundary of buildBody's requests.
const buildBoundary = "fuzzboundary"

// buildBody is a multipart build request (POST /v1/templates): its spec,
// a dockerfile part unless dockerfile is "", and a context tar (holding a
// Dockerfile and a file) if withContext.
func buildBody(spec, dockerfile string, withContext bool) string {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	mw.SetBoundary(buildBoundary)
	if spec != "" {
		pw, _ := mw.CreateFormField("spec")
		pw.Write([]byte(spec))
	}
	if dockerfile != "" {
		pw, _ := mw.CreateFormField("dockerfile")
		pw.Write([]byte(dockerfile))
	}
	if withContext {
		pw, _ := mw.CreateFormFile("context", "context.tar")
		tw := tar.NewWriter(pw)
		for _, f := range []struct{ name, body string }{{"Dockerfile", "FROM base\n"}, {"app/main.py", "print(1)\n"}} {
			tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), Typeflag: tar.TypeReg})
			tw.Write([]byte(f.body))
		}
		tw.Close()
	}
	mw.Close()
	return b.String()
}
