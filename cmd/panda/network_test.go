package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/nettest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	pandastack "github.com/pandastack/pandastack/sdk/go"
	"golang.org/x/sys/unix"
)

// netServer is `panda up` with networking on, in the host namespace of a
// test world (nettest.Env) whose only internet is the test's own
// namespace: no sandbox of the test can reach the machine's uplink.
type netServer struct {
	*proc
	env    *nettest.Env
	prefix string // of the server's namespaces and veths
	hc     *http.Client
	c      *pandastack.Client
}

func startNetServer(t *testing.T, dataDir string, env *nettest.Env, extra ...string) *netServer {
	t.Helper()
	prefix := "p" + strings.TrimPrefix(env.Prefix, "nt") // unique per test world
	args := append([]string{"--network", "on", "--network-prefix", prefix,
		"--dns-upstream", nettest.DNSAddr.String()}, extra...)
	opts := upOptions(dataDir, "", args...)
	opts.NetNS = env.Host.Path
	p := start(t, "up", opts)
	hc, err := p.HTTPClient()
	if err != nil {
		t.Fatal(err)
	}
	c, err := pandastack.NewClient(pandastack.Options{APIURL: p.URL(), APIKey: p.AdminKey(), HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	return &netServer{proc: p, env: env, prefix: prefix, hc: hc, c: c}
}

// call sends a JSON request to the API and returns the status and body.
func (s *netServer) call(t *testing.T, ctx context.Context, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.URL()+path, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.AdminKey())
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// create makes a sandbox with the network policy given (nil: the default).
func (s *netServer) create(t *testing.T, ctx context.Context, policy map[string]any) *pandastack.Sandbox {
	t.Helper()
	body := map[string]any{"ttl_seconds": 1800}
	if policy != nil {
		body["network"] = policy
	}
	code, b := s.call(t, ctx, "POST", "/v1/sandboxes", body)
	if code != http.StatusCreated && code != http.StatusOK {
		t.Fatalf("create with network %v: %d %s", policy, code, b)
	}
	var info struct{ ID string }
	json.Unmarshal(b, &info)
	sb, err := s.c.Get(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// fetch runs wget in sb and reports what it got, or "" if it failed.
func fetch(t *testing.T, ctx context.Context, sb *pandastack.Sandbox, url string) string {
	t.Helper()
	// Not wget -T: it crashes in busybox 1.35.
	r, err := sb.Exec(ctx, pandastack.Command{Cmd: "timeout 5 wget -q -O - " + url})
	if err != nil {
		t.Fatalf("exec wget %s in %s: %v", url, sb.ID, err)
	}
	if r.ExitCode != 0 {
		t.Logf("%s: wget %s: exit %d: %s", sb.ID, url, r.ExitCode, strings.TrimSpace(r.Stderr))
		return ""
	}
	return r.Stdout
}

func wantReach(t *testing.T, ctx context.Context, sb *pandastack.Sandbox, url, want string) {
	t.Helper()
	if got := fetch(t, ctx, sb, url); got != want {
		t.Errorf("%s: GET %s: got %q, want %q", sb.ID, url, got, want)
	}
}

func wantBlocked(t *testing.T, ctx context.Context, sb *pandastack.Sandbox, url string) {
	t.Helper()
	if got := fetch(t, ctx, sb, url); got != "" {
		t.Errorf("%s: GET %s: got %q, want it blocked", sb.ID, url, got)
	}
}

// netLeftovers lists what of the server's networking is left: namespaces
// of its prefix and veths in the test's host namespace.
func netLeftovers(t *testing.T, s *netServer) []string {
	t.Helper()
	var left []string
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), s.prefix+"-") {
			left = append(left, "namespace "+e.Name())
		}
	}
	out, err := exec.Command("ip", "-n", s.env.Host.Name, "-o", "link", "show").CombinedOutput()
	if err != nil {
		t.Fatalf("ip link in the test's host namespace: %v: %s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], s.prefix) {
			left = append(left, "veth "+strings.TrimSuffix(f[1], ":"))
		}
	}
	return left
}

// TestNetworkEndToEnd: sandboxes of `panda up` reach the (test's)
// internet by name, never the host, other sandboxes, link-local or the
// host's private networks; policies at create and PATCH are enforced; a
// bad entry is a 400 naming it; ports are served through the API; a fork
// child and a resumed sandbox are online with the same address; nothing
// is left when the server stops.
func TestNetworkEndToEnd(t *testing.T) {
	e2e(t)
	env := nettest.NewEnv(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	s := startNetServer(t, dir, env)

	web := fmt.Sprintf("hello from %s", nettest.WebAddr)
	a := s.create(t, ctx, nil)
	t.Run("default", func(t *testing.T) {
		wantReach(t, ctx, a, "http://allowed.test/", web)
		wantReach(t, ctx, a, "http://"+nettest.OtherAddr.String()+"/", "hello from "+nettest.OtherAddr.String())
		if out := mustExec(t, ctx, a, "cat /etc/resolv.conf"); !strings.Contains(out, "nameserver 100.96.0.1") {
			t.Errorf("resolv.conf:\n%s", out)
		}
		for _, blocked := range []string{
			nettest.HostUplinkAddr.String(),  // the host itself
			nettest.HostPrivateAddr.String(), // a private network of the host
			nettest.MetadataAddr.String(),    // link-local (cloud metadata)
			nettest.PrivateNetAddr.String(),  // a private network beyond the host
			"10.234.0.1",                     // a veth of the pool: other sandboxes and the host
		} {
			wantBlocked(t, ctx, a, "http://"+blocked+"/")
		}
		wantBlocked(t, ctx, a, "http://metadata.test/")
	})

	b := s.create(t, ctx, map[string]any{"internet": false, "allow_out": []string{"allowed.test"}})
	t.Run("allow list", func(t *testing.T) {
		wantReach(t, ctx, b, "http://allowed.test/", web)
		wantBlocked(t, ctx, b, "http://other.test/")
		wantBlocked(t, ctx, b, "http://"+nettest.OtherAddr.String()+"/")
	})
	t.Run("patch", func(t *testing.T) {
		code, body := s.call(t, ctx, "PATCH", "/v1/sandboxes/"+b.ID+"/network",
			map[string]any{"internet": true, "allow_out": []string{}, "deny_out": []string{"denied.test"}})
		if code != http.StatusOK {
			t.Fatalf("PATCH network: %d %s", code, body)
		}
		if !strings.Contains(string(body), `"deny_out":["denied.test"]`) || strings.Contains(string(body), "network_off") {
			t.Errorf("PATCH network answered %s, want the new policy and no network_off (this host has networking)", body)
		}
		wantReach(t, ctx, b, "http://other.test/", "hello from "+nettest.OtherAddr.String())
		wantBlocked(t, ctx, b, "http://denied.test/")
	})
	t.Run("bad entry", func(t *testing.T) {
		code, body := s.call(t, ctx, "POST", "/v1/sandboxes", map[string]any{"network": map[string]any{"allow_out": []string{"10.0.0.0/33"}}})
		if code != http.StatusBadRequest || !strings.Contains(string(body), "10.0.0.0/33") {
			t.Errorf("create with a bad entry: %d %s, want 400 naming it", code, body)
		}
		code, body = s.call(t, ctx, "PATCH", "/v1/sandboxes/"+b.ID+"/network", map[string]any{"deny_out": []string{"exa mple.com"}})
		if code != http.StatusBadRequest || !strings.Contains(string(body), "exa mple.com") {
			t.Errorf("PATCH with a bad entry: %d %s, want 400 naming it", code, body)
		}
	})

	t.Run("port", func(t *testing.T) {
		mustExec(t, ctx, a, "mkdir -p /tmp/www && echo served-from-the-sandbox > /tmp/www/index.html && busybox httpd -p 8000 -h /tmp/www")
		code, body := s.call(t, ctx, "GET", "/v1/sandboxes/"+a.ID+"/ports/8000/index.html", nil)
		if code != http.StatusOK || string(body) != "served-from-the-sandbox\n" {
			t.Errorf("GET through the port proxy: %d %q", code, body)
		}
	})

	t.Run("fork and resume", func(t *testing.T) {
		kids, err := a.Fork(ctx, 2)
		if err != nil {
			t.Fatalf("fork: %v", err)
		}
		for _, k := range kids {
			wantReach(t, ctx, k, "http://allowed.test/", web)
			if out := mustExec(t, ctx, k, "ip -4 -o addr show eth0 2>/dev/null || ifconfig eth0"); !strings.Contains(out, "100.96.0.2") {
				t.Errorf("fork child %s: eth0: %s", k.ID, out)
			}
			// The parent's server was forked too: each child serves its own.
			code, body := s.call(t, ctx, "GET", "/v1/sandboxes/"+k.ID+"/ports/8000/index.html", nil)
			if code != http.StatusOK || string(body) != "served-from-the-sandbox\n" {
				t.Errorf("fork child %s: GET through the port proxy: %d %q", k.ID, code, body)
			}
		}
		if err := b.Pause(ctx); err != nil {
			t.Fatalf("pause: %v", err)
		}
		if err := b.Resume(ctx); err != nil {
			t.Fatalf("resume: %v", err)
		}
		// The policy set by PATCH holds in the new namespace.
		wantReach(t, ctx, b, "http://other.test/", "hello from "+nettest.OtherAddr.String())
		wantBlocked(t, ctx, b, "http://denied.test/")
	})

	if !mustStop(t, s.proc) {
		return
	}
	if left := netLeftovers(t, s); len(left) > 0 {
		t.Errorf("left after the server stopped: %v", left)
	}
}

// TestNetworkSurvivesACrash: the server is SIGKILLed; the next start
// adopts the running sandbox with its namespace (it is still online and
// under its policy) and removes the namespace of one that died meanwhile.
func TestNetworkSurvivesACrash(t *testing.T) {
	e2e(t)
	env := nettest.NewEnv(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	s := startNetServer(t, dir, env, "--network-pool-size", "-1")
	a := s.create(t, ctx, map[string]any{"deny_out": []string{"denied.test"}})
	b := s.create(t, ctx, nil)
	wantReach(t, ctx, a, "http://allowed.test/", "hello from "+nettest.WebAddr.String())
	bPID := vmmPID(t, dir, b.ID)
	s.Kill()
	if err := unix.Kill(bPID, unix.SIGKILL); err != nil {
		t.Fatalf("kill VMM %d: %v", bPID, err)
	}
	if !testkit.WaitGone(bPID, 10*time.Second) {
		t.Fatalf("VMM %d still alive 10 s after SIGKILL", bPID)
	}

	s2 := startNetServer(t, dir, env, "--network-pool-size", "-1")
	a2, err := s2.c.Get(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	wantReach(t, ctx, a2, "http://allowed.test/", "hello from "+nettest.WebAddr.String())
	wantBlocked(t, ctx, a2, "http://denied.test/")
	if st := mustGet(t, ctx, s2.c, b.ID).State; st != pandastack.StateStopped {
		t.Errorf("sandbox whose VMM died: %s, want stopped", st)
	}
	// One namespace and veth: a's.
	if left := netLeftovers(t, s2); len(left) != 2 {
		t.Errorf("after the restart: %v, want a's namespace and veth only", left)
	}
	if !mustStop(t, s2.proc) {
		return
	}
	if left := netLeftovers(t, s2); len(left) > 0 {
		t.Errorf("left after the server stopped: %v", left)
	}
}
