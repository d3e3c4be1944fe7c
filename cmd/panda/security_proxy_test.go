package main

// Attacks through the port proxy, black-box against a real `panda up`: a
// server in a guest (busybox httpd in the tiny template) that records
// what reaches it, and requests made the way a browser or an SDK makes
// them.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/nettest"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// recorderCGI appends the request's headers and query, as busybox httpd
// passes them to a CGI (HTTP_*, QUERY_STRING), to /tmp/seen, and answers
// them.
const recorderCGI = `#!/bin/sh
{ env | grep -E '^(HTTP_|QUERY_STRING=)'; echo ---; } >> /tmp/seen
printf 'Content-Type: text/plain\r\n\r\n'
env | grep -E '^(HTTP_|QUERY_STRING=)'
`

// serveRecorder starts busybox httpd on port 8000 of sb, serving
// /tmp/www: index.html and the recorder at /cgi-bin/rec.
func serveRecorder(t *testing.T, ctx context.Context, sb *pandastack.Sandbox) {
	t.Helper()
	writeFile(t, ctx, sb, "/tmp/www/index.html", "served-in-the-sandbox\n")
	writeFile(t, ctx, sb, "/tmp/www/cgi-bin/rec", recorderCGI)
	mustExec(t, ctx, sb, "chmod 755 /tmp/www/cgi-bin/rec && busybox httpd -p 8000 -h /tmp/www")
}

// signedToken signs a URL of port of sandbox id with key on the API at
// base (through hc) and returns the URL and its token.
func signedToken(t *testing.T, ctx context.Context, hc *http.Client, base, key, id string, port int) (string, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "POST", fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d/url", base, id, port), strings.NewReader(`{"ttl_seconds": 600}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var u struct{ URL string }
	if err := json.NewDecoder(res.Body).Decode(&u); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("sign a URL of port %d: %d %v", port, res.StatusCode, err)
	}
	if i := strings.Index(u.URL, "panda_token="); i >= 0 {
		return u.URL, u.URL[i+len("panda_token="):]
	}
	p, _ := url.Parse(u.URL)
	return u.URL, strings.Trim(strings.TrimPrefix(p.Path, "/p/"), "/")
}

// send sends a request through hc and returns its status and body.
func send(t *testing.T, hc *http.Client, req *http.Request) (int, string) {
	t.Helper()
	res, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	return res.StatusCode, string(b)
}

// TestSecurityProxyCredentials replays issue 31's finding 3: a client
// opens a WebSocket to a port of its sandbox through the API with the
// key in the handshake, as docs/api.md taught for the terminal
// (Sec-WebSocket-Protocol: bearer.<key>), and with the other credentials
// the server understands (X-API-Key, the E2B access token, a signed
// token as cookie and parameter). The guest's server records what
// reaches it: none of them may, through the key's route or a signed URL;
// the guest's own subprotocol does. And the key as a subprotocol alone
// opens nothing but the terminal.
func TestSecurityProxyCredentials(t *testing.T) {
	w := security(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sb := w.sandbox(t, ctx, w.Alice)
	serveRecorder(t, ctx, sb)

	// The sandbox's E2B access token, as the E2B SDK sends it.
	code, b := w.mustDo(t, ctx, "", "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 600}, http.Header{"X-Api-Key": {w.Alice}})
	var conn struct{ EnvdAccessToken string }
	if json.Unmarshal(b, &conn); conn.EnvdAccessToken == "" {
		t.Fatalf("E2B connect: %d %s, want the access token", code, b)
	}
	signed, _ := signedToken(t, ctx, w.hc, w.URL(), w.Alice, sb.ID, 8000)
	_, other := signedToken(t, ctx, w.hc, w.URL(), w.Alice, sb.ID, 9000) // a credential, not this port's
	secrets := map[string]string{"the API key": w.Alice, "the E2B access token": conn.EnvdAccessToken, "a signed token": other}

	for name, u := range map[string]string{
		"with the key": w.URL() + "/v1/sandboxes/" + sb.ID + "/ports/8000/cgi-bin/rec",
		"signed URL":   signed + "cgi-bin/rec",
	} {
		req, _ := http.NewRequestWithContext(ctx, "GET", u+"?a=1&panda_token="+other, nil)
		for k, v := range map[string]string{
			"Authorization": "Bearer " + w.Alice,
			"Upgrade":       "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
			"Sec-WebSocket-Key":      "dGhlIHNhbXBsZSBub25jZQ==",
			"Sec-WebSocket-Protocol": "chat, bearer." + w.Alice,
			"X-Api-Key":              w.Alice, "X-Access-Token": conn.EnvdAccessToken,
			"Cookie": "theirs=1; panda_token=" + other,
		} {
			req.Header.Set(k, v)
		}
		if code, body := send(t, w.hc, req); code != http.StatusOK {
			t.Fatalf("%s: %d %s, want the recorder's 200", name, code, body)
		}
	}
	seen := mustExec(t, ctx, sb, "cat /tmp/seen")
	t.Logf("the guest saw:\n%s", seen)
	for what, s := range secrets {
		if strings.Contains(seen, s) {
			t.Errorf("%s reached the guest", what)
		}
	}
	if got := strings.Count(seen, "HTTP_SEC_WEBSOCKET_PROTOCOL=chat\n"); got != 2 {
		t.Errorf("the guest's own subprotocol reached it %d times of 2", got)
	}
	if got := strings.Count(seen, "HTTP_COOKIE=theirs=1\n"); got != 2 {
		t.Errorf("the guest's own cookie reached it %d times of 2", got)
	}

	// The key as a subprotocol, no Authorization: not a credential of
	// the port proxy (nor of any route but the terminal's).
	for _, path := range []string{"/v1/sandboxes/" + sb.ID + "/ports/8000/cgi-bin/rec", "/v1/sandboxes/" + sb.ID} {
		code, body := w.mustDo(t, ctx, "", "GET", path, nil, http.Header{
			"Upgrade": {"websocket"}, "Connection": {"Upgrade"}, "Sec-Websocket-Version": {"13"},
			"Sec-Websocket-Key": {"dGhlIHNhbXBsZSBub25jZQ=="}, "Sec-Websocket-Protocol": {"bearer." + w.Alice},
		})
		if code != http.StatusUnauthorized {
			t.Errorf("GET %s with the key as a subprotocol: %d %s, want 401", path, code, body)
		}
	}
	if got := mustExec(t, ctx, sb, "grep -c -- --- /tmp/seen"); strings.TrimSpace(got) != "2" {
		t.Errorf("the guest got %s requests, want the 2 above", strings.TrimSpace(got))
	}
}

// TestSecurityProxyDomainCrossSite replays issue 31's finding 8 against a
// server with a proxy domain: the hosts {port}-{id}.DOMAIN are one site,
// so a page in tenant A's sandbox makes the browser send tenant B's
// panda_token cookie (SameSite=Lax) with its requests to B's host. With
// the cookie, the requests a sibling's page makes (a fetch, a WebSocket)
// are refused; B's own pages and a link followed to it work. Answers there
// carry the sandbox CSP with allow-same-origin (the port's origin is its
// own).
func TestSecurityProxyDomainCrossSite(t *testing.T) {
	e2e(t)
	env := nettest.NewEnv(t)
	dir := newDataDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const domain = "sbx.test"
	s := startNetServer(t, dir, env, "--proxy-domain", domain)
	sb := s.create(t, ctx, nil)
	defer sb.Kill(context.Background())
	serveRecorder(t, ctx, sb)
	_, tok := signedToken(t, ctx, s.hc, s.URL(), s.AdminKey(), sb.ID, 8000)
	host := "8000-" + sb.ID + "." + domain
	sibling := "http://8000-" + strings.Repeat("a", 20) + "." + domain // another tenant's page

	get := func(hdr map[string]string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "GET", s.URL()+"/", nil)
		req.Host = host
		req.Header.Set("Cookie", "panda_token="+tok)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := s.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		return res.StatusCode, string(b), res.Header
	}
	for _, tc := range []struct {
		name string
		hdr  map[string]string
		want int
	}{
		{"its own page's fetch", map[string]string{"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty", "Origin": "http://" + host}, 200},
		{"a link followed from a sibling", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, 200},
		{"a sibling's fetch", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty", "Origin": sibling}, 403},
		{"a sibling's script tag", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "script", "Referer": sibling + "/"}, 403},
		{"a sibling's frame", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe", "Referer": sibling + "/"}, 403},
		{"a sibling's WebSocket", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "websocket", "Origin": sibling,
			"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}, 403},
		{"an old browser on a sibling", map[string]string{"Origin": sibling}, 403},
	} {
		code, body, hdr := get(tc.hdr)
		if code != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, code, strings.TrimSpace(body), tc.want)
		}
		if code == http.StatusForbidden && !strings.Contains(body, "another site") {
			t.Errorf("%s: refused with %s, want it to say why", tc.name, body)
		}
		if code == http.StatusOK && !slicesContain(hdr.Values("Content-Security-Policy"), "sandbox allow-same-origin") {
			t.Errorf("%s: Content-Security-Policy %q, want the sandbox with allow-same-origin", tc.name, hdr.Values("Content-Security-Policy"))
		}
	}
}

// slicesContain reports whether any of vs contains s.
func slicesContain(vs []string, s string) bool {
	for _, v := range vs {
		if strings.Contains(v, s) {
			return true
		}
	}
	return false
}
