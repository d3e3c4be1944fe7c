package main

// The security regression suite's attacks whose path differs when the
// control plane (`panda server`) and the host (`panda agent`) are two
// processes: template builds run on the agent, so the registry pull that
// must not reach the host's own services is the agent's, and a revoked
// key's build is cancelled across the host API.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// hostTrap is a trap (security_templates_test.go) listening on addr in
// the test's own network namespace.
func hostTrap(t *testing.T, addr string) *trap {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	tr := &trap{addr: l.Addr().String()}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			rw.WriteHeader(http.StatusTeapot)
			fmt.Fprint(rw, trapSecret)
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				tr.conns.Add(1)
			}
		},
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return tr
}

// TestSecuritySplit replays, against `panda server` driving `panda agent`,
// the attacks of issue 31 whose path crosses the host API: a build from a
// registry on the agent's loopback (finding 6) and a running build of a
// key that is revoked (finding 12).
func TestSecuritySplit(t *testing.T) {
	e2e(t)
	agentDir, serverDir := newDataDir(t), newDataDir(t)
	ag := start(t, "agent", agentOptions(agentDir, ""))
	sv := start(t, "server", serverOptions(serverDir, ag.URL(),
		"--agent-token-file", filepath.Join(agentDir, "agent.token"), "--agent-ca-file", filepath.Join(agentDir, "agent-ca.pem")))
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	admin := sv.client(t)
	newTenant := func(name string) (*pandastack.Client, pandastack.KeyWithSecret) {
		t.Helper()
		k, err := admin.CreateKey(ctx, name, false, pandastack.Quotas{})
		if err != nil {
			t.Fatal(err)
		}
		c, err := pandastack.NewClient(pandastack.Options{APIURL: sv.URL(), APIKey: k.Key})
		if err != nil {
			t.Fatal(err)
		}
		return c, k
	}

	t.Run("registry on the agent's loopback", func(t *testing.T) {
		alice, _ := newTenant("alice")
		tr := hostTrap(t, "127.0.0.1:0")
		ref := tr.addr + "/x:1"
		b, err := alice.BuildTemplate(ctx, "split-ssrf", ref, nil)
		var pe *pandastack.Error
		if !errors.As(err, &pe) || b.Status != pandastack.BuildFailed {
			t.Fatalf("build from %s: %+v, %v; want it failed", ref, b, err)
		}
		if !strings.Contains(pe.Message, "refused") || !strings.Contains(pe.Message, "loopback") {
			t.Errorf("build from %s: %q, want it refused as loopback", ref, pe.Message)
		}
		if shown := pe.Message + "\n" + b.Error; strings.Contains(shown, trapSecret) || strings.Contains(shown, "teapot") {
			t.Errorf("build from %s shows what the service there answered: %s", ref, shown)
		}
		if n := tr.conns.Load(); n != 0 {
			t.Errorf("build from %s: the agent connected there %d times", ref, n)
		}
	})

	t.Run("a revoked key's build on the agent", func(t *testing.T) {
		mallory, k := newTenant("mallory")
		b, err := mallory.StartDockerfileBuild(ctx, "split-revoked", "FROM tiny\nRUN sleep 600\n", t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		for b.Status != pandastack.BuildRunning {
			if b.Status == pandastack.BuildFailed || b.Status == pandastack.BuildSucceeded {
				t.Fatalf("mallory's build before the revoke: %+v", b)
			}
			select {
			case <-ctx.Done():
				t.Fatalf("mallory's build is still %s", b.Status)
			case <-time.After(100 * time.Millisecond): // polling the build's state
			}
			if b, err = admin.TemplateBuild(ctx, b.ID); err != nil {
				t.Fatal(err)
			}
		}
		if err := admin.RevokeKey(ctx, k.ID); err != nil {
			t.Fatal(err)
		}
		for b.Status == pandastack.BuildRunning || b.Status == pandastack.BuildQueued {
			select {
			case <-ctx.Done():
				t.Fatalf("mallory's build is still %s after the revoke", b.Status)
			case <-time.After(100 * time.Millisecond): // polling the build's state
			}
			if b, err = admin.TemplateBuild(ctx, b.ID); err != nil {
				t.Fatal(err)
			}
		}
		if b.Status != pandastack.BuildFailed || b.Code != "canceled" || !strings.Contains(b.Error, "revoked") {
			t.Errorf("mallory's build after the revoke: %s %s %q, want failed canceled, its key revoked", b.Status, b.Code, b.Error)
		}
		if _, err := admin.PurgeKey(ctx, k.ID); err != nil {
			t.Errorf("purge mallory: %v", err)
		}
	})
	mustStop(t, sv)
	stopAgentClean(t, ag, agentDir)
}
