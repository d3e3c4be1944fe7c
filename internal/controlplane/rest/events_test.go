package rest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// eventLine is a line of GET /v1/events, as tests read it.
type eventLine struct {
	Seq        *uint64        `json:"seq"`
	Time       time.Time      `json:"time"`
	Type       string         `json:"type"`
	ID         string         `json:"id"`
	Sandbox    map[string]any `json:"sandbox"`
	Snapshot   map[string]any `json:"snapshot"`
	StopReason string         `json:"stop_reason"`
	raw        string
}

// short is the line as the tests compare them: type, id, and a sandbox
// event's state.
func (l eventLine) short() string {
	s := l.Type + " " + l.ID
	if l.Sandbox != nil {
		s += " " + l.Sandbox["state"].(string)
	}
	if l.Type == "sandbox_deleted" {
		s += " " + l.StopReason
	}
	return s
}

// eventStream is an open GET /v1/events. Its lines' seq must increase.
type eventStream struct {
	t      *testing.T
	res    *http.Response
	lines  chan eventLine // closed at the end of the stream
	cancel context.CancelFunc
	seq    uint64 // of the last line read
}

// openEvents opens key's event stream at base and reads its hello.
func openEvents(t *testing.T, base, key string) *eventStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/events", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/x-ndjson" {
		cancel()
		t.Fatalf("GET /v1/events: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	s := &eventStream{t: t, res: res, lines: make(chan eventLine, 1024), cancel: cancel}
	go func() {
		defer close(s.lines)
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var l eventLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Errorf("event line %q: %v", sc.Text(), err)
				return
			}
			l.raw = sc.Text()
			s.lines <- l
		}
	}()
	t.Cleanup(s.close)
	if h := s.next(true); h.Type != "hello" || h.Seq == nil {
		t.Fatalf("first line %s, want hello with a seq", h.raw)
	}
	return s
}

func (s *eventStream) close() { s.cancel(); s.res.Body.Close() }

// read is the stream's next line (pings skipped unless withPings), and
// false at its end; 30 s without a line fails the test.
func (s *eventStream) read(withPings bool) (eventLine, bool) {
	s.t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-s.lines:
			if !ok {
				return l, false
			}
			if l.Seq != nil {
				if *l.Seq < s.seq || (*l.Seq == s.seq && l.Type != "hello") {
					s.t.Errorf("line %s after seq %d", l.raw, s.seq)
				}
				s.seq = *l.Seq
			}
			if l.Type == "ping" && !withPings {
				continue
			}
			return l, true
		case <-deadline:
			s.t.Fatal("no line in 30 s")
		}
	}
}

// next is read's line; the end of the stream fails the test.
func (s *eventStream) next(withPings bool) eventLine {
	s.t.Helper()
	l, ok := s.read(withPings)
	if !ok {
		s.t.Fatal("event stream ended")
	}
	return l
}

// ended waits for the end of the stream; a line before it but pings
// fails the test.
func (s *eventStream) ended() {
	s.t.Helper()
	for {
		l, ok := s.read(false)
		if !ok {
			return
		}
		s.t.Errorf("line before the end: %s", l.raw)
	}
}

// expectEvents reads len(want) events (pings skipped) and compares them
// (eventLine.short) with want; "ID" in want is replaced by id.
func (s *eventStream) expectEvents(what string, want ...string) []eventLine {
	s.t.Helper()
	var got []eventLine
	var gotShort []string
	for range want {
		l := s.next(false)
		got = append(got, l)
		gotShort = append(gotShort, l.short())
	}
	if strings.Join(gotShort, "\n") != strings.Join(want, "\n") {
		s.t.Errorf("%s: events\n%s\nwant\n%s", what, strings.Join(gotShort, "\n"), strings.Join(want, "\n"))
	}
	return got
}

// A key's stream carries its own sandboxes' and snapshots' changes, in
// order, numbered; another key's carries none of them.
func TestEventStream(t *testing.T) {
	world(t)
	keyA, keyB := newKey(t, "events-a", nil), newKey(t, "events-b", nil)
	a := openEvents(t, e.url, keyA)
	b := openEvents(t, e.url, keyB)

	sb := create(t, keyA, nil)
	got := a.expectEvents("create", "sandbox "+sb.ID+" starting", "sandbox "+sb.ID+" running")
	if s := got[1].Sandbox; s["template"] != "tiny" || s["memory"] != nil || s["expires_at"] == nil || s["network"] == nil {
		t.Errorf("sandbox event's record: %s", got[1].raw)
	}
	r, children := forkReq(t, keyA, sb.ID, 1)
	expect(t, r, 200, "")
	child := children[0]["sandbox"].(map[string]any)["id"].(string)
	a.expectEvents("fork", "sandbox "+child+" starting", "sandbox "+child+" running")
	expect(t, do(t, keyA, "POST", "/v1/sandboxes/"+sb.ID+"/pause", nil), 200, "")
	a.expectEvents("pause", "sandbox "+sb.ID+" pausing", "sandbox "+sb.ID+" paused")
	expect(t, do(t, keyA, "POST", "/v1/sandboxes/"+sb.ID+"/resume", nil), 200, "")
	a.expectEvents("resume", "sandbox "+sb.ID+" resuming", "sandbox "+sb.ID+" running")
	expect(t, do(t, keyA, "PUT", "/v1/sandboxes/"+sb.ID+"/ttl", map[string]any{"ttl_seconds": 600}), 200, "")
	if l := a.expectEvents("ttl", "sandbox "+sb.ID+" running"); l[0].Sandbox["ttl_seconds"] != 600.0 {
		t.Errorf("TTL event: %s", l[0].raw)
	}
	r = do(t, keyA, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", map[string]any{"name": "ev"})
	expect(t, r, 201, "")
	var snap struct{ ID string }
	r.json(t, &snap)
	if l := a.expectEvents("snapshot", "snapshot "+snap.ID); l[0].Snapshot["name"] != "ev" || l[0].Snapshot["sandbox_id"] != sb.ID {
		t.Errorf("snapshot event: %s", l[0].raw)
	}
	expect(t, do(t, keyA, "DELETE", "/v1/snapshots/"+snap.ID, nil), 204, "")
	a.expectEvents("snapshot delete", "snapshot_deleted "+snap.ID)
	expect(t, do(t, keyA, "DELETE", "/v1/sandboxes/"+sb.ID, nil), 204, "")
	expect(t, do(t, keyA, "DELETE", "/v1/sandboxes/"+child, nil), 204, "")
	a.expectEvents("kill", "sandbox "+sb.ID+" stopping", "sandbox_deleted "+sb.ID+" killed",
		"sandbox "+child+" stopping", "sandbox_deleted "+child+" killed")

	// B's stream: its own sandbox's events come first, none of A's
	// (which were published before).
	own := create(t, keyB, nil)
	b.expectEvents("key B", "sandbox "+own.ID+" starting", "sandbox "+own.ID+" running")

	// Pings (every 500 ms in these tests) keep the stream alive.
	if l := b.next(true); l.Type != "ping" || l.Seq != nil || l.Time.IsZero() {
		t.Errorf("got %s, want a ping", l.raw)
	}
}

// A revoked key's streams end; a client that goes away leaves no
// subscriber behind.
func TestEventStreamEnds(t *testing.T) {
	world(t)
	secret, id := newKeyWithID(t, "events-revoked", nil, false)
	s := openEvents(t, e.url, secret)
	gone := openEvents(t, e.url, secret)
	// Counted by key: other tests' streams come and go meanwhile.
	if n := e.srv.KeySubscribers(id); n != 2 {
		t.Errorf("subscribers of the key: %d, want 2", n)
	}
	gone.close()
	waitSubscribers(t, id, 1)
	expect(t, do(t, e.admin, "DELETE", "/v1/keys/"+id, nil), 204, "")
	s.ended()
	waitSubscribers(t, id, 0)
	expect(t, do(t, secret, "GET", "/v1/events", nil), 401, "unauthorized")
}

// waitSubscribers waits (at most 30 s) until key (its id) has n event
// subscribers on the server.
func waitSubscribers(t *testing.T, key string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for e.srv.KeySubscribers(key) != n {
		if time.Now().After(deadline) {
			t.Fatalf("subscribers of key %s: %d, want %d", key, e.srv.KeySubscribers(key), n)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, bounded by the deadline
	}
}

// Shutting the server down ends its event streams and refuses new ones.
func TestEventStreamShutdown(t *testing.T) {
	rs := newRoutingServer(t)
	s := openEvents(t, rs.url, rs.admin)
	rs.srv.CloseStreams()
	s.ended()
	expect(t, doAt(t, rs.url, rs.admin, "GET", "/v1/events", nil), 503, "unavailable")
}

// The command history: exec, streamed exec and background processes,
// with their exit codes; never stdin or env values; only the owner's.
func TestCommandHistoryAPI(t *testing.T) {
	world(t)
	key := newKey(t, "history", nil)
	sb := create(t, key, nil)
	run(t, key, sb.ID, map[string]any{"cmd": "echo hi"})
	run(t, key, sb.ID, map[string]any{"argv": []string{"false"}, "env": map[string]string{"TOKEN": "s3cr3t-env"}})
	run(t, key, sb.ID, map[string]any{"cmd": "cat >/dev/null", "stdin": "s3cr3t-stdin"})
	expect(t, do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/exec/stream", map[string]any{"cmd": "exit 4"}), 200, "")
	r := do(t, key, "POST", "/v1/sandboxes/"+sb.ID+"/processes", map[string]any{"cmd": "sleep 0.3; exit 3"})
	expect(t, r, 201, "")
	var proc struct{ PID int }
	r.json(t, &proc)

	type command struct {
		N          int64      `json:"n"`
		Kind       string     `json:"kind"`
		Command    string     `json:"command"`
		PID        int        `json:"pid"`
		StartedAt  time.Time  `json:"started_at"`
		FinishedAt *time.Time `json:"finished_at"`
		ExitCode   *int       `json:"exit_code"`
		DurationMS *int64     `json:"duration_ms"`
	}
	var list struct{ Commands []command }
	deadline := time.Now().Add(time.Minute)
	for {
		r = do(t, key, "GET", "/v1/sandboxes/"+sb.ID+"/commands", nil)
		expect(t, r, 200, "")
		r.json(t, &list)
		if n := len(list.Commands); n == 5 && list.Commands[4].ExitCode != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("commands: %s, want 5 with the process's exit code", r.body)
		}
		time.Sleep(50 * time.Millisecond) // polling a condition, bounded by the deadline
	}
	if strings.Contains(string(r.body), "s3cr3t") {
		t.Errorf("history holds a secret: %s", r.body)
	}
	want := []struct {
		kind, cmd string
		exit      int
	}{{"exec", "echo hi", 0}, {"exec", "false", 1}, {"exec", "cat >/dev/null", 0}, {"exec", "exit 4", 4}, {"process", "sleep 0.3; exit 3", 3}}
	for i, w := range want {
		c := list.Commands[i]
		if c.N != int64(i+1) || c.Kind != w.kind || c.Command != w.cmd || c.ExitCode == nil || *c.ExitCode != w.exit ||
			c.FinishedAt == nil || c.DurationMS == nil || c.FinishedAt.Before(c.StartedAt) {
			t.Errorf("command %d: %+v, want %s %q exiting %d", i, c, w.kind, w.cmd, w.exit)
		}
	}
	if c := list.Commands[4]; c.PID != proc.PID || *c.DurationMS < 300 {
		t.Errorf("process: %+v, want pid %d and at least 300 ms", c, proc.PID)
	}
	expect(t, do(t, newKey(t, "history-other", nil), "GET", "/v1/sandboxes/"+sb.ID+"/commands", nil), 404, "not_found")
	expect(t, do(t, key, "GET", "/v1/sandboxes/nosuch0/commands", nil), 404, "not_found")
}
