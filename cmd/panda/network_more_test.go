package main

// More end-to-end tests of sandbox networking, in nettest worlds like
// network_test.go's: the tools of the base template (curl, git) against
// the test's internet; servers in the guest reached through the port
// proxy, signed URLs and WebSockets; a fork while the parent streams over
// TCP; twenty sandboxes online at once; and what is left after kills and
// a stop. No sandbox traffic of these tests leaves the test's namespaces.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/cgi"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/testing/nettest"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// Ports of the tests' own servers on WebAddr (allowed.test): gitPort
// serves a git repository and a blob (serveGit), barrierPort the
// rendezvous of TestNetworkTwentyOnline.
const (
	gitPort     = 8080
	barrierPort = 8081
)

// baseMemoryMiB is the memory of the base sandboxes of these tests.
const baseMemoryMiB = 512

// createWith makes a sandbox from body (ttl_seconds added if missing).
func (s *netServer) createWith(t *testing.T, ctx context.Context, body map[string]any) *pandastack.Sandbox {
	t.Helper()
	if _, ok := body["ttl_seconds"]; !ok {
		body["ttl_seconds"] = 1800
	}
	code, b := s.call(t, ctx, "POST", "/v1/sandboxes", body)
	if code != http.StatusCreated && code != http.StatusOK {
		t.Fatalf("create %v: %d %s", body, code, b)
	}
	var info struct{ ID string }
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatalf("create answered %s: %v", b, err)
	}
	sb, err := s.c.Get(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// execIn execs cmd in sb and returns its result; an exec that fails to run
// at all is fatal.
func execIn(t *testing.T, ctx context.Context, sb *pandastack.Sandbox, cmd string) pandastack.ExecResult {
	t.Helper()
	r, err := sb.Exec(ctx, pandastack.Command{Cmd: cmd})
	if err != nil {
		t.Fatalf("exec %q in %s: %v", cmd, sb.ID, err)
	}
	return r
}

// get sends a GET with the client given (no API key) and returns the
// status and body.
func get(t *testing.T, ctx context.Context, hc *http.Client, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// serveGit serves, on the test's internet at allowed.test:gitPort, a git
// repository over smart HTTP (/git/repo.git, git http-backend through
// CGI) holding README with content, and /blob: n pseudo-random bytes. It
// returns the SHA-256 of the blob and a counter of upload-pack requests.
func serveGit(t *testing.T, env *nettest.Env, content string, n int) (string, *atomic.Int64) {
	t.Helper()
	dir := t.TempDir()
	gitenv := append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+dir,
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "README"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-C", src, "init", "-q", "-b", "main"},
		{"-C", src, "add", "README"},
		{"-C", src, "commit", "-q", "-m", "first"},
		{"clone", "-q", "--bare", src, filepath.Join(dir, "repo.git")},
	} {
		cmd := exec.Command("git", args...)
		cmd.Env = gitenv
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v: %s", args, err, out)
		}
	}
	out, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatalf("git --exec-path: %v", err)
	}
	backend := &cgi.Handler{
		Path: filepath.Join(strings.TrimSpace(string(out)), "git-http-backend"),
		Root: "/git",
		Env:  []string{"GIT_PROJECT_ROOT=" + dir, "GIT_HTTP_EXPORT_ALL=1", "HOME=" + dir},
	}
	blob := make([]byte, n)
	r := rand.NewChaCha8([32]byte{1})
	r.Read(blob)
	sum := sha256.Sum256(blob)
	var packs atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("/git/", func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/git-upload-pack") {
			packs.Add(1)
		}
		backend.ServeHTTP(w, r)
	})
	mux.HandleFunc("/blob", func(w http.ResponseWriter, r *http.Request) { w.Write(blob) })
	env.Serve(t, env.Internet, fmt.Sprintf("%s:%d", nettest.WebAddr, gitPort), mux)
	return hex.EncodeToString(sum[:]), &packs
}

// wsEcho is a WebSocket echo server for the base template's python3
// (standard library only): text and binary messages echoed frame by
// frame, pings answered, a close echoed.
const wsEcho = `import base64, hashlib, socketserver, struct, sys
G = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def recvn(f, n):
    b = f.read(n)
    if len(b) != n: raise EOFError
    return b
class H(socketserver.StreamRequestHandler):
    def handle(self):
        key = None
        while True:
            line = self.rfile.readline().decode("latin-1").strip()
            if not line: break
            k, _, v = line.partition(":")
            if k.strip().lower() == "sec-websocket-key": key = v.strip()
        if key is None:
            self.wfile.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"); return
        acc = base64.b64encode(hashlib.sha1(key.encode() + G).digest()).decode()
        self.wfile.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n" % acc).encode())
        while True:
            h = recvn(self.rfile, 2)
            op, n = h[0] & 0x0f, h[1] & 0x7f
            if n == 126: n = struct.unpack(">H", recvn(self.rfile, 2))[0]
            elif n == 127: n = struct.unpack(">Q", recvn(self.rfile, 8))[0]
            mask = recvn(self.rfile, 4) if h[1] & 0x80 else b"\0\0\0\0"
            p = recvn(self.rfile, n)
            if n:
                m = (mask * (n // 4 + 1))[:n]
                p = (int.from_bytes(p, "big") ^ int.from_bytes(m, "big")).to_bytes(n, "big")
            first = h[0] if op != 9 else 0x8a
            if n < 126: hdr = struct.pack(">BB", first, n)
            elif n < 65536: hdr = struct.pack(">BBH", first, 126, n)
            else: hdr = struct.pack(">BBQ", first, 127, n)
            self.wfile.write(hdr + p)
            self.wfile.flush()
            if op == 8: return
class S(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
S(("0.0.0.0", int(sys.argv[1])), H).serve_forever()
`

// startInGuest starts cmd in sb in a session of its own, detached from
// the exec, and waits until something listens on port 127.0.0.1:port
// (bash's /dev/tcp: base template only).
func startInGuest(t *testing.T, ctx context.Context, sb *pandastack.Sandbox, cmd string, port int) {
	t.Helper()
	mustExec(t, ctx, sb, fmt.Sprintf("setsid sh -c '%s' </dev/null >/tmp/server-%d.log 2>&1 &", cmd, port))
	wait := fmt.Sprintf(`bash -c 'for i in $(seq 600); do (exec 3<>/dev/tcp/127.0.0.1/%d) 2>/dev/null && exit 0; sleep 0.1; done; cat /tmp/server-%d.log; exit 1'`, port, port)
	if r := execIn(t, ctx, sb, wait); r.ExitCode != 0 {
		t.Fatalf("%s: nothing listens on port %d a minute after %q: %s%s", sb.ID, port, cmd, r.Stdout, r.Stderr)
	}
}

// TestNetworkBaseGuest: in a sandbox of the base template, curl and git
// clone reach the test's internet by name (a 4 MiB download arrives
// intact, the clone has the served commit) and curl is refused at once,
// not left to time out, on a blocked address; a python3 HTTP server in
// the guest is reached through the API's port proxy (not without a key),
// through a signed URL without a key until it expires and not after, and
// a WebSocket echo server in the guest through both.
func TestNetworkBaseGuest(t *testing.T) {
	e2e(t)
	env := nettest.NewEnv(t)
	dir := newDataDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	s := startNetServer(t, dir, env)
	readme := fmt.Sprintf("served by the test's git server %d\n", rand.Int64())
	blobSum, packs := serveGit(t, env, readme, 4<<20)

	t0 := time.Now()
	a := s.createWith(t, ctx, map[string]any{"template": "base", "memory_mib": baseMemoryMiB})
	t.Logf("first base sandbox (bake included): %v", time.Since(t0).Round(time.Millisecond))
	out := mustExec(t, ctx, a, "for c in curl git python3 bash wget busybox; do command -v $c || echo no $c; done")
	t.Logf("tools of the base template:\n%s", out)
	for _, c := range []string{"curl", "git", "python3", "bash"} {
		if strings.Contains(out, "no "+c+"\n") {
			t.Fatalf("the base template has no %s", c)
		}
	}

	t.Run("curl", func(t *testing.T) {
		r := execIn(t, ctx, a, "curl -sS --max-time 20 http://allowed.test/")
		if got, want := r.Stdout, nettest.Hello(nettest.WebAddr); r.ExitCode != 0 || got != want {
			t.Errorf("curl http://allowed.test/: exit %d, got %q, want %q (%s)", r.ExitCode, got, want, r.Stderr)
		}
		r = execIn(t, ctx, a, fmt.Sprintf("curl -sS --max-time 60 http://allowed.test:%d/blob | sha256sum", gitPort))
		if got, _, _ := strings.Cut(r.Stdout, " "); r.ExitCode != 0 || got != blobSum {
			t.Errorf("curl of a 4 MiB blob: exit %d, sha256 %q, want %q (%s)", r.ExitCode, got, blobSum, r.Stderr)
		}
		// Refused by a reset (curl exit 7), not dropped (exit 28 after
		// --max-time).
		for _, blocked := range []netip.Addr{nettest.HostPrivateAddr, nettest.MetadataAddr} {
			start := time.Now()
			r = execIn(t, ctx, a, fmt.Sprintf("curl -sS --max-time 20 http://%s/", blocked))
			if r.ExitCode != 7 {
				t.Errorf("curl http://%s/: exit %d after %v (%q, %s), want 7 (could not connect)",
					blocked, r.ExitCode, time.Since(start).Round(time.Millisecond), r.Stdout, r.Stderr)
			}
		}
	})

	t.Run("git clone", func(t *testing.T) {
		r := execIn(t, ctx, a, fmt.Sprintf("git clone -q http://allowed.test:%d/git/repo.git /tmp/clone && cat /tmp/clone/README && git -C /tmp/clone log --format=%%s", gitPort))
		if want := readme + "first\n"; r.ExitCode != 0 || r.Stdout != want {
			t.Errorf("git clone: exit %d, got %q, want %q (%s)", r.ExitCode, r.Stdout, want, r.Stderr)
		}
		if packs.Load() == 0 {
			t.Errorf("the git server saw no git-upload-pack request: not a smart HTTP clone")
		}
	})

	const httpPort, wsPort = 8000, 8001
	mustExec(t, ctx, a, "mkdir -p /tmp/www && echo from-python-in-the-guest > /tmp/www/hello.txt")
	startInGuest(t, ctx, a, fmt.Sprintf("exec python3 -m http.server %d --directory /tmp/www", httpPort), httpPort)
	portPath := fmt.Sprintf("/v1/sandboxes/%s/ports/%d/", a.ID, httpPort)
	noKey := &http.Client{Transport: s.hc.Transport, Timeout: time.Minute}

	t.Run("port proxy", func(t *testing.T) {
		code, body := s.call(t, ctx, "GET", portPath+"hello.txt", nil)
		if code != http.StatusOK || string(body) != "from-python-in-the-guest\n" {
			t.Errorf("GET %shello.txt: %d %q", portPath, code, body)
		}
		code, body = s.call(t, ctx, "GET", portPath+"missing", nil)
		if code != http.StatusNotFound {
			t.Errorf("GET %smissing: %d %q, want the guest's 404", portPath, code, body)
		}
		if code, body := get(t, ctx, noKey, s.URL()+portPath+"hello.txt"); code != http.StatusUnauthorized {
			t.Errorf("GET %shello.txt without a key: %d %q, want 401", portPath, code, body)
		}
		// Nothing listens on 8002: the proxy says so, it does not hang.
		code, body = s.call(t, ctx, "GET", fmt.Sprintf("/v1/sandboxes/%s/ports/8002/", a.ID), nil)
		if code != http.StatusBadGateway {
			t.Errorf("GET a port nothing listens on: %d %s, want 502", code, body)
		}
	})

	t.Run("signed URL", func(t *testing.T) {
		sign := func(ttl int) (string, time.Time) {
			t.Helper()
			code, body := s.call(t, ctx, "POST", fmt.Sprintf("/v1/sandboxes/%s/ports/%d/url", a.ID, httpPort), map[string]any{"ttl_seconds": ttl})
			var u struct {
				URL       string    `json:"url"`
				ExpiresAt time.Time `json:"expires_at"`
			}
			if err := json.Unmarshal(body, &u); code != http.StatusOK || err != nil || u.URL == "" {
				t.Fatalf("sign a URL of %d s: %d %s", ttl, code, body)
			}
			return u.URL, u.ExpiresAt
		}
		code, body := s.call(t, ctx, "POST", fmt.Sprintf("/v1/sandboxes/%s/ports/%d/url", a.ID, httpPort), map[string]any{"ttl_seconds": 0})
		if code != http.StatusUnprocessableEntity {
			t.Errorf("sign a URL of 0 s: %d %s, want 422", code, body)
		}
		long, _ := sign(600)
		short, expires := sign(1) // the shortest the API allows
		if code, body := get(t, ctx, noKey, long+"hello.txt"); code != http.StatusOK || body != "from-python-in-the-guest\n" {
			t.Errorf("GET a signed URL without a key: %d %q", code, body)
		}
		tampered := strings.Replace(long, "/p/", "/p/A", 1)
		if code, body := get(t, ctx, noKey, tampered+"hello.txt"); code != http.StatusForbidden {
			t.Errorf("GET an altered signed URL: %d %q, want 403", code, body)
		}
		// Wait on the clock, the server's too (the same machine), until
		// the short URL has expired.
		for time.Now().Before(expires.Add(10 * time.Millisecond)) {
			time.Sleep(time.Until(expires.Add(10 * time.Millisecond)))
		}
		code, body2 := get(t, ctx, noKey, short+"hello.txt")
		if code != http.StatusForbidden || !strings.Contains(body2, "expired") {
			t.Errorf("GET a signed URL after expires_at %s: %d %q, want 403 saying it expired", expires.Format(time.RFC3339), code, body2)
		}
		if code, body := get(t, ctx, noKey, long+"hello.txt"); code != http.StatusOK {
			t.Errorf("GET the longer signed URL after the short one expired: %d %q", code, body)
		}
	})

	t.Run("websocket", func(t *testing.T) {
		writeFile(t, ctx, a, "/tmp/wsecho.py", wsEcho)
		startInGuest(t, ctx, a, fmt.Sprintf("exec python3 /tmp/wsecho.py %d", wsPort), wsPort)
		code, body := s.call(t, ctx, "POST", fmt.Sprintf("/v1/sandboxes/%s/ports/%d/url", a.ID, wsPort), map[string]any{"ttl_seconds": 600})
		var signed struct{ URL string }
		if err := json.Unmarshal(body, &signed); code != http.StatusOK || err != nil {
			t.Fatalf("sign a URL of port %d: %d %s", wsPort, code, body)
		}
		for _, tc := range []struct {
			name, url string
			header    http.Header
		}{
			{"api key", fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d/echo", s.URL(), a.ID, wsPort), http.Header{"Authorization": {"Bearer " + s.AdminKey()}}},
			{"signed URL", signed.URL + "echo", nil},
		} {
			t.Run(tc.name, func(t *testing.T) {
				wsEchoes(t, ctx, noKey, tc.url, tc.header)
			})
		}
	})

	if !mustStop(t, s.proc) {
		return
	}
	if left := netLeftovers(t, s); len(left) > 0 {
		t.Errorf("left after the server stopped: %v", left)
	}
}

// wsEchoes opens a WebSocket to url and checks that text and binary
// messages (one of 200 KiB) come back as sent and that it closes
// cleanly (the guest's server answers the close).
func wsEchoes(t *testing.T, ctx context.Context, hc *http.Client, url string, h http.Header) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: hc, HTTPHeader: h})
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial %s: %v (status %d)", url, err, status)
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	big := make([]byte, 200<<10)
	rand.NewChaCha8([32]byte{2}).Read(big)
	msgs := []struct {
		typ  websocket.MessageType
		data []byte
	}{
		{websocket.MessageText, []byte("hello through the proxy")},
		{websocket.MessageBinary, big},
		{websocket.MessageText, []byte(strings.Repeat("x", 300))},
	}
	for i, m := range msgs {
		if err := c.Write(ctx, m.typ, m.data); err != nil {
			t.Fatalf("message %d: write: %v", i, err)
		}
		typ, got, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("message %d: read: %v", i, err)
		}
		if typ != m.typ || string(got) != string(m.data) {
			t.Errorf("message %d: got %v of %d bytes, want %v of %d bytes as sent", i, typ, len(got), m.typ, len(m.data))
		}
	}
	if err := c.Close(websocket.StatusNormalClosure, "done"); err != nil {
		t.Errorf("close: %v", err)
	}
}

// TestNetworkForkWhileStreaming: the parent streams lines to the test's
// echo server over one TCP connection through a fork. The parent's
// connection carries on, in order, with nothing lost; each child's
// inherited copy of it fails at once with a reset (the child's namespace
// never saw it open), not after a timeout, and never reaches the echo
// server; each child opens new connections at once.
func TestNetworkForkWhileStreaming(t *testing.T) {
	e2e(t)
	env := nettest.NewEnv(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	s := startNetServer(t, dir, env)
	a := s.create(t, ctx, nil)

	echo := fmt.Sprintf("%s %d", nettest.WebAddr, nettest.EchoPort)
	mustExec(t, ctx, a, fmt.Sprintf(`setsid sh -c 'i=0; while :; do echo "line $i"; i=$((i+1)); usleep 100000; done | nc %s >/tmp/echo.out 2>/tmp/nc.err' </dev/null >/dev/null 2>&1 &`, echo))
	stream := waitEcho(t, env, "", func(c nettest.EchoConn) bool { return strings.Contains(c.Received.String(), "line 2\n") })
	ncPID := strings.TrimSpace(mustExec(t, ctx, a, "pidof nc"))
	if _, err := strconv.Atoi(ncPID); err != nil {
		t.Fatalf("pidof nc: %q, want one PID", ncPID)
	}

	resetsBefore := estabResets(t, ctx, a)
	t0 := time.Now()
	kids, err := a.Fork(ctx, 2)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	t.Logf("fork of 2: %v", time.Since(t0).Round(time.Millisecond))
	cur := findEcho(env, stream.Remote)
	atFork := lines(cur.Received.String())

	for i, k := range kids {
		t0 := time.Now()
		want := fmt.Sprintf("fresh %d\n", i)
		r := execIn(t, ctx, k, fmt.Sprintf("echo 'fresh %d' | timeout 10 nc %s", i, echo))
		if r.ExitCode != 0 || r.Stdout != want {
			t.Errorf("child %s: a new connection to the echo server: exit %d, got %q, want %q (%s)", k.ID, r.ExitCode, r.Stdout, want, r.Stderr)
		}
		t.Logf("child %s: a new echo connection %v after the fork", k.ID, time.Since(t0).Round(time.Millisecond))
		wantReach(t, ctx, k, "http://allowed.test/", nettest.Hello(nettest.WebAddr))
	}
	for _, k := range kids {
		// The inherited nc writes every 100 ms: its next segment gets the
		// reset. 20 s is far less than TCP's retransmission timeout.
		r := execIn(t, ctx, k, fmt.Sprintf("for i in $(seq 200); do kill -0 %s 2>/dev/null || exit 0; usleep 100000; done; exit 1", ncPID))
		if r.ExitCode != 0 {
			t.Errorf("child %s: the inherited nc (%s) still runs 20 s after the fork: its connection hangs", k.ID, ncPID)
		} else if got := estabResets(t, ctx, k); got <= resetsBefore {
			// busybox nc exits silently on a reset as on an end of
			// stream: the guest kernel's counter tells them apart.
			t.Errorf("child %s: the inherited connection ended, but not by a reset (EstabResets %d, %d in the parent before the fork)", k.ID, got, resetsBefore)
		} else {
			t.Logf("child %s: the inherited connection was reset (EstabResets %d, %d before the fork)", k.ID, got, resetsBefore)
		}
	}

	// The parent's stream carries on: 20 more lines echoed on the same
	// connection, which stays open, and echoed back to the parent in
	// order.
	c := waitEcho(t, env, stream.Remote, func(c nettest.EchoConn) bool { return lines(c.Received.String()) >= atFork+20 })
	if c.Done {
		t.Errorf("the parent's connection ended: %v", c.Err)
	}
	if r := execIn(t, ctx, a, "kill -0 "+ncPID); r.ExitCode != 0 {
		t.Errorf("the parent's nc is gone: %s", execIn(t, ctx, a, "cat /tmp/nc.err").Stdout)
	}
	got := mustExec(t, ctx, a, "cat /tmp/echo.out")
	n := lines(got)
	var want strings.Builder
	for i := range n {
		fmt.Fprintf(&want, "line %d\n", i)
	}
	if n < atFork+20 || got != want.String() {
		t.Errorf("the parent got back %d lines (%d at the fork), not all in order:\n%s", n, atFork, got)
	}
	// Every connection the echo server took is the parent's stream or a
	// child's new one: no child's inherited segment reached it.
	for _, c := range env.Echo.Conns() {
		if c.Remote != stream.Remote && !strings.HasPrefix(c.Received.String(), "fresh ") {
			t.Errorf("the echo server took a connection from %s that received %q", c.Remote, c.Received.String())
		}
	}
	if !mustStop(t, s.proc) {
		return
	}
	if left := netLeftovers(t, s); len(left) > 0 {
		t.Errorf("left after the server stopped: %v", left)
	}
}

// estabResets is the guest kernel's count of established TCP connections
// reset (Tcp EstabResets in /proc/net/snmp).
func estabResets(t *testing.T, ctx context.Context, sb *pandastack.Sandbox) int {
	t.Helper()
	out := mustExec(t, ctx, sb, `awk '/^Tcp:/ { if (!c) { for (i = 1; i <= NF; i++) if ($i == "EstabResets") c = i } else print $c }' /proc/net/snmp`)
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("%s: EstabResets in /proc/net/snmp: %q", sb.ID, out)
	}
	return n
}

func lines(s string) int { return strings.Count(s, "\n") }

// findEcho is the echo server's record of the connection from remote.
func findEcho(env *nettest.Env, remote string) nettest.EchoConn {
	for _, c := range env.Echo.Conns() {
		if c.Remote == remote {
			return c
		}
	}
	return nettest.EchoConn{}
}

// waitEcho waits (30 s at most) until a connection of the echo server
// (the one from remote, or any if "") satisfies ok, and returns it.
func waitEcho(t *testing.T, env *nettest.Env, remote string, ok func(nettest.EchoConn) bool) nettest.EchoConn {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, c := range env.Echo.Conns() {
			if (remote == "" || c.Remote == remote) && ok(c) {
				return c
			}
		}
		if time.Now().After(deadline) {
			var seen []string
			for _, c := range env.Echo.Conns() {
				seen = append(seen, fmt.Sprintf("%s: %d bytes, done %v, err %v", c.Remote, c.Received.Len(), c.Done, c.Err))
			}
			t.Fatalf("echo server: no connection as wanted after 30 s; seen: %v", seen)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNetworkTwentyOnline: twenty tiny sandboxes are online at once: each
// resolves allowed.test and fetches from it, all at the same time, and
// all twenty requests are open at the test's server together (it answers
// none until it holds all twenty).
func TestNetworkTwentyOnline(t *testing.T) {
	e2e(t)
	const n = 20
	env := nettest.NewEnv(t)
	dir := newDataDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s := startNetServer(t, dir, env)

	// The barrier answers each request once n are in, or 503 after a
	// minute.
	var (
		mu      sync.Mutex
		arrived = map[string]bool{}
		all     = make(chan struct{})
	)
	env.Serve(t, env.Internet, fmt.Sprintf("%s:%d", nettest.WebAddr, barrierPort), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrived[r.URL.Query().Get("id")] = true
		if len(arrived) == n {
			close(all)
		}
		mu.Unlock()
		select {
		case <-all:
			fmt.Fprintf(w, "all %d here", n)
		case <-time.After(time.Minute):
			http.Error(w, "not all here", http.StatusServiceUnavailable)
		case <-r.Context().Done():
		}
	}))

	t0 := time.Now()
	sbs := make([]*pandastack.Sandbox, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	work := make(chan int)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				sb, err := s.c.Create(ctx, pandastack.CreateOptions{TTLSeconds: 1800})
				if err != nil {
					errs <- fmt.Errorf("create %d: %w", i, err)
					continue
				}
				sbs[i] = sb
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d creates, 4 at a time: %v", n, time.Since(t0).Round(time.Millisecond))

	type result struct {
		plain, barrier string
		err            error
	}
	results := make([]result, n)
	t0 = time.Now()
	for i, sb := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := fmt.Sprintf("timeout 60 wget -q -O - http://allowed.test/ && echo && timeout 90 wget -q -O - 'http://allowed.test:%d/barrier?id=%s'", barrierPort, sb.ID)
			r, err := sb.Exec(ctx, pandastack.Command{Cmd: cmd, Timeout: 2 * time.Minute})
			if err != nil {
				results[i].err = err
				return
			}
			if r.ExitCode != 0 {
				results[i].err = fmt.Errorf("exit %d: %s", r.ExitCode, r.Stderr)
			}
			results[i].plain, results[i].barrier, _ = strings.Cut(r.Stdout, "\n")
		}()
	}
	wg.Wait()
	t.Logf("%d concurrent fetches: %v", n, time.Since(t0).Round(time.Millisecond))
	for i, r := range results {
		if r.err != nil || r.plain != nettest.Hello(nettest.WebAddr) || r.barrier != fmt.Sprintf("all %d here", n) {
			t.Errorf("sandbox %s: got %q and %q (%v), want %q and %q", sbs[i].ID, r.plain, r.barrier, r.err,
				nettest.Hello(nettest.WebAddr), fmt.Sprintf("all %d here", n))
		}
	}
	if !mustStop(t, s.proc) {
		return
	}
	if left := netLeftovers(t, s); len(left) > 0 {
		t.Errorf("left after the server stopped: %v", left)
	}
}

// hostTables lists the nftables tables of the server's prefix in the
// test's host namespace.
func hostTables(t *testing.T, s *netServer) []string {
	t.Helper()
	fd, err := unix.Open(s.env.Host.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	cc, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.CloseLasting()
	ts, err := cc.ListTables()
	if err != nil {
		t.Fatalf("list nftables tables in %s: %v", s.env.Host.Name, err)
	}
	var out []string
	for _, tb := range ts {
		if strings.HasPrefix(tb.Name, s.prefix) {
			out = append(out, tb.Name)
		}
	}
	return out
}

// netnsOf is the name of sandbox id's namespace, as its record in the
// data directory says (the namespace must exist).
func netnsOf(t *testing.T, s *netServer, dataDir, id string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, "store", "sandboxes", id, "sandbox.json"))
	if err != nil {
		t.Fatalf("read the record of %s: %v", id, err)
	}
	var rec struct{ NetNS string }
	if err := json.Unmarshal(b, &rec); err != nil || !strings.HasPrefix(rec.NetNS, s.prefix+"-") {
		t.Fatalf("record of %s: netns %q (%v), want one of prefix %s", id, rec.NetNS, err, s.prefix)
	}
	if _, err := os.Stat(filepath.Join("/run/netns", rec.NetNS)); err != nil {
		t.Fatalf("namespace of %s: %v", id, err)
	}
	return rec.NetNS
}

// TestNetworkNothingLeft: a sandbox's namespace and veth go when it is
// killed (a fork child's too) or paused, and come back when it resumes;
// after the server is SIGKILLed, restarted and stopped, no namespace,
// veth or nftables table of its prefix is left in the test's host
// namespace.
func TestNetworkNothingLeft(t *testing.T) {
	e2e(t)
	env := nettest.NewEnv(t)
	dir := newDataDir(t)
	ctx := ctxFor(t)
	// No prepared namespaces: every one counted is a sandbox's.
	s := startNetServer(t, dir, env, "--network-pool-size", "-1")
	if got := hostTables(t, s); len(got) != 1 {
		t.Fatalf("nftables tables of prefix %s while the server runs: %v, want one", s.prefix, got)
	}
	a := s.create(t, ctx, nil)
	b := s.create(t, ctx, nil)
	kids, err := a.Fork(ctx, 1)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	c := kids[0]
	wantLeft := func(what string, n int, gone ...string) {
		t.Helper()
		left := netLeftovers(t, s)
		if len(left) != 2*n {
			t.Errorf("%s: %v, want %d namespaces and %d veths", what, left, n, n)
		}
		for _, l := range left {
			for _, g := range gone {
				if l == "namespace "+g {
					t.Errorf("%s: namespace %s is left", what, g)
				}
			}
		}
	}
	wantLeft("three sandboxes", 3)
	nsA, nsC := netnsOf(t, s, dir, a.ID), netnsOf(t, s, dir, c.ID)
	for _, sb := range []*pandastack.Sandbox{a, c} {
		if err := sb.Kill(ctx); err != nil {
			t.Fatalf("kill %s: %v", sb.ID, err)
		}
	}
	wantLeft("a parent and its child killed", 1, nsA, nsC)
	if got := hostTables(t, s); len(got) != 1 {
		t.Errorf("nftables tables with a sandbox running: %v, want one", got)
	}

	nsB := netnsOf(t, s, dir, b.ID)
	if err := b.Pause(ctx); err != nil {
		t.Fatalf("pause: %v", err)
	}
	wantLeft("the last one paused", 0, nsB)
	if err := b.Resume(ctx); err != nil {
		t.Fatalf("resume: %v", err)
	}
	wantLeft("resumed", 1)
	wantReach(t, ctx, b, "http://allowed.test/", nettest.Hello(nettest.WebAddr))

	// SIGKILL: b's QEMU and namespace live on; the next server adopts
	// them and its stop removes everything.
	s.Kill()
	wantLeft("the server SIGKILLed", 1)
	s2 := startNetServer(t, dir, env, "--network-pool-size", "-1")
	if !mustStop(t, s2.proc) {
		return
	}
	if left := netLeftovers(t, s2); len(left) > 0 {
		t.Errorf("left after the server stopped: %v", left)
	}
	if got := hostTables(t, s2); len(got) > 0 {
		t.Errorf("nftables tables left after the server stopped: %v", got)
	}
}

// TestNetworkServerOutlivesNamespaceThreads: goroutines that lock a thread
// and end it (nettest's NS.Do, run by every Listen in a test namespace)
// after `panda up` started do not stop it. Its Pdeathsig fires when the
// thread that started it ends: pandatest keeps that thread locked.
func TestNetworkServerOutlivesNamespaceThreads(t *testing.T) {
	e2e(t)
	env := nettest.NewEnv(t)
	dir := newDataDir(t)
	s := startNetServer(t, dir, env)
	for i := range 200 {
		env.Internet.Do(func() error { return nil })
		select {
		case <-s.Exited():
			t.Fatalf("panda up exited after %d threads in a namespace ended:\n%s", i+1, s.Log())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if code, body := s.call(t, ctxFor(t), "GET", "/v1/sandboxes", nil); code != http.StatusOK {
		t.Errorf("GET /v1/sandboxes: %d %s", code, body)
	}
}
