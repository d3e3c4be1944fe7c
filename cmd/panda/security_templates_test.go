package main

// Security regression tests of user templates (issue 31, findings 4–6),
// against the shared world (security_test.go): publishing grants one
// version, not whatever the owner builds next; the Dockerfile layer cache
// is per key; image pulls never reach the server's loopback or private
// networks, and say nothing of what answered there.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/nettest"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// deleteTemplateAtEnd removes template name (every version) when the test
// ends, with the admin key, whatever made it.
func (w *secWorld) deleteTemplateAtEnd(t *testing.T, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := w.client(t, w.AdminKey()).DeleteTemplate(ctx, name, true)
		if err != nil && !errors.Is(err, pandastack.ErrNotFound) {
			t.Errorf("delete template %s: %v", name, err)
		}
	})
}

// createFrom creates a sandbox of key's from template ref, killed when the
// test ends.
func (w *secWorld) createFrom(t *testing.T, ctx context.Context, key, ref string) (*pandastack.Sandbox, error) {
	t.Helper()
	sb, err := w.client(t, key).Create(ctx, pandastack.CreateOptions{Template: ref, TTLSeconds: 600})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		kctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := sb.Kill(kctx); err != nil {
			t.Errorf("kill %s: %v", sb.ID, err)
		}
	})
	return sb, nil
}

// TestSecurityTemplatePublishVersions replays finding 4: alice's template
// t is published, bob uses it; alice rebuilds t with other contents. Bob's
// new sandboxes of t must still be version 1, and t:2 must not exist for
// him, until an admin publishes it.
func TestSecurityTemplatePublishVersions(t *testing.T) {
	w := security(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const name = "sec-pub"
	w.deleteTemplateAtEnd(t, name)
	alice := w.client(t, w.Alice)
	// No RUN step: no build VM, the builds cost a copy of tiny.
	build := func(which string, version int) {
		t.Helper()
		b, err := alice.BuildTemplateFromDockerfile(ctx, name, "FROM tiny\nENV WHICH="+which+"\n", "", nil)
		if err != nil || b.Version != version {
			t.Fatalf("alice builds %s (%s): %+v, %v; want version %d", name, which, b, err, version)
		}
	}
	which := func(sb *pandastack.Sandbox) string {
		t.Helper()
		return strings.TrimSpace(mustExec(t, ctx, sb, "echo $WHICH"))
	}

	build("v1", 1)
	if code, b := w.mustDo(t, ctx, w.AdminKey(), "POST", "/v1/templates/"+name+"/publish", nil, nil); code != http.StatusOK {
		t.Fatalf("the admin publishes %s: %d %s", name, code, b)
	}
	sb1, err := w.createFrom(t, ctx, w.Bob, name)
	if err != nil {
		t.Fatalf("bob creates from the published %s: %v", name, err)
	}
	if got := which(sb1); got != "v1" || sb1.Info.Template != name+":1" {
		t.Fatalf("bob's sandbox of %s: %s, WHICH=%q; want %s:1 with v1", name, sb1.Info.Template, got, name)
	}

	// The attack: alice rebuilds the published name with anything.
	build("v2", 2)
	sb2, err := w.createFrom(t, ctx, w.Bob, name)
	if err != nil {
		t.Fatalf("bob creates from %s after alice's rebuild: %v", name, err)
	}
	if got := which(sb2); got != "v1" || sb2.Info.Template != name+":1" {
		t.Errorf("after alice's rebuild, bob's new sandbox of %s is %s with WHICH=%q; want %s:1 with v1 (a rebuild is not published)",
			name, sb2.Info.Template, got, name)
	}
	code, b := w.mustDo(t, ctx, w.Bob, "POST", "/v1/sandboxes", map[string]any{"template": name + ":2", "ttl_seconds": 60}, nil)
	if code != http.StatusNotFound {
		t.Errorf("bob creates from the unpublished %s:2: %d %s, want 404", name, code, b)
		if code == http.StatusCreated {
			var sb struct{ ID string }
			json.Unmarshal(b, &sb)
			w.mustDo(t, ctx, w.Bob, "DELETE", "/v1/sandboxes/"+sb.ID, nil, nil)
		}
	}
	// Bob's listing shows version 1 only; alice's, both.
	listed := func(key string) (int, []int) {
		t.Helper()
		ts, err := w.client(t, key).Templates(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, tp := range ts {
			if tp.Name == name {
				var vs []int
				for _, v := range tp.Versions {
					vs = append(vs, v.Version)
				}
				return tp.LatestVersion, vs
			}
		}
		return 0, nil
	}
	if latest, vs := listed(w.Bob); latest != 1 || !slices.Equal(vs, []int{1}) {
		t.Errorf("bob lists %s at latest %d with versions %v; want 1 and [1]", name, latest, vs)
	}
	if latest, vs := listed(w.Alice); latest != 2 || !slices.Equal(vs, []int{1, 2}) {
		t.Errorf("alice lists %s at latest %d with versions %v; want 2 and [1 2]", name, latest, vs)
	}
}

// randRE is the line the cache test's RUN step prints.
var randRE = regexp.MustCompile(`(?m)^rand=([0-9a-f]{24})$`)

// TestSecurityDockerfileCacheScoped replays finding 5: bob builds the
// very Dockerfile alice built. Nothing of alice's build may be reused (no
// "cached" line, the RUN runs and prints a value of its own), alice's own
// rebuild is cached, and her build differing only in HTTP_PROXY runs the
// RUN again.
func TestSecurityDockerfileCacheScoped(t *testing.T) {
	w := security(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	const df = "FROM tiny\nRUN echo \"rand=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \\n')\" | tee /rand\n"
	w.deleteTemplateAtEnd(t, "sec-cache-a")
	w.deleteTemplateAtEnd(t, "sec-cache-b")
	build := func(key, name string, opts ...pandastack.BuildOption) (pandastack.TemplateBuild, string) {
		t.Helper()
		var lines []string
		b, err := w.client(t, key).BuildTemplateFromDockerfile(ctx, name, df, "", func(l string) { lines = append(lines, l) }, opts...)
		log := strings.Join(lines, "\n")
		if err != nil {
			t.Fatalf("build %s: %v\n%s", name, err, log)
		}
		return b, log
	}
	random := func(log string) string {
		if m := randRE.FindStringSubmatch(log); m != nil {
			return m[1]
		}
		return ""
	}

	a1, log := build(w.Alice, "sec-cache-a")
	ra := random(log)
	if ra == "" {
		t.Fatalf("alice's build printed no rand= line:\n%s", log)
	}
	b1, log := build(w.Bob, "sec-cache-b")
	if strings.Contains(log, "cached") {
		t.Errorf("bob's build of alice's Dockerfile reports cached steps (alice's):\n%s", log)
	}
	if rb := random(log); rb == "" || rb == ra {
		t.Errorf("bob's RUN printed %q (alice's: %q): want it run anew, its own value\n%s", rb, ra, log)
	}
	if b1.Digest == a1.Digest {
		t.Errorf("bob's template is alice's layer %s", a1.Digest)
	}

	a2, log := build(w.Alice, "sec-cache-a")
	if !strings.Contains(log, "  cached") || random(log) != "" || a2.Digest != a1.Digest {
		t.Errorf("alice's rebuild: digest %s (first %s), log:\n%s\nwant her own layers reused, the RUN not run", a2.Digest, a1.Digest, log)
	}

	// Only HTTP_PROXY differs (the RUN does not even use it).
	a3, log := build(w.Alice, "sec-cache-a", pandastack.WithBuildArg("HTTP_PROXY", "http://"+nettest.WebAddr.String()+":3128"))
	if rp := random(log); rp == "" || rp == ra || strings.Contains(log, "cached") || a3.Digest == a1.Digest {
		t.Errorf("alice's build through a proxy: rand %q (first %q), digest %s, log:\n%s\nwant the RUN run again", rp, ra, a3.Digest, log)
	}
}

// trap is a TCP service in one of the world's namespaces that answers any
// HTTP request with a secret and counts the connections it accepts.
type trap struct {
	addr  string
	conns atomic.Int32
}

const trapSecret = "TRAP-SECRET-3f9a"

func (w *secWorld) trap(t *testing.T, ns *nettest.NS, addr string) *trap {
	t.Helper()
	l, err := ns.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s in %s: %v", addr, ns.Name, err)
	}
	tr := &trap{addr: l.Addr().String()}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			rw.Header().Set("Content-Type", "text/plain")
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

// TestSecurityRegistrySSRF replays finding 6: a template build from the
// server's loopback, its private network and the cloud metadata address.
// Each is refused, says so, never connects there, and shows nothing the
// service there would have sent.
func TestSecurityRegistrySSRF(t *testing.T) {
	w := security(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	traps := []struct {
		what  string
		trap  *trap
		class string
	}{
		{"the server's loopback", w.trap(t, w.env.Host, "127.0.0.1:0"), "loopback"},
		{"the server's private network", w.trap(t, w.env.Host, netip.AddrPortFrom(nettest.HostPrivateAddr, 0).String()), "private"},
		// Not RFC 1918 nor localhost: pulled over HTTPS, port 443.
		{"cloud metadata", w.trap(t, w.env.Internet, netip.AddrPortFrom(nettest.MetadataAddr, 443).String()), "link-local"},
	}
	alice := w.client(t, w.Alice)
	for i, tc := range traps {
		name := fmt.Sprintf("sec-ssrf-%d", i)
		w.deleteTemplateAtEnd(t, name)
		ref := tc.trap.addr + "/x:1"
		if strings.HasSuffix(tc.trap.addr, ":443") {
			ref = strings.TrimSuffix(tc.trap.addr, ":443") + "/x:1"
		}
		var lines []string
		b, err := alice.BuildTemplate(ctx, name, ref, func(l string) { lines = append(lines, l) })
		var pe *pandastack.Error
		if !errors.As(err, &pe) || b.Status != pandastack.BuildFailed {
			t.Errorf("build from %s (%s): %+v, %v; want it failed", ref, tc.what, b, err)
			continue
		}
		shown := pe.Message + "\n" + b.Error + "\n" + strings.Join(lines, "\n")
		if !strings.Contains(pe.Message, "refused") || !strings.Contains(pe.Message, tc.class) {
			t.Errorf("build from %s (%s): %q, want it refused as %s", ref, tc.what, pe.Message, tc.class)
		}
		if strings.Contains(shown, trapSecret) || strings.Contains(shown, "418") || strings.Contains(shown, "teapot") {
			t.Errorf("build from %s (%s) shows what the service there answered:\n%s", ref, tc.what, shown)
		}
		if n := tc.trap.conns.Load(); n != 0 {
			t.Errorf("build from %s (%s): the server connected there %d times", ref, tc.what, n)
		}
	}
}
