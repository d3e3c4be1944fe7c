package hostapi_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
)

// tryExec runs req through h and returns its output, or the error of
// starting or waiting for it.
func tryExec(t *testing.T, h host.Host, id string, req guestproto.ExecRequest) (execOut, error) {
	t.Helper()
	g, err := h.Guest(ctxT(t), id)
	if err != nil {
		return execOut{}, err
	}
	p, err := g.StartExec(ctxT(t), req)
	if err != nil {
		return execOut{}, err
	}
	var out, errOut bytes.Buffer
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); io.Copy(&out, p.Stdout()) }()
	go func() { defer wg.Done(); io.Copy(&errOut, p.Stderr()) }()
	wg.Wait()
	res, err := p.Wait()
	return execOut{out.String(), errOut.String(), res}, err
}

// TestLongExecRequest: an exec request's JSON line may be of any length up
// to hostwire.MaxLine (it used to fail beyond 4 KiB, a bufio.Reader's
// buffer). Through the client it does what the same request does locally,
// success or the guest's own error; beyond MaxLine it is refused, by the
// client before sending and by the server.
func TestLongExecRequest(t *testing.T) {
	world(t)
	sb := create(t, client)
	for _, tc := range []struct {
		name string
		req  guestproto.ExecRequest
		want string // stdout that must come back remotely; "" to only compare with local
	}{
		{"50 KiB command", guestproto.ExecRequest{Shell: "X='" + strings.Repeat("a", 50<<10) + "'; echo ${#X}"}, fmt.Sprintln(50 << 10)},
		// The guest's JSON escapes these 6 times over, not the host API's.
		{"9 KB of HTML characters in env", guestproto.ExecRequest{Shell: "echo ${#BIG}", Env: map[string]string{"BIG": strings.Repeat("<&>", 3000)}}, "9000\n"},
		{"100 KiB command", guestproto.ExecRequest{Shell: "X='" + strings.Repeat("b", 100<<10) + "'; echo ${#X}"}, ""},
		{"1 MiB command", guestproto.ExecRequest{Shell: "X='" + strings.Repeat("c", 1<<20) + "'; echo ${#X}"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lout, lerr := tryExec(t, local, sb.ID, tc.req)
			rout, rerr := tryExec(t, client, sb.ID, tc.req)
			if tc.want != "" && (rerr != nil || rout.stdout != tc.want) {
				t.Fatalf("remote: got %q, %v; want %q", rout.stdout, rerr, tc.want)
			}
			switch {
			case (lerr == nil) != (rerr == nil):
				t.Errorf("local %v, remote %v: want the same outcome", lerr, rerr)
			case lerr != nil:
				if lerr.Error() != rerr.Error() || errors.Is(lerr, guestproto.ErrInvalid) != errors.Is(rerr, guestproto.ErrInvalid) {
					t.Errorf("errors: local %q, remote %q; want the same", lerr, rerr)
				}
				t.Logf("local and remote both: %v", rerr)
			case lout.stdout != rout.stdout || lout.stderr != rout.stderr || lout.res.ExitCode != rout.res.ExitCode:
				t.Errorf("output: local %+v, remote %+v", lout, rout)
			}
		})
	}

	// Beyond MaxLine: the client refuses before sending.
	huge := guestproto.ExecRequest{Shell: strings.Repeat("d", hostwire.MaxLine)}
	if _, err := tryExec(t, client, sb.ID, huge); !errors.Is(err, guestproto.ErrInvalid) || !strings.Contains(err.Error(), "exceeds") {
		t.Errorf("exec request over MaxLine: got %v, want guestproto.ErrInvalid saying it exceeds the limit", err)
	}
	// And so does the server, reading no more than MaxLine of it.
	for _, tc := range []struct {
		name   string
		line   []byte
		status int
		code   string
		msg    string
	}{
		{"over MaxLine", append(append([]byte(`{"shell":"`), bytes.Repeat([]byte("e"), hostwire.MaxLine)...), "\"}\n"...), http.StatusUnprocessableEntity, "invalid", "longer than"},
		{"no newline", []byte(`{"shell":"true"}`), http.StatusUnprocessableEntity, "invalid", "malformed"},
	} {
		req, _ := http.NewRequest(http.MethodPost, hs.URL+hostwire.Prefix+"/sandboxes/"+sb.ID+"/exec", bytes.NewReader(tc.line))
		req.Header.Set("Authorization", "Bearer "+testToken)
		res, err := hc.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var eb struct {
			Error struct{ Code, Message string }
		}
		json.NewDecoder(res.Body).Decode(&eb)
		res.Body.Close()
		if res.StatusCode != tc.status || eb.Error.Code != tc.code || !strings.Contains(eb.Error.Message, tc.msg) {
			t.Errorf("%s: got %d %+v; want %d %s with %q", tc.name, res.StatusCode, eb.Error, tc.status, tc.code, tc.msg)
		}
	}
	// The sandbox carries on.
	if got := mustRun(t, client, sb.ID, "echo alive"); got != "alive\n" {
		t.Errorf("after the long requests: got %q", got)
	}
}
