package main

// The security regression suite: each TestSecurity… test replays one
// attack of a security review black-box against a real `panda up` and
// fails if the attack works (docs/security.md, "Threat model", names the
// test that holds each boundary). They share one server, secWorld: `panda
// up` with networking on, in a test world of its own (nettest) whose only
// "internet" is a second test-made namespace, the tiny template, the admin
// key and two tenant keys, alice and bob. The world is started by the
// first test that asks for it and removed after the last test of the
// binary (TestMain).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/nettest"
	"github.com/pandastack/pandastack/internal/testing/pandatest"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// secWorld is the server the security tests attack.
type secWorld struct {
	*netServer
	// Alice and Bob are the secrets of two tenant (non-admin) keys;
	// AliceID and BobID their key ids.
	Alice, Bob     string
	AliceID, BobID string
}

// secShared is the one secWorld of this test binary.
var secShared struct {
	once sync.Once
	w    *secWorld
	env  *nettest.Env
	err  error
}

// security returns the shared secWorld, starting it on the first call. A
// failure to start fails every test that asks.
func security(t *testing.T) *secWorld {
	t.Helper()
	e2e(t)
	secShared.once.Do(func() { secShared.w, secShared.err = startSecWorld() })
	if secShared.err != nil {
		t.Fatalf("security world: %v", secShared.err)
	}
	return secShared.w
}

func startSecWorld() (_ *secWorld, err error) {
	env, err := nettest.Build()
	if err != nil {
		return nil, err
	}
	secShared.env = env // closed by closeSecWorld, after the server stopped
	prefix := "p" + strings.TrimPrefix(env.Prefix, "nt")
	opts := upOptions("", "", "--network", "on", "--network-prefix", prefix,
		"--dns-upstream", nettest.DNSAddr.String())
	opts.NetNS = env.Host.Path
	s, err := pandatest.Start(opts)
	if err != nil {
		return nil, err
	}
	hc, err := s.HTTPClient()
	if err != nil {
		return nil, err
	}
	c, err := pandastack.NewClient(pandastack.Options{APIURL: s.URL(), APIKey: s.AdminKey(), HTTPClient: hc})
	if err != nil {
		return nil, err
	}
	w := &secWorld{netServer: &netServer{proc: &proc{Server: s, name: "security"}, env: env, prefix: prefix, hc: hc, c: c}}
	for _, k := range []struct {
		name       string
		secret, id *string
	}{{"alice", &w.Alice, &w.AliceID}, {"bob", &w.Bob, &w.BobID}} {
		*k.secret, *k.id, err = w.newKey(k.name)
		if err != nil {
			return nil, err
		}
	}
	return w, nil
}

// closeSecWorld removes the shared world's namespaces; TestMain calls it
// after pandatest.Main stopped the world's server.
func closeSecWorld() {
	if secShared.env != nil {
		secShared.env.Close()
	}
}

// newKey makes a tenant key with the admin key and returns its secret and
// id.
func (w *secWorld) newKey(name string) (secret, id string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, b, err := w.do(ctx, w.AdminKey(), "POST", "/v1/keys", map[string]any{"name": name}, nil)
	if err != nil {
		return "", "", err
	}
	if code != http.StatusCreated && code != http.StatusOK {
		return "", "", fmt.Errorf("create key %s: %d %s", name, code, b)
	}
	var k struct{ ID, Key string }
	if err := json.Unmarshal(b, &k); err != nil || k.Key == "" {
		return "", "", fmt.Errorf("create key %s: %q: %v", name, b, err)
	}
	return k.Key, k.ID, nil
}

// do sends a request to the API as key ("": none) with a JSON body (nil:
// none; an io.Reader or []byte: sent as it is) and more headers, and
// returns the status and the body (the first 1 MiB).
func (w *secWorld) do(ctx context.Context, key, method, path string, body any, hdr http.Header) (int, []byte, error) {
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case io.Reader:
		r = b
	case []byte:
		r = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		r = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, w.URL()+path, r)
	if err != nil {
		return 0, nil, err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	resp, err := w.hc.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, b, nil
}

// mustDo is do that fails the test on a transport error.
func (w *secWorld) mustDo(t *testing.T, ctx context.Context, key, method, path string, body any, hdr http.Header) (int, []byte) {
	t.Helper()
	code, b, err := w.do(ctx, key, method, path, body, hdr)
	if err != nil {
		t.Fatal(err)
	}
	return code, b
}

// client is a Go SDK client of the world's API as key.
func (w *secWorld) client(t *testing.T, key string) *pandastack.Client {
	t.Helper()
	c, err := pandastack.NewClient(pandastack.Options{APIURL: w.URL(), APIKey: key, HTTPClient: w.hc})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sandbox creates a sandbox of key's (tiny, networking on, a TTL of ten
// minutes) and kills it when the test ends.
func (w *secWorld) sandbox(t *testing.T, ctx context.Context, key string) *pandastack.Sandbox {
	t.Helper()
	c := w.client(t, key)
	sb, err := c.Create(ctx, pandastack.CreateOptions{TTLSeconds: 600})
	if err != nil {
		t.Fatalf("create a sandbox: %v", err)
	}
	t.Cleanup(func() {
		kctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := sb.Kill(kctx); err != nil {
			t.Errorf("kill %s: %v", sb.ID, err)
		}
	})
	return sb
}

// TestSecurityWorld checks the world itself: the tenants are tenants
// (not admins) and neither sees the other's sandbox.
func TestSecurityWorld(t *testing.T) {
	w := security(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb := w.sandbox(t, ctx, w.Alice)
	if code, b := w.mustDo(t, ctx, w.Bob, "GET", "/v1/sandboxes/"+sb.ID, nil, nil); code != http.StatusNotFound {
		t.Errorf("bob GET alice's sandbox: %d %s, want 404", code, b)
	}
	if code, b := w.mustDo(t, ctx, w.Alice, "GET", "/v1/keys", nil, nil); code != http.StatusForbidden {
		t.Errorf("alice GET /v1/keys: %d %s, want 403", code, b)
	}
}
