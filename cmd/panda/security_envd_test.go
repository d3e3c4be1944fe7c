package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// The attacks of issue 31 on the E2B envd routes (findings 2 and 10),
// replayed against the shared world: a gzip bomb sent to envd with a
// real sandbox id and a wrong token, or the right one; more envd streams
// than a sandbox's guest-request limit; and a recursive ListDir of a
// guest tree larger than the listing bound.

// bombMiB is what the bombs inflate to: 1 GiB, from about 1 MiB sent.
const bombMiB = 1024

// gzipBombOf is a gzip stream of mib MiB of zeros: a 1 MiB member,
// repeated (a multi-member stream inflates to the sum), about 1 KiB per
// MiB.
func gzipBombOf(mib int) []byte {
	var member bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&member, gzip.BestCompression)
	zw.Write(make([]byte, 1<<20))
	zw.Close()
	return bytes.Repeat(member.Bytes(), mib)
}

// connectEnvelope is one message of a Connect stream: flags (1:
// compressed, 2: end of stream), length, data.
func connectEnvelope(flags byte, data []byte) []byte {
	b := make([]byte, 5, 5+len(data))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(data)))
	return append(b, data...)
}

// envdClient sends envd requests for one sandbox, as the e2b SDK does
// with E2B_SANDBOX_URL set to the server's URL.
type envdClient struct {
	w     *secWorld
	id    string
	token string
}

// e2bToken is sandbox id's envd access token, from E2B's connect as key.
func (w *secWorld) e2bToken(t *testing.T, ctx context.Context, key, id string) string {
	t.Helper()
	code, b := w.mustDo(t, ctx, "", "POST", "/sandboxes/"+id+"/connect", map[string]any{}, http.Header{"X-Api-Key": {key}})
	var sb struct {
		Token string `json:"envdAccessToken"`
	}
	if code != http.StatusOK || json.Unmarshal(b, &sb) != nil || sb.Token == "" {
		t.Fatalf("E2B connect %s: %d %s", id, code, b)
	}
	return sb.Token
}

// post sends an envd request (token "": none) and returns the response,
// whose body the caller closes.
func (c envdClient) post(ctx context.Context, procedure, token string, stream bool, body []byte, hdr map[string]string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", c.w.URL()+procedure, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("E2b-Sandbox-Id", c.id)
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Content-Type", "application/json")
	if stream {
		req.Header.Set("Content-Type", "application/connect+json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return c.w.hc.Do(req)
}

// connectReply is a Connect response: a unary one's status and error
// code, or a stream's messages and the error code its end carries ("":
// none).
type connectReply struct {
	status   int
	code     string
	message  string
	messages []json.RawMessage
}

// readReply reads a Connect response to its end, and closes it, or a
// stream's first max messages (0: all), leaving it open.
func readReply(resp *http.Response, max int) (connectReply, error) {
	if max == 0 {
		defer resp.Body.Close()
	}
	r := connectReply{status: resp.StatusCode}
	var e struct {
		Code, Message string
	}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/connect+") {
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return r, err
		}
		if resp.StatusCode != http.StatusOK {
			if err := json.Unmarshal(b, &e); err != nil {
				return r, fmt.Errorf("error body %.200q: %v", b, err)
			}
			r.code, r.message = e.Code, e.Message
		}
		return r, nil
	}
	br := bufio.NewReader(resp.Body)
	for max == 0 || len(r.messages) < max {
		var prefix [5]byte
		if _, err := io.ReadFull(br, prefix[:]); err != nil {
			return r, fmt.Errorf("a stream without its end: %v", err)
		}
		data := make([]byte, binary.BigEndian.Uint32(prefix[1:]))
		if _, err := io.ReadFull(br, data); err != nil {
			return r, err
		}
		if prefix[0]&1 != 0 {
			zr, err := gzip.NewReader(bytes.NewReader(data))
			if err != nil {
				return r, err
			}
			if data, err = io.ReadAll(io.LimitReader(zr, 1<<20)); err != nil {
				return r, err
			}
		}
		if prefix[0]&2 == 0 {
			r.messages = append(r.messages, data)
			continue
		}
		var end struct {
			Error *struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal(data, &end); err != nil {
			return r, fmt.Errorf("end of stream %.200q: %v", data, err)
		}
		if end.Error != nil {
			r.code, r.message = end.Error.Code, end.Error.Message
		}
		return r, nil
	}
	return r, nil
}

// serverMemory is the server process's resident set (VmRSS) and its peak
// (VmHWM), in bytes.
func serverMemory(t *testing.T, pid int) (rss, hwm int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", k, v, err)
		}
		if k == "VmRSS" {
			rss = kb << 10
		} else {
			hwm = kb << 10
		}
	}
	return rss, hwm
}

// memoryGrowth runs attack and returns how far the server's peak resident
// set rose over its resident set before (the peak is reset first:
// clear_refs 5).
func memoryGrowth(t *testing.T, pid int, attack func()) int64 {
	t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		t.Fatalf("reset the server's peak RSS: %v", err)
	}
	before, _ := serverMemory(t, pid)
	attack()
	_, peak := serverMemory(t, pid)
	t.Logf("server RSS %d MiB before, peak %d MiB during", before>>20, peak>>20)
	return peak - before
}

// TestSecurityEnvd replays the attacks on envd (issue 31, findings 2 and
// 10) on one of alice's sandboxes.
func TestSecurityEnvd(t *testing.T) {
	w := security(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	sb := w.sandbox(t, ctx, w.Alice)
	c := envdClient{w: w, id: sb.ID, token: w.e2bToken(t, ctx, w.Alice, sb.ID)}
	bomb := gzipBombOf(bombMiB)
	gz := map[string]string{"Content-Encoding": "gzip", "Connect-Content-Encoding": "gzip"}
	const most = 64 << 20 // the server's memory may grow this much

	// Finding 2: whoever knows a sandbox id (ids are not secrets) sends a
	// gzip bomb with a wrong token: refused unread.
	t.Run("gzip bomb, wrong token", func(t *testing.T) {
		for _, tc := range []struct {
			procedure string
			stream    bool
			body      []byte
		}{
			{"/process.Process/Start", true, connectEnvelope(1, bomb)},
			{"/filesystem.Filesystem/ListDir", false, bomb},
		} {
			var r connectReply
			grew := memoryGrowth(t, w.PID(), func() {
				resp, err := c.post(ctx, tc.procedure, strings.Repeat("0", 64), tc.stream, tc.body, gz)
				if err != nil {
					t.Fatalf("%s: %v", tc.procedure, err)
				}
				if r, err = readReply(resp, 0); err != nil {
					t.Fatalf("%s: %v", tc.procedure, err)
				}
			})
			if r.code != "unauthenticated" || (!tc.stream && r.status != http.StatusUnauthorized) {
				t.Errorf("%s: %d %q %q, want unauthenticated (401 for a unary call)", tc.procedure, r.status, r.code, r.message)
			}
			if grew > most {
				t.Errorf("%s: the server's memory grew by %d MiB, want at most %d", tc.procedure, grew>>20, most>>20)
			}
		}
	})

	// The token proves access, not a right to unbounded memory: the same
	// bomb, and one small enough as sent to be read whole, are refused
	// without being inflated.
	t.Run("gzip bomb, right token", func(t *testing.T) {
		half := gzipBombOf(bombMiB / 2)
		for _, tc := range []struct {
			name, procedure string
			stream          bool
			body            []byte
		}{
			{"Start", "/process.Process/Start", true, connectEnvelope(1, bomb)},
			{"Start, under the cap as sent", "/process.Process/Start", true, connectEnvelope(1, half)},
			{"ListDir", "/filesystem.Filesystem/ListDir", false, bomb},
			{"ListDir, under the cap as sent", "/filesystem.Filesystem/ListDir", false, half},
		} {
			var r connectReply
			grew := memoryGrowth(t, w.PID(), func() {
				resp, err := c.post(ctx, tc.procedure, c.token, tc.stream, tc.body, gz)
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				if r, err = readReply(resp, 0); err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
			})
			if r.code != "resource_exhausted" {
				t.Errorf("%s: %d %q %q, want resource_exhausted", tc.name, r.status, r.code, r.message)
			}
			if grew > most {
				t.Errorf("%s: the server's memory grew by %d MiB, want at most %d", tc.name, grew>>20, most>>20)
			}
		}
	})

	// Finding 10: a listing is bounded in bytes, not only in entries. The
	// tree: 3 directories of 1400 files, 14 levels deep, whose names are
	// 249 bytes and paths about 4000 (each directory's listing is under
	// the guest protocol's 8 MiB; the three, about 18 MB, are over the
	// 16 MiB a listing may hold).
	t.Run("ListDir over the byte bound", func(t *testing.T) {
		script := `set -e
P=$(head -c 245 /dev/zero | tr '\0' d)
D=/tmp/lst
for i in 01 02 03 04 05 06 07 08 09 10 11 12 13 14; do D=$D/$P$i; done
mkdir -p "$D"
cd "$D"
for s in a b c; do mkdir $P$s; (cd $P$s && seq -w 1400 | sed "s/^/$P/" | xargs touch); done
echo "$D"`
		res, err := sb.Exec(ctx, pandastack.Command{Cmd: script, Timeout: 5 * time.Minute})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("make the tree: %v %+v", err, res)
		}
		dir := strings.TrimSpace(res.Stdout)
		body, _ := json.Marshal(map[string]any{"path": dir, "depth": 2})
		resp, err := c.post(ctx, "/filesystem.Filesystem/ListDir", c.token, false, body, nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := readReply(resp, 0)
		if err != nil {
			t.Fatal(err)
		}
		if r.code != "invalid_argument" || !strings.Contains(r.message, "larger than 16 MiB") {
			t.Errorf("ListDir of %d bytes of names: %d %q %.200q, want invalid_argument saying the listing is larger than 16 MiB", 3*1400*4000, r.status, r.code, r.message)
		}
		// One directory of it is listed.
		body, _ = json.Marshal(map[string]any{"path": dir, "depth": 1})
		resp, err = c.post(ctx, "/filesystem.Filesystem/ListDir", c.token, false, body, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r, err := readReply(resp, 0); err != nil || r.status != http.StatusOK {
			t.Errorf("ListDir of depth 1: %+v, %v; want 200", r, err)
		}
	})

	// Finding 10: envd streams count against the sandbox's guest-request
	// limit (32, the REST API's for exec and files): with 32 open, the
	// 33rd envd request, and a REST exec, are refused until they end.
	t.Run("guest-request limit", func(t *testing.T) {
		const limit = 32
		start, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": "/bin/sh", "args": []string{"-c", "sleep 600"}}})
		hold := map[string]string{"Connect-Timeout-Ms": "300000"}
		sctx, stop := context.WithCancel(ctx)
		var wg sync.WaitGroup
		defer func() { stop(); wg.Wait() }()
		opened := make(chan error, limit)
		for range limit {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := c.post(sctx, "/process.Process/Start", c.token, true, connectEnvelope(0, start), hold)
				if err != nil {
					opened <- err
					return
				}
				defer resp.Body.Close()
				r, err := readReply(resp, 1) // the start event: the stream is open
				if err == nil && len(r.messages) != 1 {
					err = fmt.Errorf("no start event: %+v", r)
				}
				opened <- err
				io.Copy(io.Discard, resp.Body) // held until stop
			}()
		}
		for range limit {
			if err := <-opened; err != nil {
				t.Fatalf("open a Start stream: %v", err)
			}
		}
		resp, err := c.post(ctx, "/process.Process/Start", c.token, true, connectEnvelope(0, start), hold)
		if err != nil {
			t.Fatal(err)
		}
		r, err := readReply(resp, 1) // its end, or a start event
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if r.code != "resource_exhausted" || len(r.messages) != 0 {
			t.Errorf("Start number %d: %+v, want resource_exhausted before any event", limit+1, r)
		}
		stat, _ := json.Marshal(map[string]any{"path": "/"})
		resp, err = c.post(ctx, "/filesystem.Filesystem/Stat", c.token, false, stat, nil)
		if err != nil {
			t.Fatal(err)
		}
		if r, err := readReply(resp, 0); err != nil || r.status != http.StatusTooManyRequests || r.code != "resource_exhausted" {
			t.Errorf("Stat with %d streams open: %+v, %v; want 429 resource_exhausted", limit, r, err)
		}
		if code, b := w.mustDo(t, ctx, w.Alice, "POST", "/v1/sandboxes/"+sb.ID+"/exec", map[string]any{"cmd": "true"}, nil); code != http.StatusTooManyRequests {
			t.Errorf("REST exec with %d envd streams open: %d %s, want 429", limit, code, b)
		}
		stop()
		wg.Wait()
		// The slots are given back with the streams.
		deadline := time.Now().Add(time.Minute)
		for {
			resp, err := c.post(ctx, "/filesystem.Filesystem/Stat", c.token, false, stat, nil)
			if err != nil {
				t.Fatal(err)
			}
			r, err := readReply(resp, 0)
			if err == nil && r.status == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Stat after the streams ended: %+v, %v; want 200", r, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
}
