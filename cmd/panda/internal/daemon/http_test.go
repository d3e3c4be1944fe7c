package daemon

// Tests of the HTTP servers' timeouts (startServing with serveOptions) on a
// real listener, with raw clients that misbehave on purpose. The pauses
// (time.Sleep) in them are a slow client's, not synchronization. Each
// test has a server of its own and spends its time waiting on timeouts:
// they run in parallel.

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/hostclient"
	"github.com/pandastack/pandastack/internal/hostagent/hostapi"
)

// Short timeouts, so that the tests take seconds.
const (
	testHeader = 500 * time.Millisecond
	testIdle   = time.Second
	testBody   = 500 * time.Millisecond
)

func testOptions() serveOptions {
	return serveOptions{readHeader: testHeader, idle: testIdle, bodyRead: testBody}
}

// serve serves h with opts on a free port (through TLS if tlsCfg is not
// nil) until the test ends; it returns the address.
func serve(t *testing.T, h http.Handler, opts serveOptions, tlsCfg *tls.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	sv := startServing(ln, h, opts)
	t.Cleanup(sv.stop)
	return addr
}

// closedWithin reads conn until it is closed and reports how long that
// took, failing the test if it takes longer than limit.
func closedWithin(t *testing.T, conn net.Conn, limit time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	conn.SetReadDeadline(t0.Add(limit))
	_, err := io.Copy(io.Discard, conn)
	d := time.Since(t0)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after %v", limit)
	}
	return d
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	io.WriteString(w, "ok")
})

func TestSilentConnectionClosed(t *testing.T) {
	t.Parallel() // a server of its own; mostly waiting on timeouts
	addr := serve(t, okHandler, testOptions(), nil)
	d := closedWithin(t, dial(t, addr), 10*time.Second)
	if d < testHeader/2 {
		t.Errorf("a silent connection closed after %v, before the header timeout %v", d, testHeader)
	}
}

func TestSlowHeadersClosed(t *testing.T) {
	t.Parallel() // a server of its own; mostly waiting on timeouts
	addr := serve(t, okHandler, testOptions(), nil)
	c := dial(t, addr)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n")
	// A header line every 100 ms, for up to 10 s: the headers never end.
	go func() {
		for i := range 100 {
			if _, err := fmt.Fprintf(c, "X-%d: y\r\n", i); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	if d := closedWithin(t, c, 10*time.Second); d < testHeader/2 || d > 5*time.Second {
		t.Errorf("trickled headers: connection closed after %v, want about %v", d, testHeader)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestIdleKeepAliveClosed(t *testing.T) {
	t.Parallel() // a server of its own; mostly waiting on timeouts
	addr := serve(t, okHandler, testOptions(), nil)
	c := dial(t, addr)
	br := bufio.NewReader(c)
	// Two requests on the connection, then silence.
	for range 2 {
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 || string(b) != "ok" || res.Close {
			t.Fatalf("got %d %q (close %v), want 200 ok on a kept-alive connection", res.StatusCode, b, res.Close)
		}
	}
	d := closedWithin(t, c, 10*time.Second)
	// Idle, not the (shorter) header timeout.
	if d < testIdle*3/4 {
		t.Errorf("an idle connection closed after %v, before the idle timeout %v", d, testIdle)
	}
}

func TestTLSHandshakeTimeout(t *testing.T) {
	t.Parallel() // a server of its own; mostly waiting on timeouts
	creds, err := hostapi.LoadOrCreateTLS(t.TempDir(), []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, okHandler, testOptions(), creds.Config)
	// No ClientHello at all.
	closedWithin(t, dial(t, addr), 10*time.Second)
	// A real TLS client still works.
	tlsCfg, err := hostclient.ClientTLS(creds.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	defer c.CloseIdleConnections()
	res, err := c.Get("https://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Errorf("TLS request: got %d, want 200", res.StatusCode)
	}
}

// bodyResult is what a handler saw of a request body.
type bodyResult struct {
	n   int64
	err error
}

func bodyHandler(got chan<- bodyResult) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		got <- bodyResult{n, err}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d", n)
	})
}

func TestStalledBodyFails(t *testing.T) {
	t.Parallel() // a server of its own; mostly waiting on timeouts
	got := make(chan bodyResult, 1)
	addr := serve(t, bodyHandler(got), testOptions(), nil)
	c := dial(t, addr)
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
	select {
	case r := <-got:
		if !isTimeout(r.err) || r.n != 10 {
			t.Errorf("handler read %d bytes, %v; want 10 and a timeout", r.n, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a stalled body still read 10 s later")
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || res.StatusCode != http.StatusBadRequest {
		t.Fatalf("response: %v, %v; want 400", res, err)
	}
}

// A body that keeps moving is read for longer than the timeout, and a
// handler that does not read for a while is not timed meanwhile.
func TestSlowBodyWorks(t *testing.T) {
	t.Parallel() // a server of its own; mostly waiting on timeouts
	pause := make(chan struct{})
	got := make(chan bodyResult, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 1)
		if _, err := io.ReadFull(r.Body, buf); err != nil {
			got <- bodyResult{0, err}
			return
		}
		<-pause // the handler is busy for longer than the timeout
		bodyHandler(got).ServeHTTP(w, r)
	})
	addr := serve(t, h, testOptions(), nil)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/", pr)
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != 200 {
				err = fmt.Errorf("%s: %s", res.Status, b)
			}
		}
		done <- err
	}()
	pw.Write([]byte("x"))
	time.Sleep(3 * testBody) // the handler holds the body unread
	close(pause)
	// 8 chunks, each after half the timeout: 2x the timeout in all.
	for range 8 {
		pw.Write([]byte(strings.Repeat("y", 1000)))
		time.Sleep(testBody / 2)
	}
	pw.Close()
	if r := <-got; r.err != nil || r.n != 8000 {
		t.Errorf("handler read %d more bytes, %v; want 8000", r.n, r.err)
	}
	if err := <-done; err != nil {
		t.Errorf("slow upload: %v", err)
	}
}

// After its body, a handler may run and stream for far longer than every
// timeout: its context is not cancelled, its writes go through.
func TestLongStreamAfterBody(t *testing.T) {
	t.Parallel() // a server of its own; mostly waiting on timeouts
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		rc := http.NewResponseController(w)
		for i := range 5 {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(testIdle / 2):
			}
			fmt.Fprintf(w, "%d\n", i)
			rc.Flush()
		}
	})
	addr := serve(t, h, testOptions(), nil)
	res, err := http.Post("http://"+addr+"/", "text/plain", strings.NewReader("body"))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || string(b) != "0\n1\n2\n3\n4\n" {
		t.Errorf("stream of %v: got %q, %v; want 5 lines", 5*testIdle/2, b, err)
	}
}

// A request that the options say may idle (an exec's stdin) is not cut.
func TestBodyMayIdle(t *testing.T) {
	t.Parallel() // a server of its own; mostly waiting on timeouts
	opts := testOptions()
	opts.bodyMayIdle = func(r *http.Request) bool { return r.URL.Path == "/stdin" }
	got := make(chan bodyResult, 1)
	addr := serve(t, bodyHandler(got), opts, nil)
	for _, tc := range []struct {
		path    string
		timeout bool
	}{{"/stdin", false}, {"/upload", true}} {
		c := dial(t, addr)
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab", tc.path)
		time.Sleep(3 * testBody)
		io.WriteString(c, "cd")
		r := <-got
		if gotTimeout := isTimeout(r.err); gotTimeout != tc.timeout || !tc.timeout && r.n != 4 {
			t.Errorf("%s paused for %v: read %d bytes, %v; want timeout %v", tc.path, 3*testBody, r.n, r.err, tc.timeout)
		}
	}
}

func TestConfigTimeouts(t *testing.T) {
	cfg := Defaults()
	if o := cfg.serveOptions(nil); o.readHeader != 10*time.Second || o.idle != 2*time.Minute || o.bodyRead != time.Minute {
		t.Errorf("default timeouts: got %+v", o)
	}
	path := t.TempDir() + "/panda.yaml"
	os.WriteFile(path, []byte("http_read_header_timeout: 3s\nhttp_idle_timeout: 0s\nhttp_body_read_timeout: 90s\n"), 0o600)
	if err := cfg.LoadFile(path); err != nil {
		t.Fatal(err)
	}
	if o := cfg.serveOptions(nil); o.readHeader != 3*time.Second || o.idle != 0 || o.bodyRead != 90*time.Second {
		t.Errorf("timeouts from %s: got %+v", path, o)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("validate: %v", err)
	}
	cfg.HTTPBodyReadTimeout = Duration(-time.Second)
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "http_body_read_timeout") {
		t.Errorf("negative timeout: got %v, want an error naming http_body_read_timeout", err)
	}
}

// The agent's certificate names what a server may dial it by.
func TestAgentCertHosts(t *testing.T) {
	host, _ := os.Hostname()
	for _, tc := range []struct {
		listen string
		extra  []string
		want   []string
	}{
		{"127.0.0.1:7789", nil, []string{"localhost", "127.0.0.1", "::1"}},
		{"10.1.2.3:7789", []string{"agent.example", "10.1.2.3"}, []string{"10.1.2.3", "agent.example"}},
		{"0.0.0.0:7789", nil, []string{"127.0.0.1"}},
	} {
		got := agentCertHosts(tc.listen, tc.extra)
		for _, w := range append(tc.want, host) {
			if !contains(got, w) {
				t.Errorf("listen %s, extra %v: got %v, want it to have %s", tc.listen, tc.extra, got, w)
			}
		}
		seen := map[string]bool{}
		for _, h := range got {
			if seen[h] {
				t.Errorf("listen %s: %s twice in %v", tc.listen, h, got)
			}
			seen[h] = true
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestAgentEndpoint(t *testing.T) {
	cfg := ServerDefaults()
	cfg.DataDir = "/d"
	eps := cfg.Agents()
	if len(eps) != 1 || eps[0] != (AgentEndpoint{URL: "https://127.0.0.1:7789", TokenFile: "/d/agent.token", CAFile: "/d/agent-ca.pem"}) {
		t.Errorf("default agents: got %+v", eps)
	}
	for _, tc := range []struct {
		url, wantErr string
	}{
		{"https://10.0.0.5:7789", ""},
		{"https://agent.example:7789/prefix", ""},
		{"http://127.0.0.1:7789", "TLS only: use https://127.0.0.1:7789"},
		{"ftp://x", "want https://"},
		{"https://", "want https://"},
		{"", "agent_url is required"},
	} {
		err := AgentEndpoint{URL: tc.url}.check()
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("agent url %q: got %v, want error %q", tc.url, err, tc.wantErr)
		}
	}
}

// RunServer refuses a plain http:// agent before it touches anything.
func TestRunServerRefusesPlainHTTP(t *testing.T) {
	cfg := ServerDefaults()
	cfg.DataDir = t.TempDir()
	cfg.Listen = "127.0.0.1:0"
	cfg.AgentURL = "http://127.0.0.1:7789"
	err := RunServer(context.Background(), cfg, "test", nil, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "TLS only") {
		t.Errorf("RunServer with an http:// agent: got %v, want a refusal", err)
	}
}

func TestServerLogLevels(t *testing.T) {
	var buf strings.Builder
	l := serverLog{slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	fmt.Fprintln(l, "http: TLS handshake error from 127.0.0.1:5000: EOF")
	fmt.Fprintln(l, "http: TLS handshake error from 127.0.0.1:5001: remote error: tls: bad certificate")
	got := buf.String()
	if !strings.Contains(got, "level=DEBUG msg=\"http server\" err=\"http: TLS handshake error from 127.0.0.1:5000: EOF\"") ||
		!strings.Contains(got, "level=WARN msg=\"http server\" err=\"http: TLS handshake error from 127.0.0.1:5001: remote error: tls: bad certificate\"") {
		t.Errorf("got log:\n%s\nwant a bare EOF at debug, a bad certificate at warn", got)
	}
}
