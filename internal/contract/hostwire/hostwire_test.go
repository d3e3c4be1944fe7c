package hostwire_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/errs"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/hostwire"
	"github.com/pandastack/pandastack/internal/contract/netpolicy"
	"github.com/pandastack/pandastack/internal/contract/templates"
)

// ts is the time of the encodings below.
var ts = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// TestEncodings: the wire types encode exactly as they did when they were
// hostapi's own (the literals were taken from that code), so that agents
// and servers of adjacent versions read each other.
func TestEncodings(t *testing.T) {
	_, notFound := hostwire.EncodeError(fmt.Errorf("kill: %w", host.ErrNotFound))
	info := hostwire.Info{Defaults: templates.Params{Name: "tiny", MemoryMiB: 256, VCPUs: 1}, NetworkOff: true}
	line := "l1"
	bs := hostwire.BuildStatusOf(builds.Status{ID: "b1", CreatedAt: ts})
	for _, tc := range []struct {
		name string
		v    any
		want string
	}{
		{"create", hostwire.CreateRequestOf(host.CreateRequest{ID: "sb1", Template: "tiny", MemoryMiB: 256, VCPUs: 1, Env: map[string]string{"A": "b"},
			SnapshotID: "sn1", Owner: "k1", Network: netpolicy.Policy{Internet: true, AllowOut: []string{"10.0.0.0/8"}}, Progress: func(string) {}}),
			`{"id":"sb1","template":"tiny","memory_mib":256,"vcpus":1,"env":{"A":"b"},"snapshot_id":"sn1","owner":"k1","network":{"internet":true,"allow_out":["10.0.0.0/8"]}}`},
		{"create, least", hostwire.CreateRequest{ID: "sb1"}, `{"id":"sb1","network":{"internet":false}}`},
		{"pull", hostwire.PullRequest{Create: hostwire.CreateRequest{ID: "sb2"}, From: host.PackSource{URL: "https://h:1", CACert: "PEM", Ticket: "v1.x"}},
			`{"create":{"id":"sb2","network":{"internet":false}},"from":{"url":"https://h:1","ca_cert":"PEM","ticket":"v1.x"}}`},
		{"pack create", hostwire.PackCreateResponse{Sandbox: host.Info{ID: "sb2", CreatedAt: ts}, Snapshot: host.SnapshotInfo{ID: "sn1"}},
			`{"sandbox":{"id":"sb2","template":"","memory_mib":0,"vcpus":0,"state":"","created_at":"2025-01-02T03:04:05Z","pid":0,"hostname":""},"snapshot":{"id":"sn1","sandbox_id":"","template":"","spec":{"MemoryMiB":0,"VCPUs":0},"created_at":"0001-01-01T00:00:00Z","capture":{"paused_ms":0,"dirty_bytes":0,"runs":0},"size_bytes":0}}`},
		{"fork", hostwire.ForkReply{Children: []hostwire.ForkChild{{Info: host.Info{ID: "c1", CreatedAt: ts}}, {Error: &notFound}}, Capture: host.CaptureStats{PausedMS: 1.5, DirtyBytes: 4096, Runs: 2}},
			`{"children":[{"info":{"id":"c1","template":"","memory_mib":0,"vcpus":0,"state":"","created_at":"2025-01-02T03:04:05Z","pid":0,"hostname":""}},{"info":{"id":"","template":"","memory_mib":0,"vcpus":0,"state":"","created_at":"0001-01-01T00:00:00Z","pid":0,"hostname":""},"error":{"code":"not_found","message":"kill: not found"}}],"capture":{"paused_ms":1.5,"dirty_bytes":4096,"runs":2}}`},
		{"fork request", hostwire.ForkRequest{IDs: []string{"a", "b"}}, `{"ids":["a","b"]}`},
		{"create with volumes", hostwire.CreateRequest{ID: "sb1", Volumes: []host.VolumeMount{{Volume: "vol_aaaaaaaaaaaaaaaa", Path: "/mnt/d", ReadOnly: true}}},
			`{"id":"sb1","network":{"internet":false},"volumes":[{"volume":"vol_aaaaaaaaaaaaaaaa","path":"/mnt/d","read_only":true}]}`},
		{"volume request", hostwire.VolumeRequest{ID: "vol_aaaaaaaaaaaaaaaa", LimitBytes: 4096}, `{"id":"vol_aaaaaaaaaaaaaaaa","limit_bytes":4096}`},
		{"volume info", host.VolumeInfo{ID: "vol_aaaaaaaaaaaaaaaa", LimitBytes: 8192, UsedBytes: 4096, CreatedAt: ts},
			`{"id":"vol_aaaaaaaaaaaaaaaa","limit_bytes":8192,"used_bytes":4096,"created_at":"2025-01-02T03:04:05Z"}`},
		{"branch request", hostwire.BranchRequest{To: "vol_b"}, `{"to":"vol_b"}`},
		{"promote request", hostwire.PromoteRequest{Target: "vol_a"}, `{"target":"vol_a"}`},
		{"fork volumes", hostwire.ForkVolumesRequest{Children: hostwire.ForkSpecsOf([]host.ForkSpec{{ID: "c1"},
			{ID: "c2", Volumes: []host.VolumeMount{{Volume: "vol_b", Path: "/d"}}, Branches: []host.VolumeBranch{{From: "vol_a", To: "vol_b"}}}})},
			`{"children":[{"id":"c1","volumes":null},{"id":"c2","volumes":[{"volume":"vol_b","path":"/d"}],"branches":[{"from":"vol_a","to":"vol_b"}]}]}`},
		{"snapshot request", hostwire.SnapshotRequest{SnapshotID: "sn1"}, `{"snapshot_id":"sn1"}`},
		{"lookup", hostwire.LookupReply{Template: &templates.Meta{Params: templates.Params{Name: "tiny", MemoryMiB: 256, VCPUs: 1}, BakedAt: ts}, StaleReason: "old"},
			`{"template":{"name":"tiny","memory_mib":256,"vcpus":1,"accel":"","cmdline":"","inputs":null,"baked_at":"2025-01-02T03:04:05Z","bake_ms":0,"boot_id":"","disk_mib":0},"stale_reason":"old"}`},
		{"progress", hostwire.ProgressEvent{Type: hostwire.ProgressLine, Message: "booting"}, `{"type":"progress","message":"booting"}`},
		{"progress done", hostwire.ProgressEvent{Type: hostwire.ProgressDone, Info: &host.Info{ID: "sb", CreatedAt: ts}},
			`{"type":"done","info":{"id":"sb","template":"","memory_mib":0,"vcpus":0,"state":"","created_at":"2025-01-02T03:04:05Z","pid":0,"hostname":""}}`},
		{"progress error", hostwire.ProgressEvent{Type: hostwire.ProgressError, Error: &notFound}, `{"type":"error","error":{"code":"not_found","message":"kill: not found"}}`},
		{"path", hostwire.PathRequest{Path: "/a"}, `{"path":"/a"}`},
		{"rename", hostwire.RenameRequest{From: "/a", To: "/b"}, `{"from":"/a","to":"/b"}`},
		{"write", hostwire.WriteReply{Written: 7}, `{"written":7}`},
		{"start", hostwire.StartFrame{PID: 42}, `{"pid":42}`},
		{"error body", hostwire.ErrorBody{Error: notFound}, `{"error":{"code":"not_found","message":"kill: not found"}}`},
		{"info", info, `{"accel":"","defaults":{"name":"tiny","memory_mib":256,"vcpus":1},"resources":{"vcpus":0,"memory_mib":0,"memory_available_mib":0},"network_off":true}`},
		{"hello", hostwire.Event{Type: hostwire.EventHello, Info: &info},
			`{"type":"hello","info":{"accel":"","defaults":{"name":"tiny","memory_mib":256,"vcpus":1},"resources":{"vcpus":0,"memory_mib":0,"memory_available_mib":0},"network_off":true}}`},
		{"exit", hostwire.Event{Type: hostwire.EventExit, ID: "sb", Reason: hostwire.ReasonShutdown, Error: "stopped"}, `{"type":"exit","id":"sb","reason":"host_shutdown","error":"stopped"}`},
		{"exit by itself", hostwire.Event{Type: hostwire.EventExit, ID: "sb", Reason: hostwire.ReasonExited}, `{"type":"exit","id":"sb","reason":"vmm_exited"}`},
		{"ping", hostwire.Event{Type: hostwire.EventPing}, `{"type":"ping"}`},
		{"build spec", hostwire.BuildSpecOf(builds.Spec{Name: "n", FromImage: "alpine", Dockerfile: []byte("FROM x"), BuildArgs: map[string]string{"A": "1"},
			Startup: templates.Startup{StartCmd: "s"}, Owner: "o", MaxTemplates: 1, MaxBuilds: 2, MaxVersions: 3, ID: "b1", Version: 4, ContextTar: "/tmp/ctx.tar"}),
			`{"name":"n","from_image":"alpine","dockerfile":"RlJPTSB4","build_args":{"A":"1"},"startup":{"start_cmd":"s"},"owner":"o","max_templates":1,"max_builds":2,"max_versions":3,"id":"b1","version":4}`},
		{"build status", hostwire.BuildStatusOf(builds.Status{ID: "b1", Name: "n", Source: "alpine", State: "running", CreatedAt: ts, Owner: "o", HostID: "h"}),
			`{"build_id":"b1","name":"n","from_image":"alpine","status":"running","created_at":"2025-01-02T03:04:05Z","host_id":"h","owner":"o"}`},
		{"user template", hostwire.UserTemplateOf(templates.UserRootFS{Name: "n", Source: "alpine", BuiltAt: ts, Version: 2, DiskBytes: 99, Startup: templates.Startup{ReadyCmd: "r"}}),
			`{"name":"n","source":"alpine","image":{},"ready_cmd":"r","size_bytes":0,"built_at":"2025-01-02T03:04:05Z","build_ms":0,"version":2,"disk_bytes":99}`},
		{"build log line", hostwire.BuildLogEvent{Line: &line}, `{"line":"l1"}`},
		{"build log status", hostwire.BuildLogEvent{Status: &bs}, `{"status":{"build_id":"b1","name":"","from_image":"","status":"","created_at":"2025-01-02T03:04:05Z"}}`},
		{"build log error", hostwire.BuildLogEvent{Error: &notFound}, `{"error":{"code":"not_found","message":"kill: not found"}}`},
		{"attach", hostwire.AttachFrame{Proc: guestproto.ProcInfo{PID: 3}},
			`{"start":{"stdout_offset":0,"stderr_offset":0},"proc":{"pid":3,"cmd":"","state":"","started_unix_nano":0,"stdin_open":false,"stdout_end":0,"stderr_end":0,"stdout_dropped":0,"stderr_dropped":0}}`},
		{"attach end", hostwire.AttachEndFrame{Proc: guestproto.ProcInfo{PID: 3}, Lagged: true},
			`{"proc":{"pid":3,"cmd":"","state":"","started_unix_nano":0,"stdin_open":false,"stdout_end":0,"stderr_end":0,"stdout_dropped":0,"stderr_dropped":0},"lagged":true}`},
		{"signal", hostwire.SignalRequest{Signal: "TERM"}, `{"signal":"TERM"}`},
		{"resize", hostwire.ResizeRequest{Rows: 24, Cols: 80}, `{"rows":24,"cols":80}`},
		{"watch event", hostwire.WatchLine{WatchEvent: guestproto.WatchEvent{Type: "create", Path: "/a"}}, `{"type":"create","path":"/a"}`},
		{"watch end", hostwire.WatchLine{WatchEvent: guestproto.WatchEvent{Type: hostwire.WatchEnd}}, `{"type":"end"}`},
		{"watch error", hostwire.WatchLine{WatchEvent: guestproto.WatchEvent{Type: hostwire.WatchError}, Error: &notFound},
			`{"type":"error","error":{"code":"not_found","message":"kill: not found"}}`},
	} {
		b, err := json.Marshal(tc.v)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if string(b) != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, b, tc.want)
		}
	}
}

// TestConversions: what a side puts on the wire, the other gets back,
// with what the contract's own encoding leaves out (owners, disk bytes).
func TestConversions(t *testing.T) {
	req := host.CreateRequest{ID: "sb1", Template: "tiny", MemoryMiB: 256, VCPUs: 2, Env: map[string]string{"A": "b"}, SnapshotID: "sn1", Owner: "k1",
		Network: netpolicy.Policy{DenyOut: []string{"10.0.0.0/8"}}}
	var wire hostwire.CreateRequest
	roundTrip(t, hostwire.CreateRequestOf(req), &wire)
	if got := wire.Contract(); fmt.Sprint(got) != fmt.Sprint(req) {
		t.Errorf("create request: got %+v, want %+v", got, req)
	}
	req.Volumes = []host.VolumeMount{{Volume: "vol_aaaaaaaaaaaaaaaa", Path: "/mnt/d"}}
	wire = hostwire.CreateRequest{}
	roundTrip(t, hostwire.CreateRequestOf(req), &wire)
	if got := wire.Contract(); fmt.Sprint(got) != fmt.Sprint(req) {
		t.Errorf("create request with volumes: got %+v, want %+v", got, req)
	}
	specs := []host.ForkSpec{{ID: "c1"}, {ID: "c2", Volumes: []host.VolumeMount{}}, {ID: "c3", Volumes: []host.VolumeMount{{Volume: "vol_b", Path: "/d"}},
		Branches: []host.VolumeBranch{{From: "vol_a", To: "vol_b"}}}}
	var wf hostwire.ForkVolumesRequest
	roundTrip(t, hostwire.ForkVolumesRequest{Children: hostwire.ForkSpecsOf(specs)}, &wf)
	got := wf.Contract()
	if fmt.Sprintf("%#v", got) != fmt.Sprintf("%#v", specs) {
		t.Errorf("fork specs: got %#v, want %#v", got, specs)
	}

	st := builds.Status{ID: "b1", Name: "n", State: builds.StateRunning, CreatedAt: ts, Owner: "o"}
	var ws hostwire.BuildStatus
	roundTrip(t, hostwire.BuildStatusOf(st), &ws)
	if got := ws.Contract(); got.Owner != "o" || got.ID != "b1" || !got.CreatedAt.Equal(ts) {
		t.Errorf("build status: got %+v, want %+v", got, st)
	}

	spec := builds.Spec{Name: "n", Dockerfile: []byte("FROM x"), Owner: "o", MaxVersions: 3, ID: "b1", Version: 4, ContextTar: "/tmp/ctx.tar"}
	var wspec hostwire.BuildSpec
	roundTrip(t, hostwire.BuildSpecOf(spec), &wspec)
	want := spec
	want.ContextTar = "" // the request's own part
	if got := wspec.Contract(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("build spec: got %+v, want %+v", got, want)
	}

	var wu []hostwire.UserTemplate
	roundTrip(t, hostwire.UserTemplatesOf([]templates.UserRootFS{{Name: "n", Version: 2, DiskBytes: 99}}), &wu)
	if len(wu) != 1 || wu[0].Contract().DiskBytes != 99 || wu[0].Contract().Version != 2 {
		t.Errorf("user templates: got %+v, want version 2 with 99 disk bytes", wu)
	}
}

func roundTrip(t *testing.T, in, out any) {
	t.Helper()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
}

// TestErrorClasses: each class goes out with its code and status and
// comes back as an error of the same class, with the same text.
func TestErrorClasses(t *testing.T) {
	for _, tc := range []struct {
		class  error
		code   string
		status int
	}{
		{host.ErrNoSpace, "no_space", 507},
		{builds.ErrUnsupported, "builds_unsupported", 501},
		{builds.ErrLimit, "template_limit", 429},
		{builds.ErrBusy, "builds_busy", 429},
		{builds.ErrNoSpace, "builds_no_space", 507},
		{builds.ErrClosed, "builds_closed", 503},
		{builds.ErrNotFound, "build_not_found", 404},
		{host.ErrCorrupt, "corrupt", 409},
		{host.ErrNotReady, "not_ready", 503},
		{host.ErrExhausted, "exhausted", 503},
		{host.ErrNotFound, "not_found", 404},
		{templates.ErrNotFound, "template_not_found", 404},
		{host.ErrInvalid, "invalid", 422},
		{templates.ErrInvalid, "template_invalid", 422},
		{host.ErrConflict, "conflict", 409},
		{builds.ErrConflict, "build_conflict", 409},
		{templates.ErrConflict, "template_conflict", 409},
		{host.ErrUnavailable, "unavailable", 503},
		{errors.ErrUnsupported, "unsupported", 501},
		{syscall.ECONNREFUSED, "refused", 502},
		{context.DeadlineExceeded, "timeout", 504},
		{context.Canceled, "canceled", 503},
		{hostwire.ErrUnauthorized, "unauthorized", 401},
	} {
		err := fmt.Errorf("op: %w", tc.class)
		status, we := hostwire.EncodeError(err)
		if status != tc.status || we.Code != tc.code || we.Message != err.Error() {
			t.Errorf("%v: got %d %+v, want %d %q with its text", tc.class, status, we, tc.status, tc.code)
		}
		var back hostwire.Error
		roundTrip(t, we, &back)
		got := back.Err()
		if !errors.Is(got, tc.class) || got.Error() != err.Error() {
			t.Errorf("%v: came back as %q (class kept: %v)", tc.class, got, errors.Is(got, tc.class))
		}
	}

	// An error of several classes goes as the first in the API's order.
	if _, we := hostwire.EncodeError(fmt.Errorf("%w, %w", host.ErrNotFound, host.ErrNoSpace)); we.Code != "no_space" {
		t.Errorf("not found and no space: got code %q, want no_space", we.Code)
	}
	// An error of no class is internal, and comes back as none.
	status, we := hostwire.EncodeError(errors.New("boom"))
	if status != 500 || we.Code != "internal" {
		t.Errorf("boom: got %d %q, want 500 internal", status, we.Code)
	}
	if got := we.Err(); got.Error() != "boom" || errors.Unwrap(got) != nil {
		t.Errorf("boom came back as %q wrapping %v", got, errors.Unwrap(got))
	}
	// A code this side does not know (a newer agent's): its text stays.
	if got := (hostwire.Error{Code: "brand_new", Message: "something"}).Err(); got.Error() != "something" || errors.Unwrap(got) != nil {
		t.Errorf("unknown code: got %q wrapping %v", got, errors.Unwrap(got))
	}
	if got := (hostwire.Error{Code: "not_found"}).Err(); got.Error() != "not_found" || !errors.Is(got, host.ErrNotFound) {
		t.Errorf("no message: got %q", got)
	}
}

// TestClassesRoundTrip: an error of any class that has no name of its own
// goes as its class and comes back of it, with its text; a named one comes
// back of its class too.
func TestClassesRoundTrip(t *testing.T) {
	want := map[errs.Class]int{
		errs.BadRequest: 400, errs.Unauthorized: 401, errs.Forbidden: 403, errs.NotFound: 404,
		errs.MethodNotAllowed: 405, errs.Conflict: 409, errs.Corrupt: 409, errs.TooLarge: 413,
		errs.Invalid: 422, errs.QuotaExceeded: 429, errs.TooManyRequests: 429, errs.TemplateLimit: 429,
		errs.Canceled: 503, errs.Internal: 500, errs.NotImplemented: 501, errs.BadGateway: 502,
		errs.GuestError: 500, errs.Unavailable: 503, errs.Timeout: 504, errs.NoSpace: 507,
	}
	if len(want) != len(errs.All) {
		t.Errorf("%d statuses for %d classes", len(want), len(errs.All))
	}
	for _, c := range errs.All {
		err := fmt.Errorf("op: %w", errs.New(c, "it failed"))
		status, we := hostwire.EncodeError(err)
		code := "class." + string(c)
		if c == errs.Internal {
			code = "internal"
		}
		if status != want[c] || we.Code != code || we.Message != "op: it failed" {
			t.Errorf("%s: got %d %+v, want %d %s", c, status, we, want[c], code)
		}
		var back hostwire.Error
		roundTrip(t, we, &back)
		got := back.Err()
		if got.Error() != err.Error() || (c != errs.Internal && (!errors.Is(got, c) || errs.ClassOf(got) != c)) {
			t.Errorf("%s: came back as %q of class %q", c, got, errs.ClassOf(got))
		}
	}
	for _, tc := range []struct {
		err   error
		code  string
		named error // what it comes back as
	}{
		// A name before the error's class, as the control plane reads it.
		{fmt.Errorf("%w: %w", host.ErrInvalid, netpolicy.ErrInvalid), "invalid", host.ErrInvalid},
		{fmt.Errorf("%w: %w", host.ErrConflict, errs.NotFound), "conflict", host.ErrConflict},
		// Errors of the standard library and guests' by their names.
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), "refused", syscall.ECONNREFUSED},
		{fmt.Errorf("exec: %w", guestproto.Errorf(guestproto.CodeTimeout, "5s")), "timeout", context.DeadlineExceeded},
		// The contract's errors of other packages, by their class.
		{fmt.Errorf("%w: bad entry", netpolicy.ErrInvalid), "class.bad_request", errs.BadRequest},
		{fmt.Errorf("%w: 3 images", builds.ErrImageNotFound), "class.not_found", errs.NotFound},
	} {
		_, we := hostwire.EncodeError(tc.err)
		if back := we.Err(); we.Code != tc.code || !errors.Is(back, tc.named) || back.Error() != tc.err.Error() {
			t.Errorf("%v: sent as %q, came back as %q (Is %v: %v); want %q", tc.err, we.Code, back, tc.named, errors.Is(back, tc.named), tc.code)
		}
	}
	// A class this side does not know (a newer agent's): internal.
	if got := (hostwire.Error{Code: "class.brand_new", Message: "x"}).Err(); got.Error() != "x" || errors.Unwrap(got) != nil {
		t.Errorf("unknown class: got %q wrapping %v", got, errors.Unwrap(got))
	}
}

// TestGuestErrors: a guest's error keeps its code and its own message.
func TestGuestErrors(t *testing.T) {
	for _, tc := range []struct {
		code   guestproto.Code
		status int
	}{
		{guestproto.CodeNotFound, 404},
		{guestproto.CodeExists, 409},
		{guestproto.CodeNotEmpty, 409},
		{guestproto.CodePermission, 403},
		{guestproto.CodeInternal, 500},
		{guestproto.CodeCanceled, 503},
		{guestproto.CodeInvalid, 422},
		{guestproto.CodeExited, 409},
		{guestproto.CodeBusy, 429},
		{guestproto.CodeTooLarge, 422},
		{"brand_new", 500},
	} {
		err := fmt.Errorf("op: %w", guestproto.Errorf(tc.code, "no such file"))
		status, we := hostwire.EncodeError(err)
		b, _ := json.Marshal(we)
		want := fmt.Sprintf(`{"code":"guest.%s","message":"op: guest: %s: no such file","guest_message":"no such file"}`, tc.code, tc.code)
		if status != tc.status || string(b) != want {
			t.Errorf("%s: got %d %s, want %d %s", tc.code, status, b, tc.status, want)
		}
		var ge *guestproto.Error
		if got := we.Err(); !errors.As(got, &ge) || ge.Code != tc.code || ge.Message != "no such file" || got.Error() != err.Error() {
			t.Errorf("%s: came back as %q (%+v)", tc.code, got, ge)
		}
	}
}

// TestReadError: an error answer becomes the agent's error; one that is
// not the agent's (a proxy's page) is unavailable.
func TestReadError(t *testing.T) {
	res := &http.Response{Status: "404 Not Found", StatusCode: 404,
		Body: io.NopCloser(strings.NewReader(`{"error":{"code":"not_found","message":"sandbox x not found"}}`))}
	if err := hostwire.ReadError(res); !errors.Is(err, host.ErrNotFound) || err.Error() != "sandbox x not found" {
		t.Errorf("agent's error: got %v", err)
	}
	res = &http.Response{Status: "502 Bad Gateway", StatusCode: 502, Body: io.NopCloser(strings.NewReader("<html>bad gateway</html>"))}
	if err := hostwire.ReadError(res); !errors.Is(err, host.ErrUnavailable) || !strings.Contains(err.Error(), "502 Bad Gateway: <html>bad gateway</html>") {
		t.Errorf("proxy's page: got %v", err)
	}

	res = &http.Response{Trailer: http.Header{}}
	if err := hostwire.TrailerError(res); err != nil {
		t.Errorf("no trailer: got %v", err)
	}
	_, we := hostwire.EncodeError(fmt.Errorf("read: %w", host.ErrCorrupt))
	b, _ := json.Marshal(we)
	res.Trailer.Set(hostwire.HeaderError, string(b))
	if err := hostwire.TrailerError(res); !errors.Is(err, host.ErrCorrupt) || err.Error() != "read: corrupt" {
		t.Errorf("trailer: got %v", err)
	}
}

// TestFrames: the frame format, byte for byte, and what a reader makes of
// a broken stream.
func TestFrames(t *testing.T) {
	if got := string([]byte{hostwire.FrameStart, hostwire.FrameStdout, hostwire.FrameStderr, hostwire.FrameExit, hostwire.FrameError,
		hostwire.FrameAttach, hostwire.FrameAttachEnd}); got != "S12XEAX" {
		t.Errorf("frame types: got %q, want S12XEAX", got)
	}
	if got := hex.EncodeToString(hostwire.JSONFrame(hostwire.FrameStart, hostwire.StartFrame{PID: 42})); got != "530000000a7b22706964223a34327d" {
		t.Errorf("start frame: got %s", got)
	}
	stream := hostwire.AppendFrame(nil, hostwire.FrameStdout, []byte("hi"))
	if got := hex.EncodeToString(stream); got != "31000000026869" {
		t.Errorf("stdout frame: got %s", got)
	}
	stream = hostwire.AppendFrame(stream, hostwire.FrameStderr, nil)
	r := bytes.NewReader(stream)
	for _, want := range []struct {
		typ     byte
		payload string
	}{{hostwire.FrameStdout, "hi"}, {hostwire.FrameStderr, ""}} {
		typ, payload, err := hostwire.ReadFrame(r, nil)
		if err != nil || typ != want.typ || string(payload) != want.payload {
			t.Errorf("read frame: got %q %q %v, want %q %q", typ, payload, err, want.typ, want.payload)
		}
	}
	if _, _, err := hostwire.ReadFrame(r, nil); err != io.ErrUnexpectedEOF {
		t.Errorf("after the last frame: got %v, want io.ErrUnexpectedEOF", err)
	}
	if _, _, err := hostwire.ReadFrame(bytes.NewReader(stream[:4]), nil); err != io.ErrUnexpectedEOF {
		t.Errorf("cut in the header: got %v, want io.ErrUnexpectedEOF", err)
	}
	if _, _, err := hostwire.ReadFrame(bytes.NewReader(stream[:6]), nil); err != io.ErrUnexpectedEOF {
		t.Errorf("cut in the payload: got %v, want io.ErrUnexpectedEOF", err)
	}
	big := []byte{hostwire.FrameStdout, 0, 0x10, 0, 1} // MaxFrame + 1
	if _, _, err := hostwire.ReadFrame(bytes.NewReader(big), nil); err == nil || !strings.Contains(err.Error(), "exceeds") {
		t.Errorf("frame over MaxFrame: got %v", err)
	}
}

// TestLines: the JSON line that begins an exec or a download.
func TestLines(t *testing.T) {
	b, err := hostwire.EncodeLine(map[string]string{"s": "<&>\u2028"})
	if err != nil || string(b) != "{\"s\":\"<&>\\u2028\"}\n" {
		t.Errorf("encode line: got %q, %v", b, err)
	}
	long := strings.Repeat("x", 100<<10)
	line, _ := hostwire.EncodeLine(map[string]string{"s": long})
	br := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(line), strings.NewReader("rest")), 16) // smaller than the line
	var got map[string]string
	if err := hostwire.ReadJSONLine(br, &got); err != nil || got["s"] != long {
		t.Fatalf("read a line longer than the buffer: %v", err)
	}
	if rest, _ := io.ReadAll(br); string(rest) != "rest" {
		t.Errorf("after the line: got %q, want rest", rest)
	}
	tooLong := append(bytes.Repeat([]byte{' '}, hostwire.MaxLine), '\n')
	if err := hostwire.ReadJSONLine(bufio.NewReader(bytes.NewReader(tooLong)), &got); err != hostwire.ErrLineTooLong {
		t.Errorf("line over MaxLine: got %v, want ErrLineTooLong", err)
	}
	if err := hostwire.ReadJSONLine(bufio.NewReader(strings.NewReader(`{"s":`)), &got); err != io.ErrUnexpectedEOF {
		t.Errorf("line without its end: got %v, want io.ErrUnexpectedEOF", err)
	}
}

// TestPackTicket: a ticket grants one snapshot's pack, until it expires,
// checked with the SHA-256 of the token it was made with.
func TestPackTicket(t *testing.T) {
	ticket := hostwire.PackTicket("tok", "sn1", ts)
	if want := "v1.sn1.1735787045.219fc53b7c3721c8655166442385b73df94dc9c8989c4ff7a8e4e2bf62a78819"; ticket != want {
		t.Errorf("ticket: got %s, want %s", ticket, want)
	}
	key := sha256.Sum256([]byte("tok"))
	if !hostwire.TicketGrants(key, ticket, "sn1", ts.Add(-time.Second)) {
		t.Error("a valid ticket does not grant its pack")
	}
	forged := []byte(ticket)
	forged[len(forged)-1] ^= 1
	for _, tc := range []struct {
		name, ticket, snapshot string
		key                    [32]byte
		now                    time.Time
	}{
		{"expired", ticket, "sn1", key, ts},
		{"another snapshot", ticket, "sn2", key, ts.Add(-time.Second)},
		{"another agent", ticket, "sn1", sha256.Sum256([]byte("other")), ts.Add(-time.Second)},
		{"forged", string(forged), "sn1", key, ts.Add(-time.Second)},
		{"another version", "v2" + ticket[2:], "sn1", key, ts.Add(-time.Second)},
		{"a token", "tok", "sn1", key, ts.Add(-time.Second)},
	} {
		if hostwire.TicketGrants(tc.key, tc.ticket, tc.snapshot, tc.now) {
			t.Errorf("%s: granted", tc.name)
		}
	}
}

// TestReadToken: the token file as the agent writes it (a line) or an
// operator does (white space around it).
func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.token")
	for _, content := range []string{"pandaagent_x\n", "  pandaagent_x \r\n\n"} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if tok, err := hostwire.ReadToken(path); err != nil || tok != "pandaagent_x" {
			t.Errorf("%q: got %q, %v", content, tok, err)
		}
	}
	os.WriteFile(path, []byte(" \n"), 0o600)
	if _, err := hostwire.ReadToken(path); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Errorf("empty file: got %v", err)
	}
	if _, err := hostwire.ReadToken(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: got %v, want fs.ErrNotExist", err)
	}
}
