package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// codeBackend is the Backend of the code interpreter's routing tests: it
// records what Proxy was asked, and answers as a guest would, or with
// the error err (as the REST API's Proxy does for a sandbox that is not
// running).
type codeBackend struct {
	fakeBackend
	err     error
	proxied []string // "id:port path"
}

func (b *codeBackend) Proxy(w http.ResponseWriter, r *http.Request, id string, port int) error {
	if b.err != nil {
		return b.err
	}
	b.proxied = append(b.proxied, id+":"+strconv.Itoa(port)+" "+r.URL.Path)
	body, _ := io.ReadAll(r.Body)
	w.WriteHeader(http.StatusOK)
	w.Write(body)
	return nil
}

func TestTrafficAccessToken(t *testing.T) {
	secret := []byte("0123456789abcdef")
	s, err := New(nil, secret, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Pinned apart from the code under test, as AccessToken's is: SDKs
	// hold tokens across server restarts.
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("e2b traffic access token\x00sbx1"))
	if got, want := s.TrafficAccessToken("sbx1"), hex.EncodeToString(m.Sum(nil)); got != want {
		t.Errorf("TrafficAccessToken(sbx1) = %s, want %s", got, want)
	}
	if s.TrafficAccessToken("sbx1") == s.AccessToken("sbx1") || s.TrafficAccessToken("sbx1") == s.TrafficAccessToken("sbx2") {
		t.Error("the traffic token is envd's access token, or another sandbox's")
	}
}

func TestTemplateName(t *testing.T) {
	for in, want := range map[string]string{
		"": "base", "base": "base", "code-interpreter-v1": "code-interpreter", "code-interpreter": "code-interpreter",
		"code-interpreter-v2": "code-interpreter-v2", "mine:3": "mine:3",
	} {
		if got := templateName(in); got != want {
			t.Errorf("templateName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestCodeRoute: a request for the code interpreter (E2b-Sandbox-Port
// 49999 by header, or the host 49999-ID.DOMAIN through ServePort) is
// proxied only with the sandbox's own access or traffic token, and one
// refused is answered without a byte of its body read; envd's port, and
// a request without the port header, stay envd's.
func TestCodeRoute(t *testing.T) {
	b := &codeBackend{fakeBackend: fakeBackend{guest: &fakeGuest{}, slots: 8, upload: 1 << 20}}
	s, err := New(b, []byte("0123456789abcdef"), "sbx.test", nil)
	if err != nil {
		t.Fatal(err)
	}
	access, traffic := s.AccessToken(testSandbox), s.TrafficAccessToken(testSandbox)
	otherAccess, otherTraffic := s.AccessToken("sbx2"), s.TrafficAccessToken("sbx2")
	const apiKey = "panda_0123456789abcdef0123456789abcdef"

	for _, tc := range []struct {
		name string
		hdr  map[string]string
		ok   bool
	}{
		{"access token (/execute)", map[string]string{"X-Access-Token": access}, true},
		{"traffic token (/contexts)", map[string]string{"E2B-Traffic-Access-Token": traffic}, true},
		{"both", map[string]string{"X-Access-Token": access, "E2B-Traffic-Access-Token": traffic}, true},
		{"no token", nil, false},
		{"another sandbox's access token", map[string]string{"X-Access-Token": otherAccess}, false},
		{"another sandbox's traffic token", map[string]string{"E2B-Traffic-Access-Token": otherTraffic}, false},
		{"the tokens swapped", map[string]string{"X-Access-Token": traffic, "E2B-Traffic-Access-Token": access}, false},
		{"a right one and a wrong one", map[string]string{"X-Access-Token": access, "E2B-Traffic-Access-Token": otherTraffic}, false},
		{"an API key as token", map[string]string{"X-Access-Token": apiKey, "E2B-Traffic-Access-Token": apiKey}, false},
		{"an API key", map[string]string{"Authorization": "Bearer " + apiKey, "X-API-Key": apiKey}, false},
		{"empty tokens", map[string]string{"X-Access-Token": "", "E2B-Traffic-Access-Token": ""}, false},
	} {
		for _, route := range []string{"header", "host"} {
			t.Run(tc.name+" by "+route, func(t *testing.T) {
				b.proxied = nil
				body := &countingReader{r: strings.NewReader(`{"code":"1+1"}`)}
				r := httptest.NewRequest("POST", "/execute", body)
				for k, v := range tc.hdr {
					r.Header.Set(k, v)
				}
				w := httptest.NewRecorder()
				if route == "header" {
					r.Header.Set("E2b-Sandbox-Id", testSandbox)
					r.Header.Set("E2b-Sandbox-Port", "49999")
					s.Intercept(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })).ServeHTTP(w, r)
				} else {
					r.Host = "49999-" + testSandbox + ".sbx.test"
					// The host names the sandbox, whatever the header says.
					r.Header.Set("E2b-Sandbox-Id", "sbx2")
					if !s.ServePort(w, r, testSandbox, CodePort) {
						t.Fatal("ServePort did not take port 49999")
					}
				}
				if tc.ok {
					if w.Code != http.StatusOK || len(b.proxied) != 1 || b.proxied[0] != testSandbox+":49999 /execute" || w.Body.String() != `{"code":"1+1"}` {
						t.Errorf("got %d %q, proxied %v; want the request proxied to sbx1:49999", w.Code, w.Body, b.proxied)
					}
					return
				}
				if w.Code != http.StatusUnauthorized || len(b.proxied) != 0 {
					t.Errorf("got %d %q, proxied %v; want 401 and nothing proxied", w.Code, w.Body, b.proxied)
				}
				if n := body.n.Load(); n != 0 {
					t.Errorf("%d bytes of the body read before the refusal", n)
				}
				var e struct {
					Code    int
					Message string
				}
				if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Code != 401 || strings.Contains(e.Message, access) || strings.Contains(e.Message, traffic) {
					t.Errorf("error body %q (%v), want E2B's shape without a token", w.Body, err)
				}
			})
		}
	}

	t.Run("other ports", func(t *testing.T) {
		b.proxied = nil
		// envd's port by header (or none) is envd's: /health answers.
		for _, port := range []string{"49983", ""} {
			r := envdRequest("GET", "/health", "", access, nil)
			r.Header.Set("E2b-Sandbox-Port", port)
			if w := serve(s, r); w.Code != http.StatusNoContent {
				t.Errorf("envd /health with E2b-Sandbox-Port %q: %d %s", port, w.Code, w.Body)
			}
		}
		// envd by host: the host's sandbox, not the header's.
		r := envdRequest("GET", "/health", "", access, nil)
		r.Header.Set("E2b-Sandbox-Id", "sbx2")
		w := httptest.NewRecorder()
		if !s.ServePort(w, r, testSandbox, EnvdPort) || (w.Code != http.StatusNoContent) {
			t.Errorf("envd by host with sbx1's token: %d %s", w.Code, w.Body)
		}
		w = httptest.NewRecorder()
		if !s.ServePort(w, envdRequest("GET", "/health", "", access, nil), "sbx2", EnvdPort) || w.Code != http.StatusUnauthorized {
			t.Errorf("envd by host of sbx2 with sbx1's token: %d %s, want 401", w.Code, w.Body)
		}
		// The traffic token is no envd credential.
		r = envdRequest("GET", "/health", "", "", nil)
		r.Header.Set("E2B-Traffic-Access-Token", traffic)
		if w := serve(s, r); w.Code != http.StatusUnauthorized {
			t.Errorf("envd with the traffic token: %d %s, want 401", w.Code, w.Body)
		}
		if s.ServePort(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil), testSandbox, 8080) {
			t.Error("ServePort took port 8080, which is the port proxy's")
		}
		if len(b.proxied) != 0 {
			t.Errorf("proxied %v", b.proxied)
		}
	})

	t.Run("not running", func(t *testing.T) {
		b.err = errStatus(http.StatusConflict, "sandbox sbx1 is stopped, not running")
		defer func() { b.err = nil }()
		r := httptest.NewRequest("GET", "/contexts", nil)
		r.Header.Set("E2b-Sandbox-Id", testSandbox)
		r.Header.Set("E2b-Sandbox-Port", "49999")
		r.Header.Set("E2B-Traffic-Access-Token", traffic)
		// 502, as E2B's proxy answers: the SDK's TimeoutError.
		if w := serve(s, r); w.Code != http.StatusBadGateway || !strings.Contains(w.Body.String(), "not running") {
			t.Errorf("got %d %s, want 502 not running", w.Code, w.Body)
		}
	})
}

// TestTokensAnswered: create, connect and fork answer both tokens, get
// the traffic token only, list neither.
func TestTokensAnswered(t *testing.T) {
	s, err := New(nil, []byte("0123456789abcdef"), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	sb := Sandbox{ID: "sbx1", State: "running"}
	for _, tc := range []struct {
		view             tokenView
		envd, trafficTok bool
	}{{noTokens, false, false}, {trafficToken, false, true}, {allTokens, true, true}} {
		j := s.toJSON(sb, tc.view)
		if (j.EnvdAccessToken == s.AccessToken("sbx1")) != tc.envd || (j.EnvdAccessToken != "") != tc.envd {
			t.Errorf("view %d: envdAccessToken %q", tc.view, j.EnvdAccessToken)
		}
		if got := j.TrafficAccessToken != nil && *j.TrafficAccessToken == s.TrafficAccessToken("sbx1"); got != tc.trafficTok || (j.TrafficAccessToken != nil) != tc.trafficTok {
			t.Errorf("view %d: trafficAccessToken %v", tc.view, j.TrafficAccessToken)
		}
	}
}
