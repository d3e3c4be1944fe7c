package main

// The port proxy on servers without sandbox networking (--network off,
// the test worlds' default), black-box: the guest agent carries the
// proxy's connections to the guest's loopback, with `panda up` and with
// `panda server` + `panda agent` (whose host API's dial goes the same
// way).

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// TestPortProxyNetworkOff: `panda up --network off` serves a sandbox's
// port through the API.
func TestPortProxyNetworkOff(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	s := startServer(t, "server", dir)
	portProxyServes(t, ctx, s)
	mustStop(t, s)
}

// TestSplitPortProxyNetworkOff: the same through `panda server` and a
// `panda agent` with --network off.
func TestSplitPortProxyNetworkOff(t *testing.T) {
	e2e(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	ag := start(t, "agent", agentOptions(dir, ""))
	sv := start(t, "server", serverOptions(dir, ag.URL()))
	portProxyServes(t, ctx, sv)
	mustStop(t, sv)
	stopAgentClean(t, ag, dir)
}

// portProxyServes creates a sandbox on s whose busybox httpd listens on
// the guest's 127.0.0.1:8000 only, and fetches a page and 2 MiB from it
// through the port proxy, with the key and with a signed URL; a port
// nothing listens on is 502.
func portProxyServes(t *testing.T, ctx context.Context, s *proc) {
	t.Helper()
	sb := mustCreate(t, ctx, s.client(t))
	sum := mustExec(t, ctx, sb, "mkdir -p /tmp/www && echo served-without-a-network > /tmp/www/index.html && "+
		"head -c 2097152 /dev/urandom > /tmp/www/big && sha256sum /tmp/www/big")
	want, _, _ := strings.Cut(sum, " ")
	mustExec(t, ctx, sb, "busybox httpd -p 127.0.0.1:8000 -h /tmp/www")

	hc := &http.Client{Timeout: time.Minute}
	get := func(url string, key bool) (int, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if key {
			req.Header.Set("Authorization", "Bearer "+s.AdminKey())
		}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatalf("GET %s: read the body: %v", url, err)
		}
		return res.StatusCode, b
	}
	base := fmt.Sprintf("%s/v1/sandboxes/%s/ports/", s.URL(), sb.ID)
	var code int
	var body []byte
	// httpd daemonizes: until it listens the proxy says nothing does.
	testkit.WaitForf(t, time.Minute, func() string { return fmt.Sprintf("the page through the port proxy (last: %d %s)", code, body) }, func() bool {
		code, body = get(base+"8000/index.html", true)
		return code != http.StatusBadGateway
	})
	if code != http.StatusOK || string(body) != "served-without-a-network\n" {
		t.Errorf("GET …/ports/8000/index.html: %d %q, want the page", code, body)
	}
	code, body = get(base+"8000/big", true)
	if got := fmt.Sprintf("%x", sha256.Sum256(body)); code != http.StatusOK || got != want {
		t.Errorf("GET …/ports/8000/big: %d, %d bytes of sha256 %s; want 2 MiB of sha256 %s", code, len(body), got, want)
	}
	code, body = get(base+"8001/", true)
	var e struct {
		Error struct{ Code, Message string }
	}
	json.Unmarshal(body, &e)
	if code != http.StatusBadGateway || e.Error.Code != "bad_gateway" || !strings.Contains(e.Error.Message, "nothing listens on port 8001") {
		t.Errorf("GET …/ports/8001/ (nothing listens): %d %s, want 502 bad_gateway saying nothing listens", code, body)
	}

	req, _ := http.NewRequestWithContext(ctx, "POST", base+"8000/url", strings.NewReader(`{"ttl_seconds": 600}`))
	req.Header.Set("Authorization", "Bearer "+s.AdminKey())
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var signed struct{ URL string }
	json.NewDecoder(res.Body).Decode(&signed)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || signed.URL == "" {
		t.Fatalf("sign a URL of port 8000: %d %+v", res.StatusCode, signed)
	}
	if code, body := get(signed.URL+"index.html", false); code != http.StatusOK || string(body) != "served-without-a-network\n" {
		t.Errorf("GET the signed URL without a key: %d %q, want the page", code, body)
	}
}
