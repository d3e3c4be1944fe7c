package console

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestHandler checks what every answer carries (the CSP, nosniff, COOP,
// no frames, no referrer), the page, the cache policy of assets and the
// redirects of other paths. It runs against the embedded bundle when
// `make build` made one, and against the "not built" page otherwise.
func TestHandler(t *testing.T) {
	h := Handler()
	get := func(method, path string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, path, nil))
		if got := w.Header().Get("Content-Security-Policy"); !strings.Contains(got, "script-src 'self'") || strings.Contains(got, "unsafe-eval") {
			t.Errorf("%s %s: Content-Security-Policy %q", method, path, got)
		}
		for h, want := range map[string]string{
			"X-Content-Type-Options":       "nosniff",
			"X-Frame-Options":              "DENY",
			"Referrer-Policy":              "no-referrer",
			"Cross-Origin-Opener-Policy":   "same-origin",
			"Cross-Origin-Resource-Policy": "same-origin",
		} {
			if got := w.Header().Get(h); got != want {
				t.Errorf("%s %s: %s %q, want %q", method, path, h, got, want)
			}
		}
		return w
	}
	page := get("GET", "/")
	body := page.Body.String()
	if _, err := dist.ReadFile("dist/index.html"); err != nil {
		if page.Code != http.StatusServiceUnavailable || !strings.Contains(body, "make build") {
			t.Fatalf("GET / without a bundle: %d %q, want 503 saying to run make build", page.Code, body)
		}
		return
	}
	if page.Code != 200 || !strings.Contains(body, `<script type="module" src="console/main-`) || strings.Contains(body, "<script>") {
		t.Fatalf("GET /: %d %q", page.Code, body)
	}
	if got := page.Header().Get("Cache-Control"); got != "no-cache" {
		t.Errorf("GET /: Cache-Control %q, want no-cache", got)
	}
	i := strings.Index(body, "console/main-")
	asset := "/" + body[i:i+strings.Index(body[i:], `"`)]
	a := get("GET", asset)
	if a.Code != 200 || !strings.HasPrefix(a.Header().Get("Content-Type"), "text/javascript") || !strings.Contains(a.Header().Get("Cache-Control"), "immutable") {
		t.Errorf("GET %s: %d, Content-Type %q, Cache-Control %q", asset, a.Code, a.Header().Get("Content-Type"), a.Header().Get("Cache-Control"))
	}
	for _, tc := range []struct {
		path string
		code int
		loc  string
	}{
		{"/console/nope-1234.js", 404, ""},
		{"/console/README.md", 302, "../"},
		{"/console/", 302, "../"},
		{"/console/sandboxes/x", 302, "../../"},
	} {
		w := get("GET", tc.path)
		if w.Code != tc.code || w.Header().Get("Location") != tc.loc {
			t.Errorf("GET %s: %d Location %q, want %d %q", tc.path, w.Code, w.Header().Get("Location"), tc.code, tc.loc)
		}
	}
	if w := get("POST", "/"); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %d, want 405", w.Code)
	}
}
