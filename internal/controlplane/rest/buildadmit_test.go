package rest_test

// Build admission (issue 31, finding 11): a build request that will be
// refused is refused before its context is read, however large it is.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/pandastack/pandastack/internal/hostagent/template/build"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// bodyCounter counts the bytes the API's handlers read of request bodies.
type bodyCounter struct{ n atomic.Int64 }

func (c *bodyCounter) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = countedBody{r.Body, &c.n}
		h.ServeHTTP(w, r)
	})
}

type countedBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (b countedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

// endless is a multipart build request: the spec part, then a context
// part that never ends. It sends 128 KiB of the context (four times what a
// refusal may read), then nothing more until it is closed, like a slow
// client: a client that kept writing into a connection the server is
// closing would race its own write errors against reading the answer.
func endless(spec string) (io.ReadCloser, string) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	stop := make(chan struct{})
	go func() {
		p, err := mw.CreateFormField("spec")
		if err != nil { // the request ended before its first part
			pw.CloseWithError(err)
			return
		}
		io.WriteString(p, spec)
		c, err := mw.CreateFormFile("context", "context.tar")
		if err != nil {
			pw.CloseWithError(err)
			return
		}
		chunk := make([]byte, 1<<10)
		for range 128 {
			if _, err := c.Write(chunk); err != nil {
				return // the request ended
			}
		}
		<-stop
		pw.CloseWithError(io.ErrClosedPipe)
	}()
	return &stoppingReader{pr, stop, sync.Once{}}, mw.FormDataContentType()
}

// stoppingReader is endless's body: closing it ends the writer.
type stoppingReader struct {
	*io.PipeReader
	stop chan struct{}
	once sync.Once
}

func (r *stoppingReader) Close() error {
	r.once.Do(func() { close(r.stop) })
	return r.PipeReader.Close()
}

// postEndless sends an endless build request as key (with the declared
// length size, if not 0) and returns the answer's status and code.
func postEndless(t *testing.T, b *buildServer, key, spec string, size int64) (int, string) {
	t.Helper()
	body, ct := endless(spec)
	defer body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", b.url+"/v1/templates", body)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", ct)
	if size != 0 {
		req.ContentLength = size
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", strings.TrimPrefix(b.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := testkit.EarlyAnswer(conn, req)
	if err != nil {
		t.Fatalf("endless build request %s: no answer: %v", spec, err)
	}
	defer resp.Body.Close()
	var out struct {
		Error struct{ Code, Message string }
	}
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out.Error.Code
}

func TestBuildAdmittedBeforeItsContext(t *testing.T) {
	var read bodyCounter
	b := newBuildServerWrapped(t, 2, func(_ *build.Config, ac *rest.Config, pc *controlplane.Config) {
		ac.TemplateContextDir = t.TempDir()
		ac.TemplateContextMaxBytes = 64 << 20
		pc.MaxTemplateVersions = 2
	}, read.wrap)
	ctx := context.Background()
	_, other, err := rest.NewKey(ctx, b.cat, "other", false, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	build := func(key, name, src string) string {
		t.Helper()
		resp, out := b.do(t, key, "POST", "/v1/templates", fmt.Sprintf(`{"name":%q,"from_image":%q}`, name, src))
		if resp.StatusCode != 202 {
			t.Fatalf("build %s from %s: %d %v", name, src, resp.StatusCode, out)
		}
		return out["build_id"].(string)
	}
	// few is what a refusal after the spec part may have read: the part
	// headers and the multipart reader's buffer, never the context.
	const few = 32 << 10
	for _, tc := range []struct {
		name    string
		setup   func() (cleanup func())
		key     string
		spec    string
		size    int64
		status  int
		code    string
		maxRead int64
	}{
		{
			name: "over the key's builds in progress",
			setup: func() func() {
				ids := []string{build(b.user, "h1", "r.example/hang:1"), build(b.user, "h2", "r.example/hang:2")}
				return func() {
					for _, id := range ids {
						b.builds.Cancel(ctx, id, "test")
						b.waitBuild(t, id)
					}
				}
			},
			key: b.user, spec: `{"name":"third"}`, status: 429, code: "too_many_requests", maxRead: 0,
		},
		{
			name: "another key's name",
			setup: func() func() {
				b.waitBuild(t, build(other, "theirs", "r.example/app:1"))
				return func() {}
			},
			key: b.user, spec: `{"name":"theirs"}`, status: 409, code: "conflict", maxRead: few,
		},
		{
			name: "over the key's templates",
			setup: func() func() {
				b.waitBuild(t, build(b.user, "t1", "r.example/app:1"))
				b.waitBuild(t, build(b.user, "t2", "r.example/app:1"))
				return func() {}
			},
			key: b.user, spec: `{"name":"t3"}`, status: 429, code: "template_limit", maxRead: few,
		},
		{
			name: "a rebuild over the template's versions",
			setup: func() func() {
				b.waitBuild(t, build(b.user, "t1", "r.example/app:2"))
				return func() {}
			},
			key: b.user, spec: `{"name":"t1"}`, status: 429, code: "template_limit", maxRead: few,
		},
		{
			name:  "a context larger than the disk's free space",
			setup: func() func() { return func() {} },
			key:   b.admin, spec: `{"name":"big"}`, size: 1 << 50, status: 507, code: "insufficient_storage", maxRead: 0,
		},
	} {
		cleanup := tc.setup()
		before := read.n.Load()
		status, code := postEndless(t, b, tc.key, tc.spec, tc.size)
		if n := read.n.Load() - before; status != tc.status || code != tc.code || n > tc.maxRead {
			t.Errorf("%s: %d %s after reading %d bytes of an endless context, want %d %s after at most %d",
				tc.name, status, code, n, tc.status, tc.code, tc.maxRead)
		}
		cleanup()
	}
	// Within its bounds the key's build goes through, context and all.
	body, ct := multipartBody(t, part{"spec", `{"name":"t2","from_image":"r.example/app:3"}`})
	req, _ := http.NewRequest("POST", b.url+"/v1/templates", body)
	req.Header.Set("Authorization", "Bearer "+b.user)
	req.Header.Set("Content-Type", ct)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 202 {
		t.Errorf("a rebuild within the bounds: %d, want 202", resp.StatusCode)
	}
}
