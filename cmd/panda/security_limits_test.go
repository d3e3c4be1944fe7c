package main

// Security regression tests of issue 31's per-tenant limits (findings 9,
// 11 and 12): one key cannot spend another's request slots, a build that
// will be refused is refused before its context is read, a revoked key's
// builds end and what it left can be purged, and event streams are
// bounded per key.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// A tenant's 40 requests with endless bodies naming another tenant's
// sandbox are each 404 at once, and the owner's exec goes through
// meanwhile (before the fix they held the sandbox's 32 slots and the
// owner got 429).
func TestSecuritySlotsOfAnotherTenant(t *testing.T) {
	w := security(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sb := w.sandbox(t, ctx, w.Alice)
	routes := []struct{ method, path string }{
		{"POST", "/exec/stream"}, {"POST", "/exec"}, {"PUT", "/files?path=/tmp/x"},
		{"POST", "/files/mkdir"}, {"POST", "/processes"}, {"POST", "/processes/1/stdin"},
	}
	const n = 40
	reqCtx, stop := context.WithCancel(ctx)
	defer stop()
	answers := make(chan string, n)
	for i := range n {
		rt := routes[i%len(routes)]
		pr, pw := io.Pipe() // nothing is ever written: a body that never ends
		defer pw.Close()
		req, err := http.NewRequestWithContext(reqCtx, rt.method, w.URL()+"/v1/sandboxes/"+sb.ID+rt.path, pr)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+w.Bob)
		req.Header.Set("Content-Type", "application/json")
		go func() {
			res, err := w.hc.Do(req)
			if err != nil {
				answers <- "no answer: " + err.Error()
				return
			}
			res.Body.Close()
			answers <- fmt.Sprint(res.StatusCode)
		}()
	}
	got := map[string]int{}
	deadline := time.After(30 * time.Second)
collect:
	for range n {
		select {
		case a := <-answers:
			got[a]++
		case <-deadline:
			break collect
		}
	}
	if got["404"] != n {
		t.Errorf("bob's %d requests with endless bodies naming alice's sandbox: %v, want all %d answered 404 at once", n, got, n)
	}
	// The owner's exec, while bob's bodies are still open.
	code, b := w.mustDo(t, ctx, w.Alice, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"cmd": "echo mine"}, nil)
	if code != http.StatusOK || !strings.Contains(string(b), `"stdout":"mine\n"`) {
		t.Errorf("alice's exec while bob's requests are open: %d %s, want 200", code, b)
	}
}

// slowContext is a multipart build request with spec as its spec part and
// a context part that never ends, read slowly: sent counts the bytes the
// client has handed to the connection, all parts included.
type slowContext struct {
	pr   *io.PipeReader
	sent atomic.Int64
}

func newSlowContext(spec string) (*slowContext, string) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		p, err := mw.CreateFormField("spec")
		if err != nil {
			pw.CloseWithError(err)
			return
		}
		io.WriteString(p, spec)
		c, err := mw.CreateFormFile("context", "context.tar")
		if err != nil {
			pw.CloseWithError(err)
			return
		}
		chunk := make([]byte, 512)
		for {
			if _, err := c.Write(chunk); err != nil {
				return // the request ended
			}
			time.Sleep(20 * time.Millisecond) // the client's pace, not synchronization: 25 KiB/s
		}
	}()
	return &slowContext{pr: pr}, mw.FormDataContentType()
}

func (s *slowContext) Read(p []byte) (int, error) {
	n, err := s.pr.Read(p)
	s.sent.Add(int64(n))
	return n, err
}

func (s *slowContext) Close() error { return s.pr.Close() }

// postSlowContext starts a build request as key whose context never ends
// (with the declared length size, if not 0); answer receives its status
// and error code once it comes.
func (w *secWorld) postSlowContext(t *testing.T, ctx context.Context, key, spec string, size int64) (*slowContext, <-chan string) {
	t.Helper()
	body, ct := newSlowContext(spec)
	t.Cleanup(func() { body.Close() })
	req, err := http.NewRequestWithContext(ctx, "POST", w.URL()+"/v1/templates", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", ct)
	if size != 0 {
		req.ContentLength = size
	}
	// The request goes over a connection of its own, its answer read
	// apart from its writes (testkit.EarlyAnswer).
	conn, err := pandatest.DialerIn(w.env.Host.Path)(ctx, "tcp", strings.TrimPrefix(w.URL(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	context.AfterFunc(ctx, func() { conn.Close() })
	answer := make(chan string, 1)
	go func() {
		res, err := testkit.EarlyAnswer(conn, req)
		if err != nil {
			answer <- "no answer: " + err.Error()
			return
		}
		defer res.Body.Close()
		var e struct{ Error struct{ Code string } }
		json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&e)
		answer <- fmt.Sprintf("%d %s", res.StatusCode, e.Error.Code)
	}()
	return body, answer
}

// A build that will be refused is refused before the server reads its
// context: bob, with two build uploads in progress, is refused a third
// (429); a name alice owns is refused on bob's spec (409); a context
// larger than the server's disk is refused on its length (507). Each
// answer comes while bob has sent a few KiB of an endless context.
func TestSecurityBuildRefusedBeforeContext(t *testing.T) {
	w := security(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// Alice owns a template (a Dockerfile with nothing to run).
	code, b := w.mustDo(t, ctx, w.Alice, "POST", "/v1/templates", map[string]any{"name": "alicetpl", "dockerfile": "FROM tiny\nENV OWNER=alice\n"}, nil)
	if code != http.StatusAccepted {
		t.Fatalf("alice's build: %d %s", code, b)
	}
	var st struct {
		ID string `json:"build_id"`
	}
	json.Unmarshal(b, &st)
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		w.do(cctx, w.Alice, "DELETE", "/v1/templates/alicetpl?force=true", nil, nil)
	})
	if final := w.waitBuild(t, ctx, st.ID); final.Status != "succeeded" {
		t.Fatalf("alice's build: %+v", final)
	}

	const few = 16 << 10
	check := func(what string, body *slowContext, answer <-chan string, want string) {
		t.Helper()
		select {
		case a := <-answer:
			if a != want {
				t.Errorf("%s: %s, want %s", what, a, want)
			}
			if n := body.sent.Load(); n > few {
				t.Errorf("%s: answered after bob sent %d bytes, want it before %d", what, n, few)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s: no answer in 30 s (bob has sent %d bytes of an endless context)", what, body.sent.Load())
		}
	}
	upCtx, stopUploads := context.WithCancel(ctx)
	defer stopUploads()
	// Bob's own name, spec checked before its context: 409 for alice's.
	body, answer := w.postSlowContext(t, upCtx, w.Bob, `{"name":"alicetpl"}`, 0)
	check("bob's build of alice's template name", body, answer, "409 conflict")
	// A context the disk cannot take, by its declared length.
	body, answer = w.postSlowContext(t, upCtx, w.Bob, `{"name":"bobbig"}`, 1<<50)
	check("bob's context of 1 PiB", body, answer, "507 insufficient_storage")
	// Two uploads in progress are bob's two builds: a third is 429. They
	// are in progress once the server receives their contexts (it has
	// checked their specs then).
	for _, name := range []string{"bobone", "bobtwo"} {
		w.postSlowContext(t, upCtx, w.Bob, `{"name":"`+name+`"}`, 0)
	}
	contexts := filepath.Join(w.DataDir(), "build-contexts", "context-*.tar")
	for {
		if m, _ := filepath.Glob(contexts); len(m) >= 2 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("bob's two build uploads did not reach the server")
		}
		time.Sleep(20 * time.Millisecond) // polling the server's context directory
	}
	body, answer = w.postSlowContext(t, upCtx, w.Bob, `{"name":"bobthree"}`, 0)
	check("bob's third build upload", body, answer, "429 too_many_requests")
	stopUploads()
}

// waitBuild polls build id (as the admin key) until it has ended, at most
// until ctx ends.
func (w *secWorld) waitBuild(t *testing.T, ctx context.Context, id string) pandastack.TemplateBuild {
	t.Helper()
	for {
		var st pandastack.TemplateBuild
		code, b := w.mustDo(t, ctx, w.AdminKey(), "GET", "/v1/templates/builds/"+id, nil, nil)
		if code != http.StatusOK || json.Unmarshal(b, &st) != nil {
			t.Fatalf("build %s: %d %s", id, code, b)
		}
		if st.Status == "succeeded" || st.Status == "failed" {
			return st
		}
		select {
		case <-ctx.Done():
			t.Fatalf("build %s is still %s", id, st.Status)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// snapshotDirs returns the directories named id under the server's data
// directory (a snapshot's files).
func snapshotDirs(dataDir, id string) []string {
	var out []string
	filepath.WalkDir(dataDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), id) {
			out = append(out, p)
			return filepath.SkipDir
		}
		if d.IsDir() && strings.Count(strings.TrimPrefix(p, dataDir), string(os.PathSeparator)) > 4 {
			return filepath.SkipDir
		}
		return nil
	})
	return out
}

// Revoking a key ends its running build (canceled, saying why), and a
// purge removes its snapshot's files from the server's disk, while
// another key's snapshot stays.
func TestSecurityRevokeEndsBuildsAndPurges(t *testing.T) {
	w := security(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	secret, id, err := w.newKey("mallory")
	if err != nil {
		t.Fatal(err)
	}
	revoked := false
	t.Cleanup(func() { // whatever happened: nothing of mallory's is left running
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if !revoked {
			w.do(cctx, w.AdminKey(), "DELETE", "/v1/keys/"+id, nil, nil)
		}
		w.do(cctx, w.AdminKey(), "POST", "/v1/keys/"+id+"/purge", nil, nil)
	})
	mallory := w.client(t, secret)
	msb, err := mallory.Create(ctx, pandastack.CreateOptions{TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	msnap, err := msb.Snapshot(ctx, "mallory's")
	if err != nil {
		t.Fatal(err)
	}
	asb := w.sandbox(t, ctx, w.Alice)
	asnap, err := asb.Snapshot(ctx, "alice's")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		w.do(cctx, w.Alice, "DELETE", "/v1/snapshots/"+asnap.ID, nil, nil)
	})
	for _, sn := range []string{msnap.ID, asnap.ID} {
		if len(snapshotDirs(w.DataDir(), sn)) == 0 {
			t.Fatalf("snapshot %s: no directory of it in the data directory", sn)
		}
	}
	code, b := w.mustDo(t, ctx, secret, "POST", "/v1/templates", map[string]any{"name": "mallorytpl", "dockerfile": "FROM tiny\nRUN sleep 600\n"}, nil)
	if code != http.StatusAccepted {
		t.Fatalf("mallory's build: %d %s", code, b)
	}
	var st pandastack.TemplateBuild
	json.Unmarshal(b, &st)
	for st.Status != "running" {
		code, b = w.mustDo(t, ctx, w.AdminKey(), "GET", "/v1/templates/builds/"+st.ID, nil, nil)
		json.Unmarshal(b, &st)
		if code != http.StatusOK || st.Status == "failed" || st.Status == "succeeded" || ctx.Err() != nil {
			t.Fatalf("mallory's build before the revoke: %d %s", code, b)
		}
		time.Sleep(50 * time.Millisecond) // polling the build's state
	}

	if code, b := w.mustDo(t, ctx, w.AdminKey(), "DELETE", "/v1/keys/"+id, nil, nil); code != http.StatusNoContent {
		t.Fatalf("revoke: %d %s", code, b)
	}
	revoked = true
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	if final := w.waitBuild(t, wctx, st.ID); final.Status != "failed" || final.Code != "canceled" || !strings.Contains(final.Error, "revoked") {
		t.Errorf("mallory's running build after the revoke: %s %s %q, want failed canceled, its key revoked", final.Status, final.Code, final.Error)
	}

	code, b = w.mustDo(t, ctx, w.AdminKey(), "POST", "/v1/keys/"+id+"/purge", nil, nil)
	var purged struct {
		SnapshotsDeleted int `json:"snapshots_deleted"`
		Failed           []any
	}
	if code != http.StatusOK || json.Unmarshal(b, &purged) != nil || purged.SnapshotsDeleted != 1 || len(purged.Failed) != 0 {
		t.Errorf("purge: %d %s, want 200 with one snapshot deleted", code, b)
	}
	if dirs := snapshotDirs(w.DataDir(), msnap.ID); len(dirs) != 0 {
		t.Errorf("mallory's snapshot after the purge: still on disk at %v", dirs)
	}
	if dirs := snapshotDirs(w.DataDir(), asnap.ID); len(dirs) == 0 {
		t.Error("alice's snapshot is gone from the disk after mallory's purge")
	}
	if code, b := w.mustDo(t, ctx, w.Alice, "GET", "/v1/snapshots/"+asnap.ID, nil, nil); code != http.StatusOK {
		t.Errorf("alice's snapshot after mallory's purge: %d %s", code, b)
	}
}

// One key's event streams are bounded; another key's still open.
func TestSecurityEventStreamsPerKey(t *testing.T) {
	w := security(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	secret, _, err := w.newKey("streamer")
	if err != nil {
		t.Fatal(err)
	}
	open := func(key string) (int, func()) {
		t.Helper()
		sctx, stop := context.WithCancel(ctx)
		req, _ := http.NewRequestWithContext(sctx, "GET", w.URL()+"/v1/events", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := w.hc.Do(req)
		if err != nil {
			stop()
			t.Fatal(err)
		}
		if res.StatusCode != http.StatusOK {
			res.Body.Close()
			stop()
			return res.StatusCode, func() {}
		}
		return res.StatusCode, func() { stop(); res.Body.Close() }
	}
	const max = 8 // max_event_streams_per_key's default
	for i := range max {
		code, closeStream := open(secret)
		if code != http.StatusOK {
			t.Fatalf("stream %d: %d", i+1, code)
		}
		defer closeStream()
	}
	if code, closeStream := open(secret); code != http.StatusTooManyRequests {
		closeStream()
		t.Errorf("stream %d of one key: %d, want 429", max+1, code)
	}
	code, closeStream := open(w.Bob)
	closeStream()
	if code != http.StatusOK {
		t.Errorf("another key's stream meanwhile: %d, want 200", code)
	}
}
