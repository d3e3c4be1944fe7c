package rest_test

// The port proxy end to end, without sandbox networking: the agent's dial
// hook (agent.Config.Dial, set in TestMain) connects a sandbox's port to a
// test server on 127.0.0.1 that the test registered for that sandbox and
// port (guestNet), or to a closed port (connection refused). Everything
// else is real: the sandboxes (DialGuest checks that they run), the API
// server, and, with PANDA_TEST_HOST=remote, the host API's dial tunnel over
// the agent's connection.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/hostclient"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/pandastack/pandastack/internal/hostagent/hostapi"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// guestNet stands in for the sandboxes' network.
type guestNet struct {
	mu     sync.Mutex
	ports  map[string]string // "id:port" → a test server's address
	dials  map[string]int    // "id:port" → dials
	refuse string            // an address nothing listens on
}

var guests = newGuestNet()

func newGuestNet() *guestNet {
	g := &guestNet{ports: map[string]string{}, dials: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	g.refuse = ln.Addr().String()
	ln.Close()
	return g
}

// dial is the agent's Config.Dial.
func (g *guestNet) dial(ctx context.Context, id string, port int) (net.Conn, error) {
	k := id + ":" + strconv.Itoa(port)
	g.mu.Lock()
	addr, ok := g.ports[k]
	g.dials[k]++
	g.mu.Unlock()
	if !ok {
		addr = g.refuse
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

func (g *guestNet) dialed(id string, port int) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.dials[id+":"+strconv.Itoa(port)]
}

// serve starts h as port of sandbox id's guest until the test ends.
func serve(t testing.TB, id string, port int, h http.Handler) {
	t.Helper()
	hs := httptest.NewServer(h)
	k := id + ":" + strconv.Itoa(port)
	guests.mu.Lock()
	guests.ports[k] = hs.Listener.Addr().String()
	guests.mu.Unlock()
	t.Cleanup(func() {
		guests.mu.Lock()
		delete(guests.ports, k)
		guests.mu.Unlock()
		hs.CloseClientConnections()
		hs.Close()
	})
}

// echoed is what the echo server saw.
type echoed struct {
	Method, Path, RawPath, Query, Host, Body string
	Header                                   http.Header
}

func echoHandler(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(echoed{Method: r.Method, Path: r.URL.Path, RawPath: r.URL.RawPath, Query: r.URL.RawQuery,
		Host: r.Host, Body: string(b), Header: r.Header})
}

// noRedirects is a client that shows redirects instead of following them.
var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// call sends a request to a full URL with headers (Host sets the Host).
func call(t testing.TB, method, u string, body io.Reader, hdr map[string]string) resp {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	res, err := noRedirects.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{status: res.StatusCode, body: b, header: res.Header}
}

func (r resp) echo(t *testing.T) echoed {
	t.Helper()
	if r.status != 200 {
		t.Fatalf("got %d %s, want 200 from the echo server", r.status, r.body)
	}
	var e echoed
	r.json(t, &e)
	return e
}

func (r resp) message() string {
	var eb struct{ Error struct{ Message string } }
	json.Unmarshal(r.body, &eb)
	return eb.Error.Message
}

func bearer(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }

func TestPortProxyHTTP(t *testing.T) {
	world(t)
	key := newKey(t, "proxy-http", nil)
	sb := create(t, key, nil)
	mux := http.NewServeMux()
	mux.HandleFunc("/", echoHandler)
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/login?next=1", http.StatusFound) })
	hung := make(chan struct{}, 1) // /hang got a request and saw the proxy give up on it
	mux.HandleFunc("/hang", func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		hung <- struct{}{}
	})
	serve(t, sb.ID, 8000, mux)
	base := e.url + "/v1/sandboxes/" + sb.ID + "/ports/8000"
	host := strings.TrimPrefix(e.url, "http://")

	t.Run("request through", func(t *testing.T) {
		r := call(t, "GET", base+"/a/b%2Fc/?x=1&y=%20z", nil, map[string]string{
			"Authorization": "Bearer " + key, "X-Custom": "kept", "X-Forwarded-For": "203.0.113.9"})
		got := r.echo(t)
		if got.Method != "GET" || got.Path != "/a/b/c/" || got.RawPath != "/a/b%2Fc/" || got.Query != "x=1&y=%20z" {
			t.Errorf("guest saw %s %q (raw %q) ? %q; want GET /a/b%%2Fc/ ? x=1&y=%%20z", got.Method, got.Path, got.RawPath, got.Query)
		}
		if a := got.Header.Get("Authorization"); a != "" {
			t.Errorf("the guest got the API key: Authorization %q", a)
		}
		for h, want := range map[string]string{
			"X-Custom": "kept", "X-Forwarded-For": "203.0.113.9, 127.0.0.1", "X-Forwarded-Proto": "http",
			"X-Forwarded-Host": host, "X-Forwarded-Prefix": "/v1/sandboxes/" + sb.ID + "/ports/8000",
		} {
			if v := got.Header.Get(h); v != want {
				t.Errorf("guest saw %s %q, want %q", h, v, want)
			}
		}
		if got.Host != host {
			t.Errorf("guest saw Host %q, want the client's %q", got.Host, host)
		}
		if guests.dialed(sb.ID, 8000) == 0 {
			t.Errorf("no dial of port 8000 of sandbox %s", sb.ID)
		}
	})
	t.Run("methods and bodies", func(t *testing.T) {
		for _, m := range []string{"POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
			got := call(t, m, base+"/m", strings.NewReader("body of "+m), bearer(key)).echo(t)
			if got.Method != m || got.Body != "body of "+m {
				t.Errorf("%s: guest saw %s with body %q", m, got.Method, got.Body)
			}
		}
		// A GET of the guest path /url is the guest's (a POST there
		// signs a URL).
		if got := call(t, "GET", base+"/url", nil, bearer(key)).echo(t); got.Path != "/url" {
			t.Errorf("GET …/url: guest saw %q", got.Path)
		}
	})
	t.Run("no trailing slash", func(t *testing.T) {
		r := call(t, "GET", base+"?q=1", nil, bearer(key))
		if r.status != http.StatusPermanentRedirect || r.header.Get("Location") != "8000/?q=1" {
			t.Errorf("got %d Location %q, want 308 to 8000/?q=1", r.status, r.header.Get("Location"))
		}
	})
	t.Run("redirect under the prefix", func(t *testing.T) {
		r := call(t, "GET", base+"/redirect", nil, bearer(key))
		want := "/v1/sandboxes/" + sb.ID + "/ports/8000/login?next=1"
		if r.status != http.StatusFound || r.header.Get("Location") != want {
			t.Errorf("got %d Location %q, want 302 to %s", r.status, r.header.Get("Location"), want)
		}
	})
	t.Run("errors", func(t *testing.T) {
		other := newKey(t, "proxy-other", nil)
		expect(t, call(t, "GET", base+"/", nil, nil), 401, "unauthorized")
		expect(t, call(t, "GET", base+"/", nil, bearer(other)), 404, "not_found")
		expect(t, call(t, "GET", e.url+"/v1/sandboxes/nosuch0/ports/8000/", nil, bearer(key)), 404, "not_found")
		for _, p := range []string{"0", "65536", "http", "080", "-1"} {
			expect(t, call(t, "GET", e.url+"/v1/sandboxes/"+sb.ID+"/ports/"+p+"/", nil, bearer(key)), 422, "invalid")
		}
		r := call(t, "GET", e.url+"/v1/sandboxes/"+sb.ID+"/ports/8001/", nil, bearer(key))
		expect(t, r, 502, "bad_gateway")
		if !strings.Contains(r.message(), "nothing listens on port 8001") {
			t.Errorf("refused: message %q does not say that nothing listens on port 8001", r.message())
		}
		// A guest server that takes the request and never answers: 504
		// once the proxy stops waiting for the answer's header (not a dial
		// failure: the request reached the server, which then saw the
		// proxy give up on it).
		r = call(t, "GET", base+"/hang", nil, bearer(key))
		expect(t, r, 504, "timeout")
		if !strings.Contains(r.message(), "did not answer in time") {
			t.Errorf("504: message %q does not say the port did not answer in time", r.message())
		}
		select {
		case <-hung:
		case <-time.After(30 * time.Second):
			t.Error("after the 504, the guest's server never saw the proxy give up on its request")
		}
	})
}

func TestPortProxyStreams(t *testing.T) {
	world(t)
	key := newKey(t, "proxy-streams", nil)
	sb := create(t, key, nil)
	releaseStream, releaseSSE := make(chan struct{}), make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first\n")
		http.NewResponseController(w).Flush()
		<-releaseStream
		io.WriteString(w, "second\n")
	})
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		http.NewResponseController(w).Flush()
		<-releaseSSE
		io.WriteString(w, "data: two\n\n")
	})
	mux.HandleFunc("/duplex", func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		rc.EnableFullDuplex()
		w.WriteHeader(200)
		rc.Flush()
		buf := make([]byte, 64<<10)
		for {
			n, err := r.Body.Read(buf)
			if n > 0 {
				w.Write(buf[:n])
				rc.Flush()
			}
			if err != nil {
				return
			}
		}
	})
	mux.HandleFunc("/sha256", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		io.Copy(h, r.Body)
		fmt.Fprintf(w, "%x", h.Sum(nil))
	})
	blob := make([]byte, 8<<20)
	rand.Read(blob)
	mux.HandleFunc("/blob", func(w http.ResponseWriter, r *http.Request) { w.Write(blob) })
	serve(t, sb.ID, 8080, mux)
	base := e.url + "/v1/sandboxes/" + sb.ID + "/ports/8080"

	open := func(t *testing.T, method, path string, body io.Reader) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, body)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { res.Body.Close() })
		if res.StatusCode != 200 {
			b, _ := io.ReadAll(res.Body)
			t.Fatalf("%s %s: got %d %s", method, path, res.StatusCode, b)
		}
		return res
	}
	t.Run("response streams", func(t *testing.T) {
		// The guest writes its second line only once the test has read
		// the first: a proxy that buffered would never deliver it.
		res := open(t, "GET", "/stream", nil)
		br := bufio.NewReader(res.Body)
		if l, err := br.ReadString('\n'); l != "first\n" {
			t.Fatalf("first line: got %q, %v", l, err)
		}
		close(releaseStream)
		if rest, _ := io.ReadAll(br); string(rest) != "second\n" {
			t.Errorf("rest: got %q", rest)
		}
	})
	t.Run("server-sent events", func(t *testing.T) {
		res := open(t, "GET", "/events", nil)
		if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Errorf("Content-Type %q", ct)
		}
		br := bufio.NewReader(res.Body)
		if l, err := br.ReadString('\n'); l != "data: one\n" {
			t.Fatalf("first event: got %q, %v", l, err)
		}
		close(releaseSSE)
		if rest, _ := io.ReadAll(br); string(rest) != "\ndata: two\n\n" {
			t.Errorf("rest: got %q", rest)
		}
	})
	t.Run("full duplex", func(t *testing.T) {
		// Each line comes back while the request body is still open.
		pr, pw := io.Pipe()
		defer pw.Close()
		res := open(t, "POST", "/duplex", pr)
		br := bufio.NewReader(res.Body)
		for i := range 3 {
			fmt.Fprintf(pw, "line %d\n", i)
			if l, err := br.ReadString('\n'); l != fmt.Sprintf("line %d\n", i) {
				t.Fatalf("echo %d: got %q, %v", i, l, err)
			}
		}
		pw.Close()
		if rest, err := io.ReadAll(br); len(rest) != 0 || err != nil {
			t.Errorf("after the body ended: got %q, %v", rest, err)
		}
	})
	t.Run("large bodies", func(t *testing.T) {
		res := open(t, "POST", "/sha256", struct{ io.Reader }{bytes.NewReader(blob)}) // chunked
		got, _ := io.ReadAll(res.Body)
		if want := fmt.Sprintf("%x", sha256.Sum256(blob)); string(got) != want {
			t.Errorf("upload of 8 MiB: guest hashed %s, want %s", got, want)
		}
		res = open(t, "GET", "/blob", nil)
		h := sha256.New()
		n, err := io.Copy(h, res.Body)
		if want := sha256.Sum256(blob); err != nil || n != int64(len(blob)) || !bytes.Equal(h.Sum(nil), want[:]) {
			t.Errorf("download: %d bytes, %v, sha256 %x", n, err, h.Sum(nil))
		}
	})
}

// wsEcho is a WebSocket echo server.
func wsEcho(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	c.SetReadLimit(4 << 20)
	for {
		typ, b, err := c.Read(r.Context())
		if err != nil {
			return
		}
		if err := c.Write(r.Context(), typ, b); err != nil {
			return
		}
	}
}

func wsURL(u string) string { return "ws" + strings.TrimPrefix(u, "http") }

// wsRoundTrip sends msgs and checks that each comes back.
func wsRoundTrip(t *testing.T, c *websocket.Conn, msgs ...[]byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, m := range msgs {
		typ := websocket.MessageBinary
		if i%2 == 0 {
			typ = websocket.MessageText
		}
		if err := c.Write(ctx, typ, m); err != nil {
			t.Fatalf("write message %d: %v", i, err)
		}
		gotTyp, got, err := c.Read(ctx)
		if err != nil || gotTyp != typ || !bytes.Equal(got, m) {
			t.Fatalf("message %d (%d bytes): got %v %d bytes, %v", i, len(m), gotTyp, len(got), err)
		}
	}
}

func TestPortProxyWebSocket(t *testing.T) {
	world(t)
	key := newKey(t, "proxy-ws", nil)
	sb := create(t, key, nil)
	serve(t, sb.ID, 9000, http.HandlerFunc(wsEcho))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, res, err := websocket.Dial(ctx, wsURL(e.url)+"/v1/sandboxes/"+sb.ID+"/ports/9000/ws",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key}}})
	if err != nil {
		t.Fatalf("dial through the proxy: %v (%+v)", err, res)
	}
	defer c.CloseNow()
	c.SetReadLimit(4 << 20)
	big := make([]byte, 1<<20)
	rand.Read(big)
	wsRoundTrip(t, c, []byte("hello"), big, []byte("✓ unicode"))

	// Killing the sandbox ends the WebSocket at once.
	expect(t, do(t, key, "DELETE", "/v1/sandboxes/"+sb.ID, nil), 204, "")
	t0 := time.Now()
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	_, _, err = c.Read(rctx)
	if err == nil || rctx.Err() != nil {
		t.Fatalf("read after kill: got %v after %v, want the connection closed", err, time.Since(t0))
	}
	// And nothing more gets through.
	expect(t, call(t, "GET", e.url+"/v1/sandboxes/"+sb.ID+"/ports/9000/", nil, bearer(key)), 409, "conflict")
}

func TestPortProxyLimit(t *testing.T) {
	world(t)
	key := newKey(t, "proxy-limit", nil)
	sb := create(t, key, nil)
	arrived := make(chan struct{}, proxyLimit)
	release := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/", echoHandler)
	mux.HandleFunc("/hold", func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		io.WriteString(w, "held")
	})
	serve(t, sb.ID, 8000, mux)
	base := e.url + "/v1/sandboxes/" + sb.ID + "/ports/8000"
	results := make(chan resp, proxyLimit)
	for range proxyLimit {
		go func() {
			req, _ := http.NewRequest("GET", base+"/hold", nil)
			req.Header.Set("Authorization", "Bearer "+key)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				results <- resp{status: -1, body: []byte(err.Error())}
				return
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			results <- resp{status: res.StatusCode, body: b}
		}()
	}
	timeout := time.After(time.Minute)
	for range proxyLimit {
		select {
		case <-arrived:
		case <-timeout:
			t.Fatal("the held requests never reached the guest")
		}
	}
	// The limit is full: one more is refused, but exec (its own limit)
	// still runs.
	r := call(t, "GET", base+"/", nil, bearer(key))
	expect(t, r, 429, "too_many_requests")
	if !strings.Contains(r.message(), "proxied requests") {
		t.Errorf("429 message %q does not name proxied requests", r.message())
	}
	if x := run(t, key, sb.ID, map[string]any{"cmd": "echo ok"}); x.Stdout != "ok\n" {
		t.Errorf("exec while the proxy limit is full: %+v", x)
	}
	close(release)
	for range proxyLimit {
		if r := <-results; r.status != 200 || string(r.body) != "held" {
			t.Errorf("held request: got %d %s", r.status, r.body)
		}
	}
	call(t, "GET", base+"/", nil, bearer(key)).echo(t)
}

type portURL struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

func signURL(t *testing.T, base, key, id string, port int, body any) portURL {
	t.Helper()
	var b io.Reader
	if body != nil {
		j, _ := json.Marshal(body)
		b = bytes.NewReader(j)
	}
	r := call(t, "POST", fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d/url", base, id, port), b, bearer(key))
	expect(t, r, 200, "")
	var u portURL
	r.json(t, &u)
	return u
}

func TestSignedURL(t *testing.T) {
	world(t)
	key := newKey(t, "signed", nil)
	sb := create(t, key, nil)
	mux := http.NewServeMux()
	mux.HandleFunc("/", echoHandler)
	serve(t, sb.ID, 8000, mux)
	serve(t, sb.ID, 9000, http.HandlerFunc(wsEcho))

	u := signURL(t, e.url, key, sb.ID, 8000, nil)
	if d := time.Until(u.ExpiresAt); d < 59*time.Minute || d > 61*time.Minute {
		t.Errorf("default expiry in %v, want an hour", d)
	}
	prefix := e.url + "/p/"
	if !strings.HasPrefix(u.URL, prefix) || !strings.HasSuffix(u.URL, "/") {
		t.Fatalf("url %q, want %s{token}/", u.URL, prefix)
	}
	tok := strings.TrimSuffix(strings.TrimPrefix(u.URL, prefix), "/")

	t.Run("works without a key", func(t *testing.T) {
		got := call(t, "GET", u.URL+"sub/page?x=1", nil, map[string]string{"Authorization": "Basic Z3Vlc3Q6YXBw"}).echo(t)
		if got.Path != "/sub/page" || got.Query != "x=1" {
			t.Errorf("guest saw %q ? %q", got.Path, got.Query)
		}
		// Not our credential: the guest application's own.
		if a := got.Header.Get("Authorization"); a != "Basic Z3Vlc3Q6YXBw" {
			t.Errorf("guest saw Authorization %q, want the client's own", a)
		}
		if p := got.Header.Get("X-Forwarded-Prefix"); p != "/p/"+tok {
			t.Errorf("X-Forwarded-Prefix %q", p)
		}
		r := call(t, "POST", u.URL+"form", strings.NewReader("a=1"), nil)
		if got := r.echo(t); got.Method != "POST" || got.Body != "a=1" {
			t.Errorf("POST: guest saw %s %q", got.Method, got.Body)
		}
		r = call(t, "GET", strings.TrimSuffix(u.URL, "/"), nil, nil)
		if r.status != http.StatusPermanentRedirect || r.header.Get("Location") != tok+"/" {
			t.Errorf("without the slash: got %d Location %q", r.status, r.header.Get("Location"))
		}
	})
	t.Run("websocket", func(t *testing.T) {
		ws := signURL(t, e.url, key, sb.ID, 9000, map[string]any{"ttl_seconds": 600})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, _, err := websocket.Dial(ctx, wsURL(ws.URL)+"ws", nil)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.CloseNow()
		wsRoundTrip(t, c, []byte("through a signed URL"))
	})
	t.Run("expiry", func(t *testing.T) {
		before := time.Now()
		short := signURL(t, e.url, key, sb.ID, 8000, map[string]any{"ttl_seconds": 1})
		after := time.Now()
		if short.ExpiresAt.Before(before) || short.ExpiresAt.After(after.Add(2*time.Second)) {
			t.Errorf("a 1 s URL expires at %v, want 1 s after it was signed (asked %v, answered %v)", short.ExpiresAt, before, after)
		}
		var last resp
		testkit.WaitFor(t, 30*time.Second, "the 1 s URL refused", func() bool {
			last = call(t, "GET", short.URL, nil, nil)
			return last.status != 200
		})
		expect(t, last, 403, "forbidden")
		if !strings.Contains(last.message(), "expired") {
			t.Errorf("message %q does not say it expired", last.message())
		}
	})
	t.Run("tampering", func(t *testing.T) {
		b := []byte(tok)
		for _, i := range []int{0, 5, 15, len(b) / 2, len(b) - 1} {
			bad := bytes.Clone(b)
			bad[i] = map[bool]byte{true: 'A', false: 'B'}[bad[i] != 'A']
			r := call(t, "GET", prefix+string(bad)+"/", nil, nil)
			expect(t, r, 403, "forbidden")
			if !strings.Contains(r.message(), "invalid signed URL") {
				t.Errorf("byte %d changed: message %q", i, r.message())
			}
		}
		for _, bad := range []string{tok[:len(tok)-4], tok + "AAAA", "x", strings.Repeat("A", 200)} {
			expect(t, call(t, "GET", prefix+bad+"/", nil, nil), 403, "forbidden")
		}
	})
	t.Run("bad requests", func(t *testing.T) {
		path := "/v1/sandboxes/" + sb.ID + "/ports/8000/url"
		expect(t, do(t, key, "POST", path, map[string]any{"ttl_seconds": 0}), 422, "invalid")
		expect(t, do(t, key, "POST", path, map[string]any{"ttl_seconds": 24*3600 + 1}), 422, "invalid")
		expect(t, do(t, key, "POST", path, map[string]any{"ttl": 5}), 400, "bad_request")
		expect(t, do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/ports/0/url", nil), 422, "invalid")
		expect(t, do(t, "", "POST", path, nil), 401, "unauthorized")
		expect(t, do(t, newKey(t, "signed-other", nil), "POST", path, nil), 404, "not_found")
	})
	t.Run("public url from the proxy in front", func(t *testing.T) {
		r := call(t, "POST", e.url+"/v1/sandboxes/"+sb.ID+"/ports/8000/url", nil, map[string]string{
			"Authorization": "Bearer " + key, "X-Forwarded-Proto": "https", "X-Forwarded-Host": "panda.example.com"})
		var got portURL
		r.json(t, &got)
		if !strings.HasPrefix(got.URL, "https://panda.example.com/p/") {
			t.Errorf("url %q, want https://panda.example.com/p/…", got.URL)
		}
	})
	t.Run("not in the logs", func(t *testing.T) {
		// Issue 31, finding 12: the token is a credential; failures that
		// log the request's path (any 5xx at warn or error, every 4xx at
		// debug: here a refused service worker and an altered token) log
		// it redacted.
		var mu sync.Mutex
		var buf bytes.Buffer
		logw := writerFunc(func(p []byte) (int, error) {
			mu.Lock()
			defer mu.Unlock()
			return buf.Write(p)
		})
		srv2, cp2, err := newServer(rest.Config{URLSecret: []byte("a secret of the logging server"),
			ProxyHeaderTimeout: proxyHeaderTimeout, OpenAPI: []byte("openapi: 3.0.3\n"),
			Logger: slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelDebug}))}, controlplane.Config{}, e.cat, e.h)
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(srv2.Handler())
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			srv2.Shutdown()
			cp2.Shutdown(ctx)
			hs.Close()
		})
		u2 := signURL(t, hs.URL, key, sb.ID, 8000, nil)
		call(t, "GET", u2.URL+"sw.js", nil, map[string]string{"Service-Worker": "script"}) // 403 (TestPortProxyGuards)
		expect(t, call(t, "GET", strings.Replace(u2.URL, "/p/A", "/p/B", 1)+"page", nil, nil), 403, "forbidden")
		mu.Lock()
		out := buf.String()
		mu.Unlock()
		tok2 := strings.Trim(strings.TrimPrefix(u2.URL, hs.URL+"/p/"), "/")
		if strings.Contains(out, tok2[1:]) || strings.Contains(out, key) {
			t.Errorf("the log holds a signed token or the key:\n%s", out)
		}
		for _, want := range []string{"path=/p/[redacted]/sw.js", "path=/p/[redacted]/page"} {
			if !strings.Contains(out, want) {
				t.Errorf("the log lacks %s:\n%s", want, out)
			}
		}
	})
	t.Run("stopped sandbox", func(t *testing.T) {
		expect(t, do(t, key, "DELETE", "/v1/sandboxes/"+sb.ID, nil), 204, "")
		expect(t, call(t, "GET", u.URL, nil, nil), 409, "conflict")
		expect(t, do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/ports/8000/url", nil), 409, "conflict")
	})
}

// TestProxyDomain runs a second API server over the same catalog and host,
// with a proxy domain and a public URL.
func TestProxyDomain(t *testing.T) {
	world(t)
	const domain = "sbx.test"
	srv2, cp2, err := newServer(rest.Config{
		ProxyDomain: domain, PublicURL: "https://panda.example.com:8443/base",
		ProxyHeaderTimeout: proxyHeaderTimeout, OpenAPI: []byte("openapi: 3.0.3\n"), Logger: slog.New(slog.DiscardHandler),
	}, controlplane.Config{}, e.cat, e.h)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv2.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv2.Shutdown()
		cp2.Shutdown(ctx)
		hs.Close()
	})
	key := newKey(t, "domain", nil)
	sb := create(t, key, nil)
	mux := http.NewServeMux()
	mux.HandleFunc("/", echoHandler)
	serve(t, sb.ID, 8000, mux)
	serve(t, sb.ID, 9000, http.HandlerFunc(wsEcho))
	host := "8000-" + sb.ID + "." + domain

	t.Run("api key", func(t *testing.T) {
		r := call(t, "PUT", hs.URL+"/any/path?q=1", strings.NewReader("x"), map[string]string{"Host": host, "Authorization": "Bearer " + key})
		// Each port is an origin of its own: the page keeps it.
		if csp := r.header.Values("Content-Security-Policy"); !slices.Equal(csp, []string{"sandbox allow-same-origin allow-scripts allow-forms allow-popups allow-popups-to-escape-sandbox allow-modals allow-downloads"}) {
			t.Errorf("Content-Security-Policy %q, want the sandbox with allow-same-origin", csp)
		}
		got := r.echo(t)
		if got.Method != "PUT" || got.Path != "/any/path" || got.Query != "q=1" || got.Body != "x" || got.Host != host {
			t.Errorf("guest saw %+v", got)
		}
		if got.Header.Get("Authorization") != "" || got.Header.Get("X-Forwarded-Prefix") != "" || got.Header.Get("X-Forwarded-Host") != host {
			t.Errorf("guest saw headers %v", got.Header)
		}
		// Upper case and a port in Host are the same host.
		call(t, "GET", hs.URL+"/", nil, map[string]string{"Host": strings.ToUpper(host) + ":443", "Authorization": "Bearer " + key}).echo(t)
	})
	t.Run("refusals", func(t *testing.T) {
		expect(t, call(t, "GET", hs.URL+"/", nil, map[string]string{"Host": host}), 401, "unauthorized")
		other := newKey(t, "domain-other", nil)
		expect(t, call(t, "GET", hs.URL+"/", nil, map[string]string{"Host": host, "Authorization": "Bearer " + other}), 404, "not_found")
		expect(t, call(t, "GET", hs.URL+"/", nil, map[string]string{"Host": "8001-" + sb.ID + "." + domain, "Authorization": "Bearer " + key}), 502, "bad_gateway")
		expect(t, call(t, "GET", hs.URL+"/", nil, map[string]string{"Host": "8000-NOPE." + domain, "Authorization": "Bearer " + key}), 404, "not_found")
		// Other hosts are the API's.
		expect(t, call(t, "GET", hs.URL+"/healthz", nil, map[string]string{"Host": "panda.example.com"}), 200, "")
		expect(t, call(t, "GET", hs.URL+"/healthz", nil, map[string]string{"Host": "x." + host}), 200, "")
	})
	u := signURL(t, hs.URL, key, sb.ID, 8000, map[string]any{"ttl_seconds": 600})
	want := "https://" + host + ":8443/?panda_token="
	if !strings.HasPrefix(u.URL, want) {
		t.Fatalf("signed url %q, want %s…", u.URL, want)
	}
	pu, _ := url.Parse(u.URL)
	tok := pu.Query().Get("panda_token")
	t.Run("signed token and cookie", func(t *testing.T) {
		r := call(t, "GET", hs.URL+"/page?a=1&panda_token="+tok+"&b=2", nil, map[string]string{"Host": host, "X-Forwarded-Proto": "https"})
		if r.status != http.StatusFound || r.header.Get("Location") != "/page?a=1&b=2" {
			t.Fatalf("got %d Location %q, want 302 to /page?a=1&b=2", r.status, r.header.Get("Location"))
		}
		var cookie *http.Cookie
		for _, c := range (&http.Response{Header: r.header}).Cookies() {
			if c.Name == "panda_token" {
				cookie = c
			}
		}
		if cookie == nil || cookie.Value != tok || !cookie.HttpOnly || !cookie.Secure || cookie.SameSite != http.SameSiteLaxMode || cookie.Path != "/" || cookie.Domain != "" || cookie.MaxAge < 590 {
			t.Fatalf("cookie %+v, want panda_token=token, HttpOnly, Secure, SameSite=Lax, Path=/, host-only, ~600 s", cookie)
		}
		got := call(t, "GET", hs.URL+"/page?a=1", nil, map[string]string{"Host": host,
			"Cookie": "theirs=1; panda_token=" + tok + "; also=2", "Authorization": "Basic YXBwOmFwcA=="}).echo(t)
		if c := got.Header.Get("Cookie"); c != "theirs=1; also=2" {
			t.Errorf("guest saw Cookie %q, want theirs=1; also=2", c)
		}
		if a := got.Header.Get("Authorization"); a != "Basic YXBwOmFwcA==" {
			t.Errorf("guest saw Authorization %q, want the client's own", a)
		}
		// Over plain http the cookie is not Secure; a POST is proxied
		// at once, without the token.
		r = call(t, "POST", hs.URL+"/form?panda_token="+tok, strings.NewReader("f=1"), map[string]string{"Host": host})
		if got := r.echo(t); got.Query != "" || got.Body != "f=1" {
			t.Errorf("POST with the token: guest saw query %q body %q", got.Query, got.Body)
		}
		if sc := r.header.Get("Set-Cookie"); !strings.Contains(sc, "panda_token=") || strings.Contains(sc, "Secure") {
			t.Errorf("Set-Cookie over http: %q", sc)
		}
		// A token of another port, or a cookie tossed by a sibling host
		// next to ours: the other port's is refused, ours still counts.
		other := signURL(t, hs.URL, key, sb.ID, 9000, nil)
		otherTok := strings.SplitN(other.URL, "panda_token=", 2)[1]
		expect(t, call(t, "GET", hs.URL+"/?panda_token="+otherTok, nil, map[string]string{"Host": host}), 403, "forbidden")
		call(t, "GET", hs.URL+"/", nil, map[string]string{"Host": host, "Cookie": "panda_token=" + otherTok + "; panda_token=" + tok}).echo(t)
	})
	t.Run("websocket with the cookie", func(t *testing.T) {
		wsHost := "9000-" + sb.ID + "." + domain
		ws := signURL(t, hs.URL, key, sb.ID, 9000, nil)
		wsTok := strings.SplitN(ws.URL, "panda_token=", 2)[1]
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, _, err := websocket.Dial(ctx, wsURL(hs.URL)+"/socket", &websocket.DialOptions{Host: wsHost,
			HTTPHeader: http.Header{"Cookie": {"panda_token=" + wsTok}}})
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		defer c.CloseNow()
		wsRoundTrip(t, c, []byte("on the proxy domain"))
	})
	t.Run("cross-site cookie", func(t *testing.T) {
		// Issue 31, finding 8: the hosts of the proxy domain are one site,
		// so a page of another sandbox gets the cookie sent with its
		// requests; only navigations and the port's own pages may use it.
		cookie := "panda_token=" + tok
		sibling := "http://8000-" + strings.Repeat("z", 20) + "." + domain
		for _, tc := range []struct {
			name string
			hdr  map[string]string
			want int
		}{
			{"its own page", map[string]string{"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}, 200},
			{"a link followed from a sibling", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, 200},
			{"a sibling's fetch", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty", "Origin": sibling}, 403},
			{"a sibling's image", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image", "Referer": sibling + "/"}, 403},
			{"another site's fetch", map[string]string{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors", "Origin": "https://evil.example"}, 403},
			{"another port of the same sandbox", map[string]string{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors", "Origin": "http://9000-" + sb.ID + "." + domain}, 200},
			{"an old browser on a sibling", map[string]string{"Origin": sibling}, 403},
			{"a sibling's fetch with an API key", map[string]string{"Sec-Fetch-Site": "same-site", "Origin": sibling, "Authorization": "Bearer " + key}, 200},
			{"a sibling's fetch with the guest's own Authorization", map[string]string{"Sec-Fetch-Site": "same-site", "Origin": sibling, "Authorization": "Basic YXBwOmFwcA=="}, 403},
		} {
			hdr := maps.Clone(tc.hdr)
			hdr["Host"], hdr["Cookie"] = host, cookie
			r := call(t, "GET", hs.URL+"/", nil, hdr)
			if r.status != tc.want {
				t.Errorf("%s: got %d %s, want %d", tc.name, r.status, r.body, tc.want)
			}
			if tc.want == 403 && !strings.Contains(r.message(), "another site") {
				t.Errorf("%s: message %q does not say why", tc.name, r.message())
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		wsHost := "9000-" + sb.ID + "." + domain
		ws := signURL(t, hs.URL, key, sb.ID, 9000, nil)
		wsCookie := "panda_token=" + strings.SplitN(ws.URL, "panda_token=", 2)[1]
		_, res, err := websocket.Dial(ctx, wsURL(hs.URL)+"/socket", &websocket.DialOptions{Host: wsHost,
			HTTPHeader: http.Header{"Cookie": {wsCookie}, "Origin": {sibling}, "Sec-Fetch-Site": {"same-site"}, "Sec-Fetch-Mode": {"websocket"}}})
		if err == nil || res == nil || res.StatusCode != http.StatusForbidden {
			t.Errorf("a sibling's WebSocket with the cookie: %v (%+v), want 403", err, res)
		}
		c, _, err := websocket.Dial(ctx, wsURL(hs.URL)+"/socket", &websocket.DialOptions{Host: wsHost,
			HTTPHeader: http.Header{"Cookie": {wsCookie}, "Origin": {"http://" + wsHost}, "Sec-Fetch-Site": {"same-origin"}, "Sec-Fetch-Mode": {"websocket"}}})
		if err != nil {
			t.Fatalf("its own page's WebSocket: %v", err)
		}
		defer c.CloseNow()
		wsRoundTrip(t, c, []byte("from its own page"))
	})
	t.Run("expired cookie", func(t *testing.T) {
		short := signURL(t, hs.URL, key, sb.ID, 8000, map[string]any{"ttl_seconds": 1})
		shortTok := strings.SplitN(short.URL, "panda_token=", 2)[1]
		var last resp
		testkit.WaitFor(t, 30*time.Second, "the 1 s cookie refused", func() bool {
			last = call(t, "GET", hs.URL+"/", nil, map[string]string{"Host": host, "Cookie": "panda_token=" + shortTok})
			return last.status != 200
		})
		expect(t, last, 403, "forbidden")
		if !strings.Contains(last.message(), "expired") {
			t.Errorf("message %q does not say it expired", last.message())
		}
	})
	t.Run("another server's token", func(t *testing.T) {
		// srv2 has a secret of its own: the main server refuses its URLs.
		expect(t, call(t, "GET", e.url+"/p/"+tok+"/", nil, nil), 403, "forbidden")
	})
}

func TestListPorts(t *testing.T) {
	world(t)
	key := newKey(t, "ports", nil)
	sb := create(t, key, nil)
	var before struct{ Ports []struct{ Port int } }
	do(t, key, "GET", "/v1/sandboxes/"+sb.ID+"/ports", nil).json(t, &before)
	for _, p := range before.Ports {
		if p.Port == 8000 || p.Port == 9000 {
			t.Fatalf("port %d listens before anything was started: %+v", p.Port, before)
		}
	}
	// busybox httpd daemonizes: on every address, and on loopback only.
	x := run(t, key, sb.ID, map[string]any{"cmd": "mkdir -p /tmp/www && httpd -p 8000 -h /tmp/www && httpd -p 127.0.0.1:9000 -h /tmp/www"})
	if x.ExitCode != 0 {
		t.Fatalf("start listeners: %+v", x)
	}
	type port struct {
		Port    int    `json:"port"`
		Address string `json:"address"`
	}
	var got struct{ Ports []port }
	defer func() {
		if t.Failed() {
			t.Logf("last list: %+v; in the guest: %+v", got.Ports, run(t, key, sb.ID, map[string]any{"cmd": "cat /proc/net/tcp /proc/net/tcp6; ps"}))
		}
	}()
	testkit.WaitFor(t, 30*time.Second, "ports 8000 and 9000 listed", func() bool {
		r := do(t, key, "GET", "/v1/sandboxes/"+sb.ID+"/ports", nil)
		expect(t, r, 200, "")
		r.json(t, &got)
		n := 0
		for _, p := range got.Ports {
			switch {
			case p.Port == 8000 && (p.Address == "0.0.0.0" || p.Address == "::"):
				n++
			case p.Port == 9000 && p.Address == "127.0.0.1":
				n++
			}
		}
		return n == 2
	})
	for i := 1; i < len(got.Ports); i++ {
		if got.Ports[i].Port < got.Ports[i-1].Port {
			t.Errorf("not sorted by port: %+v", got.Ports)
		}
	}
	expect(t, do(t, newKey(t, "ports-other", nil), "GET", "/v1/sandboxes/"+sb.ID+"/ports", nil), 404, "not_found")
	expect(t, do(t, key, "DELETE", "/v1/sandboxes/"+sb.ID, nil), 204, "")
	expect(t, do(t, key, "GET", "/v1/sandboxes/"+sb.ID+"/ports", nil), 409, "conflict")
}

// BenchmarkPortProxy measures a small GET (a 13-byte answer) to a guest's
// port: straight to the test server, through the proxy of this test's API
// server (over its Host: the agent in process, or the host API with
// PANDA_TEST_HOST=remote), and through a second API server whose host is
// the agent behind the host API over TLS. Every client keeps its
// connections alive, as the proxy does its own to guests; the "new conn"
// cases have the guest's server close its connection after each answer,
// so that every request pays for a new connection (through the host API,
// a TLS handshake with the agent). It reports the p50 and p99 latencies of
// each, in µs:
//
//	go test ./internal/api/ -run '^$' -bench BenchmarkPortProxy -benchtime 5000x
func BenchmarkPortProxy(b *testing.B) {
	world(b)
	key := newKey(b, "bench-proxy", nil)
	sb := create(b, key, nil)
	hello := []byte("hello, proxy\n")
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.Write(hello) })
	direct := httptest.NewServer(mux)
	b.Cleanup(direct.Close)
	serve(b, sb.ID, 8000, mux)
	closing := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.Write(hello)
	})
	directClosing := httptest.NewServer(closing)
	b.Cleanup(directClosing.Close)
	serve(b, sb.ID, 8001, closing)

	// The agent behind the host API over TLS, and an API server over it.
	dir := b.TempDir()
	creds, err := hostapi.LoadOrCreateTLS(dir, []string{"127.0.0.1"})
	if err != nil {
		b.Fatal(err)
	}
	clientTLS, err := hostclient.ClientTLS(creds.CAFile)
	if err != nil {
		b.Fatal(err)
	}
	serverTLS := creds.Config.Clone()
	cert, err := serverTLS.GetCertificate(nil)
	if err != nil {
		b.Fatal(err)
	}
	serverTLS.Certificates = []tls.Certificate{*cert}
	hsrv := hostapi.NewServer(e.host, "bench-token", nil)
	hh := httptest.NewUnstartedServer(hsrv)
	hh.TLS = serverTLS
	hh.StartTLS()
	b.Cleanup(func() { hsrv.Close(); hh.Close() })
	hc, err := hostclient.Dial(hh.URL, "bench-token", hostclient.WithTLS(clientTLS))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { hc.Close() })
	srv2, cp2, err := newServer(rest.Config{OpenAPI: []byte("openapi: 3.0.3\n"), Logger: slog.New(slog.DiscardHandler)}, controlplane.Config{}, e.cat, hc)
	if err != nil {
		b.Fatal(err)
	}
	hs2 := httptest.NewServer(srv2.Handler())
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv2.Shutdown()
		cp2.Shutdown(ctx)
		hs2.Close()
	})

	path := "/v1/sandboxes/" + sb.ID + "/ports/8000/hello"
	pathClosing := "/v1/sandboxes/" + sb.ID + "/ports/8001/hello"
	this := "proxy-local"
	if os.Getenv("PANDA_TEST_HOST") == "remote" {
		this = "proxy-hostapi-http"
	}
	for _, tc := range []struct{ name, url string }{
		{"direct", direct.URL + "/hello"},
		{this, e.url + path},
		{"proxy-hostapi-tls", hs2.URL + path},
		{"direct-new-conn", directClosing.URL + "/hello"},
		{this + "-new-conn", e.url + pathClosing},
		{"proxy-hostapi-tls-new-conn", hs2.URL + pathClosing},
	} {
		b.Run(tc.name, func(b *testing.B) {
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			defer client.CloseIdleConnections()
			get := func() time.Duration {
				req, _ := http.NewRequest("GET", tc.url, nil)
				req.Header.Set("Authorization", "Bearer "+key)
				t0 := time.Now()
				res, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				body, err := io.ReadAll(res.Body)
				res.Body.Close()
				d := time.Since(t0)
				if err != nil || res.StatusCode != 200 || !bytes.Equal(body, hello) {
					b.Fatalf("GET %s: %d %q %v", tc.url, res.StatusCode, body, err)
				}
				return d
			}
			for range 50 { // warm the connections up
				get()
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				lat = append(lat, get())
			}
			b.StopTimer()
			slices.Sort(lat)
			us := func(q float64) float64 {
				return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))].Nanoseconds()) / 1e3
			}
			b.ReportMetric(us(0.50), "p50-µs")
			b.ReportMetric(us(0.99), "p99-µs")
		})
	}
}

// hostile is a guest server whose answers carry what a page would send to
// take over the origin it is served on (a service worker scope for all of
// it, clearing its storage, sniffing, its own CSP, the full URL as
// Referer), after a 103 Early Hints if ?hints=1; /sw.js counts the
// requests for it that reach the guest.
type hostile struct {
	mu  sync.Mutex
	sws int
}

func (g *hostile) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/sw.js" {
		g.mu.Lock()
		g.sws++
		g.mu.Unlock()
	}
	if r.URL.Query().Get("hints") == "1" {
		w.Header().Set("Link", "</app.css>; rel=preload; as=style")
		w.WriteHeader(http.StatusEarlyHints)
	}
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src *")
	h.Set("Service-Worker-Allowed", "/")
	h.Set("Clear-Site-Data", `"storage"`)
	h.Set("X-Content-Type-Options", "sniff")
	h.Set("Referrer-Policy", "unsafe-url")
	echoHandler(w, r)
}

func (g *hostile) workerRequests() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sws
}

// wsRecorder is a WebSocket echo server that speaks the subprotocol
// "chat" and keeps the headers of the last handshake it got.
type wsRecorder struct {
	mu   sync.Mutex
	last http.Header
}

func (g *wsRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	g.last = r.Header.Clone()
	g.mu.Unlock()
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"chat"}})
	if err != nil {
		return
	}
	defer c.CloseNow()
	for {
		typ, b, err := c.Read(r.Context())
		if err != nil {
			return
		}
		if err := c.Write(r.Context(), typ, b); err != nil {
			return
		}
	}
}

func (g *wsRecorder) lastHeader() http.Header {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.last
}

// TestPortProxyGuards replays issue 31's findings 1 and 3 against the
// proxy's two routes under the API's address: a guest's answers cannot
// take over the console's origin (the sandbox CSP, nosniff, no-referrer,
// no Service-Worker-Allowed or Clear-Site-Data, even after a 1xx answer;
// a service worker's script refused before the guest), and no credential
// of this server reaches the guest, however the client sent it (the key as
// a WebSocket subprotocol, X-API-Key, the E2B access token, a signed
// token as cookie or parameter); the key as a subprotocol counts only on
// the terminal's route.
func TestPortProxyGuards(t *testing.T) {
	world(t)
	key := newKey(t, "proxy-guards", nil)
	sb := create(t, key, nil)
	g := &hostile{}
	rec := &wsRecorder{}
	serve(t, sb.ID, 8000, g)
	serve(t, sb.ID, 9000, rec)
	withKey := e.url + "/v1/sandboxes/" + sb.ID + "/ports/8000/"
	signed := signURL(t, e.url, key, sb.ID, 8000, nil).URL

	for name, base := range map[string]string{"with a key": withKey, "signed URL": signed} {
		t.Run("answers "+name, func(t *testing.T) {
			for _, q := range []string{"", "?hints=1"} {
				r := call(t, "GET", base+q, nil, bearer(key))
				if r.status != 200 {
					t.Fatalf("GET %s%s: %d %s", base, q, r.status, r.body)
				}
				h := r.header
				if csp := h.Values("Content-Security-Policy"); !slices.Contains(csp, "default-src *") ||
					!slices.Contains(csp, "sandbox allow-scripts allow-forms allow-popups allow-popups-to-escape-sandbox allow-modals allow-downloads") {
					t.Errorf("GET %s: Content-Security-Policy %q, want the guest's and the sandbox without allow-same-origin", q, csp)
				}
				for name, want := range map[string][]string{
					"X-Content-Type-Options": {"nosniff"}, "Referrer-Policy": {"no-referrer"},
					"Service-Worker-Allowed": nil, "Clear-Site-Data": nil,
				} {
					if got := h.Values(name); !slices.Equal(got, want) {
						t.Errorf("GET %s: %s %q, want %q", q, name, got, want)
					}
				}
			}
			// A browser fetching a service worker's script says so.
			before := g.workerRequests()
			r := call(t, "GET", base+"sw.js", nil, map[string]string{"Authorization": "Bearer " + key, "Service-Worker": "script"})
			expect(t, r, 403, "forbidden")
			if !strings.Contains(r.message(), "proxy domain") {
				t.Errorf("service worker refused with %q, want it to name the proxy domain", r.message())
			}
			if g.workerRequests() != before {
				t.Error("the service worker's request reached the guest")
			}
			call(t, "GET", base+"sw.js", nil, bearer(key)).echo(t)
		})
	}

	// The sandbox's E2B access token, as the E2B SDK sends it.
	r := call(t, "POST", e.url+"/sandboxes/"+sb.ID+"/connect", strings.NewReader(`{"timeout": 600}`), map[string]string{"X-API-KEY": key, "Content-Type": "application/json"})
	var conn struct{ EnvdAccessToken string }
	r.json(t, &conn)
	if conn.EnvdAccessToken == "" {
		t.Fatalf("E2B connect: %d %s, want the access token", r.status, r.body)
	}
	// A signed token as the proxy domain takes it, cookie or parameter:
	// another port's (this one's is in X-Forwarded-Prefix of the signed
	// route: the guest is served under it).
	other := signURL(t, e.url, key, sb.ID, 9000, nil).URL
	otherTok := strings.TrimSuffix(strings.TrimPrefix(other, e.url+"/p/"), "/")
	creds := map[string]string{
		"X-Api-Key": key, "X-Access-Token": conn.EnvdAccessToken,
		"Sec-WebSocket-Protocol": "chat, bearer." + key, "Cookie": "theirs=1; panda_token=" + otherTok,
	}
	secrets := []string{key, conn.EnvdAccessToken, otherTok}
	for name, u := range map[string]string{"with a key": withKey, "signed URL": signed} {
		t.Run("credentials "+name, func(t *testing.T) {
			hdr := maps.Clone(creds)
			hdr["Authorization"] = "Bearer " + key
			r := call(t, "GET", u+"x?a=1&panda_token="+otherTok, nil, hdr)
			got := r.echo(t)
			for _, s := range secrets {
				if strings.Contains(string(r.body), s) {
					t.Errorf("the guest got a credential of the server: %s", r.body)
				}
			}
			if got.Query != "a=1" || got.Header.Get("Cookie") != "theirs=1" || got.Header.Get("Sec-WebSocket-Protocol") != "chat" {
				t.Errorf("the guest's own lost: query %q, Cookie %q, Sec-WebSocket-Protocol %q", got.Query, got.Header.Get("Cookie"), got.Header.Get("Sec-WebSocket-Protocol"))
			}
			// What is not ours stays: another X-Api-Key, another token.
			r = call(t, "GET", u+"x", nil, map[string]string{"Authorization": "Bearer " + key, "X-Api-Key": "their-key", "X-Access-Token": "their-token"})
			if got := r.echo(t); got.Header.Get("X-Api-Key") != "their-key" || got.Header.Get("X-Access-Token") != "their-token" {
				t.Errorf("the guest's own headers lost: %v", got.Header)
			}
		})
	}

	t.Run("websocket subprotocols", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		ws := signURL(t, e.url, key, sb.ID, 9000, nil).URL
		for name, dial := range map[string]struct {
			url string
			hdr http.Header
		}{
			"with a key": {wsURL(e.url) + "/v1/sandboxes/" + sb.ID + "/ports/9000/ws", http.Header{"Authorization": {"Bearer " + key}}},
			"signed URL": {wsURL(ws) + "ws", nil},
		} {
			c, res, err := websocket.Dial(ctx, dial.url, &websocket.DialOptions{HTTPHeader: dial.hdr, Subprotocols: []string{"bearer." + key, "chat"}})
			if err != nil {
				t.Fatalf("%s: dial: %v (%+v)", name, err, res)
			}
			if c.Subprotocol() != "chat" {
				t.Errorf("%s: subprotocol %q, want the guest's choice, chat", name, c.Subprotocol())
			}
			wsRoundTrip(t, c, []byte("hello"))
			c.CloseNow()
			if got := rec.lastHeader().Values("Sec-Websocket-Protocol"); !slices.Equal(got, []string{"chat"}) {
				t.Errorf("%s: the guest got Sec-WebSocket-Protocol %q, want [chat]", name, got)
			}
		}
		// The key as a subprotocol alone is no credential here.
		_, res, err := websocket.Dial(ctx, wsURL(e.url)+"/v1/sandboxes/"+sb.ID+"/ports/9000/ws", &websocket.DialOptions{Subprotocols: []string{"bearer." + key}})
		if err == nil || res == nil || res.StatusCode != http.StatusUnauthorized {
			t.Errorf("the key as a subprotocol on the port proxy: %v (%+v), want 401", err, res)
		}
		ws101 := map[string]string{"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
			"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol": "bearer." + key}
		expect(t, call(t, "GET", e.url+"/v1/sandboxes/"+sb.ID, nil, ws101), 401, "unauthorized")
	})

	t.Run("the terminal takes the key as a subprotocol", func(t *testing.T) {
		r := do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/processes", map[string]any{"cmd": "cat", "pty": map[string]int{"rows": 24, "cols": 80}})
		expect(t, r, 201, "")
		var p struct{ PID int }
		r.json(t, &p)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, res, err := websocket.Dial(ctx, fmt.Sprintf("%s/v1/sandboxes/%s/processes/%d/tty", wsURL(e.url), sb.ID, p.PID),
			&websocket.DialOptions{Subprotocols: []string{"pandastack.v1", "bearer." + key}})
		if err != nil {
			t.Fatalf("dial the terminal as a browser does: %v (%+v)", err, res)
		}
		defer c.CloseNow()
		if c.Subprotocol() != "pandastack.v1" {
			t.Errorf("subprotocol %q, want pandastack.v1", c.Subprotocol())
		}
		if err := c.Write(ctx, websocket.MessageBinary, []byte("typed\r")); err != nil {
			t.Fatal(err)
		}
		var screen []byte
		for !bytes.Contains(screen, []byte("typed")) {
			typ, b, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("read the terminal: %v; so far %q", err, screen)
			}
			if typ == websocket.MessageBinary {
				screen = append(screen, b...)
			}
		}
	})
}

// writerFunc is an io.Writer of a function.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// countingBody is a request body that counts what the server reads of it.
type countingBody struct {
	r io.Reader
	n int64
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countingBody) Close() error { return nil }

// TestUnauthenticatedBodiesUnread: a request the server refuses before it
// knows who sent it (a forged signed URL, a missing or unknown key) is
// answered without reading its body (issue 31: the server reads no body
// before it knows the sender).
func TestUnauthenticatedBodiesUnread(t *testing.T) {
	world(t)
	for _, tc := range []struct{ name, path, key string }{
		{"forged signed URL", "/p/AAAAforgedtokenAAAA/upload", ""},
		{"no key", "/v1/sandboxes/sbx0/exec", ""},
		{"unknown key", "/v1/sandboxes/sbx0/files?path=/x", "panda_notakey"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := &countingBody{r: io.LimitReader(zeros{}, 8<<20)}
			req := httptest.NewRequest("POST", tc.path, nil)
			req.Body = body
			if tc.key != "" {
				req.Header.Set("Authorization", "Bearer "+tc.key)
			}
			rec := httptest.NewRecorder()
			e.srv.Handler().ServeHTTP(rec, req)
			if rec.Code != http.StatusUnauthorized && rec.Code != http.StatusForbidden {
				t.Errorf("status %d %s, want 401 or 403", rec.Code, rec.Body)
			}
			if body.n != 0 {
				t.Errorf("the server read %d bytes of the body before refusing", body.n)
			}
		})
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }
