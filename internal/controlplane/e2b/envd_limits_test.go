package e2b

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
)

// The tests of what envd requests may cost the server before and after
// they prove access to a sandbox (issue 31: findings 2 and 10, and the
// anonymous signed file URL of 12). They serve requests through
// Intercept, as the API server does, with a hand-written Backend.

// fakeBackend is the Backend of these tests: the methods they reach, and
// a nil Backend (a panic) for the rest.
type fakeBackend struct {
	Backend
	running []string   // Running
	guest   host.Guest // Guest of every sandbox; nil: not running
	slots   int        // guest-request slots of AcquireGuest
	upload  int64      // MaxUploadBytes

	mu       sync.Mutex
	held     int
	acquired int
}

func (b *fakeBackend) Running(context.Context) ([]string, error) { return b.running, nil }

func (b *fakeBackend) Guest(_ context.Context, id string) (host.Guest, error) {
	if b.guest == nil {
		return nil, errStatus(http.StatusConflict, "sandbox %s is not running", id)
	}
	return b.guest, nil
}

func (b *fakeBackend) AcquireGuest(context.Context, string) (func(), error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held >= b.slots {
		return nil, errStatus(http.StatusTooManyRequests, "sandbox has %d requests in flight, the most allowed at once", b.slots)
	}
	b.held++
	b.acquired++
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			b.held--
			b.mu.Unlock()
		})
	}, nil
}

func (b *fakeBackend) MaxUploadBytes() int64 { return b.upload }

func (b *fakeBackend) Status(err error) (int, string) {
	return http.StatusInternalServerError, err.Error()
}

// fakeGuest is a sandbox's guest: a tree whose every directory holds
// list (subdirectories among them; nil: none), and files written to the
// void.
type fakeGuest struct {
	host.Guest
	list    func(dir string) []guestproto.FileInfo
	listed  atomic.Int64 // entries handed out by ListDir
	written atomic.Int64 // bytes WriteFile read
}

func (g *fakeGuest) Stat(_ context.Context, p string) (guestproto.FileInfo, error) {
	return guestproto.FileInfo{}, guestproto.Errorf(guestproto.CodeNotFound, "%s: no such file", p)
}

func (g *fakeGuest) ListDir(_ context.Context, dir string) ([]guestproto.FileInfo, error) {
	if g.list == nil {
		return nil, nil
	}
	l := g.list(dir)
	g.listed.Add(int64(len(l)))
	return l, nil
}

func (g *fakeGuest) WriteFile(_ context.Context, _ string, r io.Reader, _ fs.FileMode) (int64, error) {
	n, err := io.Copy(io.Discard, r)
	g.written.Add(n)
	return n, err
}

// countingReader counts the bytes read from r.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// gzipBomb is a gzip stream of mib MiB of zeros: one member of 1 MiB,
// repeated (a multi-member stream inflates to the sum), about 1 KiB per
// MiB.
func gzipBomb(t testing.TB, mib int) []byte {
	t.Helper()
	var member bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&member, gzip.BestCompression)
	zw.Write(make([]byte, 1<<20))
	zw.Close()
	return bytes.Repeat(member.Bytes(), mib)
}

// envelope is a Connect streaming request's message: flags, length, data.
func envelope(flags byte, data []byte) []byte {
	b := make([]byte, 5, 5+len(data))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(data)))
	return append(b, data...)
}

const testSandbox = "sbx1"

func newTestServer(t *testing.T, b *fakeBackend) *Server {
	t.Helper()
	s, err := New(b, []byte("0123456789abcdef"), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// envdRequest is a request of the SDK's kind for one of envd's routes:
// rpc "unary" (application/json), "stream" (application/connect+json) or
// "" (a plain HTTP route), with token as X-Access-Token ("": none).
func envdRequest(method, target, rpc, token string, body io.Reader) *http.Request {
	r := httptest.NewRequest(method, target, body)
	r.Header.Set("E2b-Sandbox-Id", testSandbox)
	if token != "" {
		r.Header.Set("X-Access-Token", token)
	}
	switch rpc {
	case "unary":
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Connect-Protocol-Version", "1")
	case "stream":
		r.Header.Set("Content-Type", "application/connect+json")
		r.Header.Set("Connect-Protocol-Version", "1")
	}
	return r
}

// serve serves r through Intercept (what is not E2B's is a 418).
func serve(s *Server, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	s.Intercept(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })).ServeHTTP(w, r)
	return w
}

// rpcCode is the Connect error code of a response: the JSON body's code
// (unary), or the end-of-stream message's error code (streaming).
func rpcCode(t *testing.T, w *httptest.ResponseRecorder) (code, message string) {
	t.Helper()
	body := w.Body.Bytes()
	if strings.HasPrefix(w.Header().Get("Content-Type"), "application/connect+") {
		for len(body) >= 5 {
			n := binary.BigEndian.Uint32(body[1:5])
			flags, data := body[0], body[5:5+n]
			body = body[5+n:]
			if flags&1 != 0 {
				zr, err := gzip.NewReader(bytes.NewReader(data))
				if err != nil {
					t.Fatal(err)
				}
				if data, err = io.ReadAll(zr); err != nil {
					t.Fatal(err)
				}
			}
			if flags&2 != 0 {
				var end struct {
					Error *struct{ Code, Message string } `json:"error"`
				}
				if err := json.Unmarshal(data, &end); err != nil || end.Error == nil {
					t.Fatalf("end of stream %s: %v", data, err)
				}
				return end.Error.Code, end.Error.Message
			}
		}
		t.Fatalf("a stream without its end: %q", w.Body.String())
	}
	var e struct{ Code, Message string }
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	return e.Code, e.Message
}

// TestEnvdAuthenticatesBeforeReading replays finding 2: a gzip bomb sent
// to envd's routes with a real sandbox id and a wrong (or no) token, or a
// signed file URL with a wrong signature, is refused without a byte of
// its body being read.
func TestEnvdAuthenticatesBeforeReading(t *testing.T) {
	b := &fakeBackend{running: []string{testSandbox, "sbx2"}, guest: &fakeGuest{}, slots: 8, upload: 1 << 30}
	s := newTestServer(t, b)
	bomb := gzipBomb(t, 1024) // 1 GiB of zeros in about 1 MiB
	bad := strings.Repeat("0", 64)
	badSig := "v1_" + base64.RawStdEncoding.EncodeToString(make([]byte, 32))
	for _, tc := range []struct {
		name, method, target, rpc, token, sandboxID string
		gzip                                        bool
		status                                      int // of a plain route
	}{
		{name: "Start, wrong token", method: "POST", target: "/process.Process/Start", rpc: "stream", token: bad},
		{name: "Start, no token", method: "POST", target: "/process.Process/Start", rpc: "stream"},
		{name: "ListDir, wrong token", method: "POST", target: "/filesystem.Filesystem/ListDir", rpc: "unary", token: bad, gzip: true},
		{name: "SendInput, no token", method: "POST", target: "/process.Process/SendInput", rpc: "unary", gzip: true},
		{name: "unknown method", method: "POST", target: "/filesystem.Filesystem/Nope", rpc: "unary", token: bad},
		{name: "upload, wrong token", method: "POST", target: "/files?path=/tmp/x", token: bad, gzip: true, status: 401},
		{name: "signed upload, wrong signature", method: "POST", target: "/files?path=/tmp/x&signature=" + badSig, gzip: true, status: 401},
		{name: "signed upload, malformed signature", method: "POST", target: "/files?path=/tmp/x&signature=v1_x", status: 401},
		{name: "signed upload, expired", method: "POST", target: "/files?path=/tmp/x&signature_expiration=1&signature=" + badSig, status: 401},
		{name: "health, wrong token", method: "GET", target: "/health", token: bad, status: 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sent := bomb
			if tc.rpc == "stream" {
				sent = envelope(1, bomb)
			}
			body := &countingReader{r: bytes.NewReader(sent)}
			r := envdRequest(tc.method, tc.target, tc.rpc, tc.token, body)
			if strings.Contains(tc.target, "signature=") {
				r.Header.Del("E2b-Sandbox-Id") // as a browser sends it
			}
			if tc.gzip {
				r.Header.Set("Content-Encoding", "gzip")
				r.Header.Set("Connect-Content-Encoding", "gzip")
			}
			w := serve(s, r)
			if n := body.n.Load(); n != 0 {
				t.Errorf("read %d bytes of the body before refusing it, want 0", n)
			}
			if tc.rpc != "" {
				if code, msg := rpcCode(t, w); code != "unauthenticated" {
					t.Errorf("Connect code %q (%s), want unauthenticated", code, msg)
				}
				return
			}
			if w.Code != tc.status {
				t.Errorf("status %d (%s), want %d", w.Code, w.Body, tc.status)
			}
		})
	}
	if b.acquired != 0 {
		t.Errorf("%d guest slots taken by refused requests, want 0", b.acquired)
	}
}

// TestEnvdBodyCaps: a request that proved access still cannot make the
// server hold or inflate more than the caps: a Connect message over
// maxRPCMessage, compressed or once decompressed, is resource_exhausted,
// read no further than the cap and inflated no further than it; an
// upload is bounded by MaxUploadBytes before and after decompression.
func TestEnvdBodyCaps(t *testing.T) {
	g := &fakeGuest{}
	b := &fakeBackend{running: []string{testSandbox}, guest: g, slots: 8, upload: 1 << 20}
	s := newTestServer(t, b)
	token := s.AccessToken(testSandbox)
	big := gzipBomb(t, 2048)  // 2 GiB in about 2 MiB: over the cap as sent
	small := gzipBomb(t, 512) // 512 MiB in about 512 KiB: under it as sent
	if len(small) > maxRPCMessage {
		t.Fatalf("the small bomb is %d bytes, want it under %d", len(small), maxRPCMessage)
	}
	for _, tc := range []struct {
		name, target, rpc string
		body              []byte
		length            bool // send a Content-Length (else chunked)
	}{
		// Over the cap as sent: refused by its length, or cut at the cap.
		{"ListDir, 2 MiB with a length", "/filesystem.Filesystem/ListDir", "unary", big, true},
		{"ListDir, 2 MiB chunked", "/filesystem.Filesystem/ListDir", "unary", big, false},
		{"Start, 2 MiB envelope chunked", "/process.Process/Start", "stream", envelope(1, big), false},
		// Under it as sent, a GiB once inflated.
		{"ListDir, 512 MiB inflated", "/filesystem.Filesystem/ListDir", "unary", small, false},
		{"Start, 512 MiB inflated", "/process.Process/Start", "stream", envelope(1, small), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := &countingReader{r: bytes.NewReader(tc.body)}
			var rd io.Reader = body
			if tc.length {
				rd = io.LimitReader(body, int64(len(tc.body))) // with the length set below
			}
			r := envdRequest("POST", tc.target, tc.rpc, token, rd)
			if tc.length {
				r.ContentLength = int64(len(tc.body))
			}
			r.Header.Set("Content-Encoding", "gzip")
			r.Header.Set("Connect-Content-Encoding", "gzip")
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			w := serve(s, r)
			runtime.ReadMemStats(&after)
			code, msg := rpcCode(t, w)
			if code != "resource_exhausted" {
				t.Errorf("Connect code %q (%s), want resource_exhausted", code, msg)
			}
			// Connect names the full size when it has inflated all of it.
			if strings.Contains(msg, fmt.Sprint(512<<20)) || strings.Contains(msg, fmt.Sprint(2048<<20)) {
				t.Errorf("the message %q gives the whole inflated size: the bomb was inflated to its end", msg)
			}
			if n := body.n.Load(); n > maxRPCMessage+rpcFraming+64<<10 {
				t.Errorf("read %d bytes of the body, want at most the cap %d and a buffer", n, maxRPCMessage+rpcFraming)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
				t.Errorf("allocated %d MiB serving it, want a few", alloc>>20)
			}
		})
	}

	t.Run("upload inflating over the limit", func(t *testing.T) {
		body := &countingReader{r: bytes.NewReader(gzipBomb(t, 64))}
		r := envdRequest("POST", "/files?path=/tmp/x", "", token, body)
		r.Header.Set("Content-Type", "application/octet-stream")
		r.Header.Set("Content-Encoding", "gzip")
		w := serve(s, r)
		if w.Code != http.StatusRequestEntityTooLarge {
			t.Errorf("status %d (%s), want 413", w.Code, w.Body)
		}
		if n := g.written.Load(); n > b.upload+1 {
			t.Errorf("the guest was given %d bytes, want at most the limit %d", n, b.upload)
		}
	})
	t.Run("upload over the limit as sent", func(t *testing.T) {
		g.written.Store(0)
		body := &countingReader{r: bytes.NewReader(make([]byte, 3<<20))}
		r := envdRequest("POST", "/files?path=/tmp/x", "", token, body)
		r.Header.Set("Content-Type", "application/octet-stream")
		w := serve(s, r)
		if w.Code != http.StatusRequestEntityTooLarge {
			t.Errorf("status %d (%s), want 413", w.Code, w.Body)
		}
		if n := body.n.Load(); n > b.upload+64<<10 {
			t.Errorf("read %d bytes of the body, want at most the limit %d and a buffer", n, b.upload)
		}
	})
	if b.held != 0 {
		t.Errorf("%d guest slots still held after the requests ended", b.held)
	}
}

// TestEnvdGuestSlots replays finding 10's first half: envd requests take
// the guest-request slots the REST API's exec and files take, and one
// refused for want of a slot is answered as E2B's SDK expects
// (resource_exhausted, its RateLimitError; 429 on plain routes) without
// its body being read.
func TestEnvdGuestSlots(t *testing.T) {
	b := &fakeBackend{running: []string{testSandbox}, guest: &fakeGuest{}, slots: 0, upload: 1 << 20}
	s := newTestServer(t, b)
	token := s.AccessToken(testSandbox)
	for _, tc := range []struct{ name, method, target, rpc string }{
		{"Start", "POST", "/process.Process/Start", "stream"},
		{"ListDir", "POST", "/filesystem.Filesystem/ListDir", "unary"},
		{"upload", "POST", "/files?path=/tmp/x", ""},
		{"download", "GET", "/files?path=/tmp/x", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := &countingReader{r: strings.NewReader(`{"path":"/"}`)}
			w := serve(s, envdRequest(tc.method, tc.target, tc.rpc, token, body))
			if n := body.n.Load(); n != 0 {
				t.Errorf("read %d bytes of the body before refusing it, want 0", n)
			}
			if tc.rpc != "" {
				if code, msg := rpcCode(t, w); code != "resource_exhausted" {
					t.Errorf("Connect code %q (%s), want resource_exhausted", code, msg)
				}
				return
			}
			if w.Code != http.StatusTooManyRequests {
				t.Errorf("status %d (%s), want 429", w.Code, w.Body)
			}
		})
	}
	// With a slot free, a request takes it and gives it back.
	b.slots = 1
	w := serve(s, envdRequest("GET", "/health", "", token, nil))
	if w.Code != http.StatusNoContent || b.acquired != 1 || b.held != 0 {
		t.Errorf("health: %d %s, %d slots taken, %d held after; want 204, 1, 0", w.Code, w.Body, b.acquired, b.held)
	}
}

// TestListDirBound replays finding 10's second half: a hostile guest
// whose tree has endless directories of entries with 8 KiB names makes a
// recursive ListDir fail once it would hold maxListBytes, instead of
// holding up to 100,000 such entries (GBs); a listing under the bounds is
// answered whole. (Depth 3 is 5,550 entries, 110 MB: enough to show the
// bound, little enough for a server without it to survive the test.)
func TestListDirBound(t *testing.T) {
	long := strings.Repeat("n", 8<<10)
	g := &fakeGuest{list: func(dir string) []guestproto.FileInfo {
		l := make([]guestproto.FileInfo, 50)
		for i := range l {
			name := fmt.Sprintf("%s%02d", long, i)
			l[i] = guestproto.FileInfo{Name: name, Path: dir + "/" + name, IsDir: i < 10}
		}
		return l
	}}
	b := &fakeBackend{running: []string{testSandbox}, guest: g, slots: 8, upload: 1 << 20}
	s := newTestServer(t, b)
	token := s.AccessToken(testSandbox)
	w := serve(s, envdRequest("POST", "/filesystem.Filesystem/ListDir", "unary", token, strings.NewReader(`{"path":"/d","depth":3}`)))
	if code, msg := rpcCode(t, w); code != "invalid_argument" || !strings.Contains(msg, "larger than 16 MiB") {
		t.Errorf("Connect error %q %q, want invalid_argument saying the listing is larger than 16 MiB", code, msg)
	}
	// Entries are 8 KiB of name and 8 KiB+ of path: the bound is passed
	// within maxListBytes/16 KiB entries read, plus the directory that
	// passes it. (Not only those answered: the walk holds the listing of
	// each directory it is inside of.)
	if n, most := g.listed.Load(), int64(maxListBytes/(16<<10)+50); n > most {
		t.Errorf("the guest listed %d entries, want at most %d", n, most)
	}

	g.listed.Store(0)
	w = serve(s, envdRequest("POST", "/filesystem.Filesystem/ListDir", "unary", token, strings.NewReader(`{"path":"/d","depth":2}`)))
	var res listDirResponse
	if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &res) != nil || len(res.Entries) != 50+10*50 {
		t.Errorf("depth 2: %d, %d entries (%.200s), want 200 and 550 entries", w.Code, len(res.Entries), w.Body)
	}
}

// TestSignedURLWork replays the anonymous signed file URL of finding 12:
// what a request with a wrong signature costs. One that names its
// sandbox (E2b-Sandbox-Id) derives one token and checks one signature,
// whatever the number of running sandboxes. One that names none (the
// SDK's uploadUrl with a shared E2B_SANDBOX_URL) derives no token once
// the running sandboxes' are known — it used to derive one per running
// sandbox per request — and checks one SHA-256 per running sandbox, one
// such search at a time in the server.
func TestSignedURLWork(t *testing.T) {
	badSig := "v1_" + base64.RawStdEncoding.EncodeToString(make([]byte, 32))
	for _, n := range []int{10, 1000} {
		t.Run(fmt.Sprint(n, " running"), func(t *testing.T) {
			b := &fakeBackend{slots: 8, upload: 1 << 20}
			for i := range n {
				b.running = append(b.running, fmt.Sprintf("sbx%d", i))
			}
			s := newTestServer(t, b)
			work := func(r *http.Request) (tokens, signatures int64, id string, err error) {
				t0, s0 := s.work.tokens.Load(), s.work.signatures.Load()
				id, err = s.authenticate(r, r.Header.Get("E2b-Sandbox-Id"))
				return s.work.tokens.Load() - t0, s.work.signatures.Load() - s0, id, err
			}
			named := httptest.NewRequest("GET", "/files?path=/x&signature="+badSig, nil)
			named.Header.Set("E2b-Sandbox-Id", "sbx3")
			if tokens, sigs, _, err := work(named); err == nil || tokens != 1 || sigs != 1 {
				t.Errorf("named: %d tokens, %d signatures, err %v; want 1, 1 and a refusal", tokens, sigs, err)
			}
			anon := httptest.NewRequest("GET", "/files?path=/x&signature="+badSig, nil)
			work(anon) // learns the running sandboxes' tokens
			for range 3 {
				if tokens, sigs, _, err := work(anon); err == nil || tokens != 0 || sigs != int64(n) {
					t.Errorf("anonymous: %d tokens, %d signatures, err %v; want 0, %d and a refusal", tokens, sigs, err, n)
				}
			}
			malformed := httptest.NewRequest("GET", "/files?path=/x&signature=v1_abc", nil)
			if tokens, sigs, _, err := work(malformed); err == nil || tokens != 0 || sigs != 0 {
				t.Errorf("malformed: %d tokens, %d signatures, err %v; want 0, 0 and a refusal", tokens, sigs, err)
			}
			// A good anonymous signature finds its sandbox.
			signer := b.running[n/2]
			good := httptest.NewRequest("GET", "/files?"+url.Values{"path": {"/x"}, "signature": {fileSignature("/x", "read", "", s.AccessToken(signer), "")}}.Encode(), nil)
			if _, _, id, err := work(good); err != nil || id != signer {
				t.Errorf("good signature: %q, %v; want %q", id, err, signer)
			}
			// While a search runs, another waits for it, or for its end.
			s.search <- struct{}{}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if tokens, sigs, _, err := work(anon.WithContext(ctx)); err == nil || tokens != 0 || sigs != 0 {
				t.Errorf("while another search runs: %d tokens, %d signatures, err %v; want 0, 0 and an error", tokens, sigs, err)
			}
			<-s.search
		})
	}
}

// fileSignature is the SDK's getSignature: "v1_" and the unpadded base64
// of the SHA-256 of signatureRaw.
func fileSignature(path, op, user, token, expiration string) string {
	sum := sha256.Sum256([]byte(signatureRaw(path, op, user, token, expiration)))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}
