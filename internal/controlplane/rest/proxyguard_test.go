package rest

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// TestCookieSite: which requests carrying a valid panda_token cookie of
// 8000-{id}.sbx.test may use it (issue 31, finding 8: the hosts of the
// proxy domain are one site, so a page of another sandbox is same-site
// and its requests carry the cookie).
func TestCookieSite(t *testing.T) {
	s := &Server{cfg: Config{ProxyDomain: "sbx.test"}}
	const id = "abc123"
	const self = "https://8000-abc123.sbx.test"
	for _, tc := range []struct {
		name   string
		method string
		hdr    map[string]string
		ok     bool
	}{
		{"same origin fetch", "POST", map[string]string{"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Origin": self}, true},
		{"typed in the address bar", "GET", map[string]string{"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, true},
		{"a link followed from another site", "GET", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, true},
		{"a link followed from a sibling", "HEAD", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, true},
		{"a sibling's fetch", "GET", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty", "Origin": "https://8000-other1.sbx.test"}, false},
		{"a sibling's image", "GET", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image", "Referer": "https://8000-other1.sbx.test/"}, false},
		{"a sibling's image, no referrer", "GET", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}, false},
		{"a sibling's frame", "GET", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"}, false},
		{"a sibling's form POST", "POST", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document", "Origin": "https://8000-other1.sbx.test"}, false},
		{"a sibling's WebSocket", "GET", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "websocket", "Upgrade": "websocket", "Origin": "https://8000-other1.sbx.test"}, false},
		{"a navigation that is a WebSocket", "GET", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document", "Upgrade": "websocket"}, false},
		{"another port of the same sandbox", "GET", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors", "Origin": "https://3000-abc123.sbx.test"}, true},
		{"another port of the same sandbox, by referrer", "GET", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "script", "Referer": "https://3000-abc123.sbx.test/app"}, true},
		{"a WebSocket from another port of the same sandbox", "GET", map[string]string{"Sec-Fetch-Site": "same-site", "Upgrade": "websocket", "Origin": "http://3000-ABC123.sbx.test:8080"}, true},
		{"an unknown value", "GET", map[string]string{"Sec-Fetch-Site": "sideways"}, false},
		{"an old browser, same origin", "POST", map[string]string{"Origin": self}, true},
		{"an old browser, no origin", "POST", nil, true},
		{"an old browser, another sandbox", "POST", map[string]string{"Origin": "https://8000-other1.sbx.test"}, false},
		{"an old browser, an opaque origin", "GET", map[string]string{"Origin": "null", "Upgrade": "websocket"}, false},
		{"an old browser, a look-alike host", "GET", map[string]string{"Origin": "https://8000-abc123.sbx.test.evil.example"}, false},
	} {
		r := httptest.NewRequest(tc.method, "http://8000-abc123.sbx.test/x", nil)
		for k, v := range tc.hdr {
			r.Header.Set(k, v)
		}
		err := s.cookieSite(r, id)
		if (err == nil) != tc.ok {
			t.Errorf("%s: got %v, want allowed %t", tc.name, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "another site") {
			t.Errorf("%s: message %q does not say why", tc.name, err)
		}
	}
}

// TestTTYRoute: the key as a WebSocket subprotocol counts on the terminal's
// route only (issue 31, finding 3).
func TestTTYRoute(t *testing.T) {
	for path, want := range map[string]bool{
		"/v1/sandboxes/abc/processes/12/tty":         true,
		"/v1/sandboxes/abc/processes/12/tty/":        false,
		"/v1/sandboxes/abc/processes/12/output":      false,
		"/v1/sandboxes/abc/ports/9000/ws":            false,
		"/v1/sandboxes/abc/ports/9000/processes/tty": false,
		"/v1/sandboxes/abc":                          false,
		"/v1/sandboxes//processes/12/tty":            false,
		"/v1/sandboxes/abc/processes/12%2Ftty":       false,
		"/p/tok/v1/sandboxes/abc/processes/12/tty":   false,
	} {
		r := httptest.NewRequest("GET", "http://x"+path, nil)
		if got := ttyRoute(r); got != want {
			t.Errorf("GET %s: ttyRoute %t, want %t", path, got, want)
		}
	}
	if ttyRoute(httptest.NewRequest("POST", "http://x/v1/sandboxes/abc/processes/12/tty", nil)) {
		t.Error("POST …/tty: ttyRoute true, want false")
	}
}

// TestGuardHeaders: what the proxy drops from requests to guests and sets
// on their answers.
func TestGuardHeaders(t *testing.T) {
	h := http.Header{}
	h.Add("Sec-WebSocket-Protocol", "chat, bearer.panda_abc, v2")
	h.Add("Sec-WebSocket-Protocol", "Bearer.xyz,panda_key0123456789abcdef")
	dropBearerProtocols(h)
	if got := h.Values("Sec-WebSocket-Protocol"); len(got) != 1 || got[0] != "chat, v2" {
		t.Errorf("Sec-WebSocket-Protocol %q, want [chat, v2]", got)
	}
	h = http.Header{}
	h.Set("Sec-WebSocket-Protocol", "bearer.panda_abc")
	dropBearerProtocols(h)
	if len(h) != 0 {
		t.Errorf("only a key offered: headers %v, want none", h)
	}
	for v, want := range map[string]bool{
		"Bearer panda_abc": true, "panda_abc": true, " token  panda_abc ": true,
		"Basic cGFuZGE6eA==": false, "Bearer their-own": false, "": false,
	} {
		if got := holdsAPIKey(v); got != want {
			t.Errorf("holdsAPIKey(%q) = %t, want %t", v, got, want)
		}
	}

	res := http.Header{}
	res.Set("Content-Security-Policy", "default-src *")
	res.Set("Service-Worker-Allowed", "/")
	res.Set("Clear-Site-Data", `"storage"`)
	res.Set("X-Content-Type-Options", "sniff")
	res.Set("Referrer-Policy", "unsafe-url")
	guardResponse(res, false)
	if got := res.Values("Content-Security-Policy"); len(got) != 2 || got[0] != "default-src *" || got[1] != pathCSP || strings.Contains(pathCSP, "allow-same-origin") {
		t.Errorf("path route: Content-Security-Policy %q, want the guest's and %q", got, pathCSP)
	}
	if res.Get("Service-Worker-Allowed") != "" || res.Get("Clear-Site-Data") != "" ||
		res.Values("X-Content-Type-Options")[0] != "nosniff" || res.Values("Referrer-Policy")[0] != "no-referrer" {
		t.Errorf("path route: headers %v", res)
	}
	res = http.Header{"Service-Worker-Allowed": {"/"}}
	guardResponse(res, true)
	if got := res.Values("Content-Security-Policy"); len(got) != 1 || got[0] != domainCSP || !strings.Contains(domainCSP, "allow-same-origin") {
		t.Errorf("proxy domain: Content-Security-Policy %q, want %q", got, domainCSP)
	}
	if res.Get("Service-Worker-Allowed") != "/" {
		t.Error("proxy domain: the guest's Service-Worker-Allowed was dropped: its scope is its own origin's")
	}
}

// TestRedactingLogger: a signed token, the token parameter and API keys
// never reach the log, in the message, an attribute, an error, a group,
// or attributes given to With (issue 31, finding 12).
func TestRedactingLogger(t *testing.T) {
	const tok = "AQAAAABpK9fkH0AUcm9ha3k2djNnZjl3Z2R6OWNzMzn0XkGyYBwE8Yg6aXUOJ7Dn"
	const key = "panda_0123456789abcdefghij0123456789abcdef"
	for _, format := range []string{"text", "json"} {
		var buf bytes.Buffer
		var h slog.Handler = slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})
		if format == "json" {
			h = slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})
		}
		log := RedactingLogger(slog.New(h))
		if RedactingLogger(log) != log {
			t.Error("a redacting logger is wrapped again")
		}
		log.Warn("request failed: GET /p/"+tok+"/x", "path", "/p/"+tok+"/index.html", "status", 502,
			"err", errors.New("GET /base/p/"+tok+"?panda_token="+tok+"&a=1 with "+key))
		log.With("url", "http://h/p/"+tok).WithGroup("g").Debug("x", slog.Group("inner", "path", "/p/"+tok), "key", key)
		out := buf.String()
		if strings.Contains(out, tok) || strings.Contains(out, key) {
			t.Errorf("%s: the log holds a token or key:\n%s", format, out)
		}
		for _, want := range []string{"/p/[redacted]/x", "/p/[redacted]/index.html", "panda_token=[redacted]&a=1", "panda_[redacted]", "502"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: the log lacks %q:\n%s", format, want, out)
			}
		}
	}
	if got := redactSecrets("/v1/sandboxes/x/ports/8000/ panda_sandboxes_running"); got != "/v1/sandboxes/x/ports/8000/ panda_sandboxes_running" {
		t.Errorf("redacted what holds no secret: %q", got)
	}
}

func TestScopeCookies(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		in     []string
		want   []string
	}{
		{"/p/tok", []string{"a=1; Domain=example.com; Path=/", "b=2", "c=3; Path=/app; HttpOnly; SameSite=Strict", "bad"},
			[]string{"a=1; Path=/p/tok/", "b=2", "c=3; Path=/p/tok/app; HttpOnly; SameSite=Strict"}},
		{"", []string{"a=1; Domain=sandboxes.example.com; Path=/; Secure"}, []string{"a=1; Path=/; Secure"}},
	} {
		h := http.Header{"Set-Cookie": tc.in}
		scopeCookies(h, tc.prefix)
		if got := h.Values("Set-Cookie"); !slices.Equal(got, tc.want) {
			t.Errorf("prefix %q: Set-Cookie %q, want %q", tc.prefix, got, tc.want)
		}
	}
}
