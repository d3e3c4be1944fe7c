package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/nettest"
)

// TestNetworkE2BGetHost: with a proxy domain, E2B's create answers it as
// the sandbox's domain, and the host the e2b SDK's getHost(port) builds
// from it (PORT-ID.DOMAIN) reaches a server in the sandbox through the
// port proxy, as a client behind wildcard DNS would (the request goes to
// the server's address with that Host), with the API key and not without.
func TestNetworkE2BGetHost(t *testing.T) {
	e2e(t)
	env := nettest.NewEnv(t)
	dir := newDataDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const domain = "e2b.test"
	s := startNetServer(t, dir, env, "--proxy-domain", domain)

	e2bCall := func(method, path, body string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, method, s.URL()+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-KEY", s.AdminKey())
		req.Header.Set("Content-Type", "application/json")
		resp, err := s.hc.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	code, b := e2bCall("POST", "/v2/sandboxes", `{"templateID":"base","timeout":600}`)
	if code != http.StatusCreated {
		t.Fatalf("POST /v2/sandboxes: %d %s", code, b)
	}
	var created struct {
		SandboxID string  `json:"sandboxID"`
		Domain    *string `json:"domain"`
	}
	if err := json.Unmarshal(b, &created); err != nil {
		t.Fatalf("create answered %s: %v", b, err)
	}
	defer e2bCall("DELETE", "/sandboxes/"+created.SandboxID, "")
	if created.Domain == nil || *created.Domain != domain {
		t.Fatalf("create: domain %v, want %q (%s)", created.Domain, domain, b)
	}

	sb := s.c.Sandbox(created.SandboxID)
	const port = 8000
	mustExec(t, ctx, sb, "mkdir -p /tmp/www && echo served-in-the-sandbox > /tmp/www/index.html")
	startInGuest(t, ctx, sb, fmt.Sprintf("exec python3 -m http.server %d --directory /tmp/www", port), port)

	// The SDK's getHost(port): `${port}-${sandboxID}.${domain}`.
	host := fmt.Sprintf("%d-%s.%s", port, created.SandboxID, *created.Domain)
	fetch := func(key string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, "GET", s.URL()+"/index.html", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := s.hc.Do(req)
		if err != nil {
			t.Fatalf("GET http://%s/index.html: %v", host, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := fetch(s.AdminKey()); code != http.StatusOK || body != "served-in-the-sandbox\n" {
		t.Errorf("GET http://%s/index.html with the key: %d %q, want 200 %q", host, code, body, "served-in-the-sandbox\n")
	}
	if code, body := fetch(""); code != http.StatusUnauthorized {
		t.Errorf("GET http://%s/index.html without a key: %d %q, want 401", host, code, body)
	}
}
