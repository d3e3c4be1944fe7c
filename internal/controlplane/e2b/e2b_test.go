package e2b

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
)

func TestAccessToken(t *testing.T) {
	secret := []byte("0123456789abcdef")
	s, err := New(nil, secret, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b := s.AccessToken("sbx1"), s.AccessToken("sbx2")
	if a == b || len(a) != 64 {
		t.Fatalf("tokens %q and %q: want distinct 64-hex-digit tokens", a, b)
	}
	// The token is HMAC-SHA256 of the sandbox id under the server's
	// secret, computed here apart from the code under test: SDKs hold
	// tokens across server restarts, so the derivation may not drift.
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("e2b envd access token\x00sbx1"))
	if want := hex.EncodeToString(m.Sum(nil)); a != want {
		t.Errorf("AccessToken(sbx1) = %s, want %s", a, want)
	}
	// Another secret, another token: a server's tokens are its own.
	other, err := New(nil, []byte("fedcba9876543210"), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id, token string
		want      bool
	}{
		{"sbx1", a, true},
		{"sbx2", a, false},
		{"sbx1", "", false},
		{"", "", false},
		{"sbx1", other.AccessToken("sbx1"), false},
		{"sbx1", strings.ToUpper(a), false},
		{"sbx1", a[:63], false},
	} {
		if got := s.validToken(tc.id, tc.token); got != tc.want {
			t.Errorf("validToken(%q, %q) = %v, want %v", tc.id, tc.token, got, tc.want)
		}
	}
	if _, err := New(nil, []byte("short"), "", nil); err == nil {
		t.Error("New with a 5-byte secret: got no error")
	}
}

func TestBasicUser(t *testing.T) {
	for _, tc := range []struct{ header, want string }{
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("user:")), "user"},
		{"Basic " + base64.StdEncoding.EncodeToString([]byte("root:x")), "root"},
		{"Basic !!!", ""},
		{"Bearer abc", ""},
		{"", ""},
	} {
		if got := basicUser(tc.header); got != tc.want {
			t.Errorf("basicUser(%q) = %q, want %q", tc.header, got, tc.want)
		}
	}
}

func TestResolve(t *testing.T) {
	tg := envdTarget{user: defaultUser{name: "user", home: "/home/user"}}
	for _, tc := range []struct{ in, want string }{
		{"a.txt", "/home/user/a.txt"},
		{"~/x/../y", "/home/user/y"},
		{"~", "/home/user"},
		{"", "/home/user"},
		{"/tmp//a/", "/tmp/a"},
	} {
		got, err := tg.resolve(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("resolve(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	if _, err := tg.resolve("/a\x00b"); err == nil {
		t.Error("resolve of a path with NUL: got no error")
	}
}

// TestMessagesJSON: the proto3 JSON mapping the SDK reads (int64 as a
// string, bytes as base64, lowerCamelCase, enum names).
func TestMessagesJSON(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want string
	}{
		{startResponse{Event: processEvent{Start: &startEvent{PID: 7}}}, `{"event":{"start":{"pid":7}}}`},
		{startResponse{Event: processEvent{Data: &dataEvent{Stdout: []byte("hi")}}}, `{"event":{"data":{"stdout":"aGk="}}}`},
		{startResponse{Event: processEvent{End: &endEvent{ExitCode: 3, Exited: true, Status: "exit status 3"}}}, `{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3"}}}`},
		{startResponse{Event: processEvent{Keepalive: &struct{}{}}}, `{"event":{"keepalive":{}}}`},
		{entryInfo{Name: "a", Type: fileTypeFile, Path: "/a", Size: 11, Permissions: "-rw-r--r--"}, `{"name":"a","type":"FILE_TYPE_FILE","path":"/a","size":"11","mode":0,"permissions":"-rw-r--r--","owner":"","group":""}`},
	} {
		b, err := json.Marshal(tc.v)
		if err != nil || string(b) != tc.want {
			t.Errorf("marshal %#v = %s, %v; want %s", tc.v, b, err, tc.want)
		}
	}
	var req listDirRequest
	if err := (jsonCodec{}).Unmarshal([]byte(`{"path":"/x","depth":2,"unknown":1}`), &req); err != nil || req != (listDirRequest{Path: "/x", Depth: 2}) {
		t.Errorf("unmarshal ListDirRequest = %+v, %v", req, err)
	}
	if err := (jsonCodec{}).Unmarshal(nil, &req); err != nil {
		t.Errorf("unmarshal of an empty message: %v", err)
	}
}

func TestEndOf(t *testing.T) {
	for _, tc := range []struct {
		res              guestproto.ExecResult
		code             int32
		exited           bool
		status, errorMsg string
	}{
		{guestproto.ExecResult{ExitCode: 0}, 0, true, "exit status 0", ""},
		{guestproto.ExecResult{ExitCode: 3}, 3, true, "exit status 3", "exit status 3"},
		{guestproto.ExecResult{ExitCode: -1, Signal: "SIGKILL"}, -1, false, "signal: killed", "signal: killed"},
		{guestproto.ExecResult{ExitCode: -1, Signal: "SIGTERM"}, -1, false, "signal: terminated", "signal: terminated"},
		{guestproto.ExecResult{ExitCode: -1, Signal: "SIGWINCH"}, -1, false, "signal: winch", "signal: winch"},
	} {
		got := endOf(tc.res)
		var msg string
		if got.Error != nil {
			msg = *got.Error
		}
		if got.ExitCode != tc.code || got.Exited != tc.exited || got.Status != tc.status || msg != tc.errorMsg {
			t.Errorf("endOf(%+v) = {%d %v %q %q}, want {%d %v %q %q}", tc.res, got.ExitCode, got.Exited, got.Status, msg, tc.code, tc.exited, tc.status, tc.errorMsg)
		}
	}
}

// TestCreateBody: E2B's create body in PandaStack's terms: the egress
// policy from allow_internet_access and network, on_expire from
// autoPause; an egress proxy and per-host rules are refused (400).
func TestCreateBody(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       CreateRequest
		wantErr    string
	}{
		{"defaults", `{"templateID":"base"}`, CreateRequest{Template: "base"}, ""},
		{"no internet", `{"allow_internet_access":false}`, CreateRequest{Template: "base", Network: &Network{}}, ""},
		{"allow and deny", `{"templateID":"t","network":{"allowOut":["10.1.0.0/16","pypi.org"],"denyOut":["0.0.0.0/0"],"allowPublicTraffic":false},"autoPause":true}`,
			CreateRequest{Template: "t", Network: &Network{Internet: true, AllowOut: []string{"10.1.0.0/16", "pypi.org"}, DenyOut: []string{"0.0.0.0/0"}}, OnExpire: "pause"}, ""},
		{"autoPause false", `{"autoPause":false,"network":{"rules":{}}}`, CreateRequest{Template: "base", Network: &Network{Internet: true}}, ""},
		{"egress proxy", `{"network":{"egressProxy":{"address":"p:1080"}}}`, CreateRequest{}, "egressProxy is not supported"},
		{"rules", `{"network":{"rules":{"api.example.com":[{"transform":{}}]}}}`, CreateRequest{}, "rules"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b createBody
			if err := json.Unmarshal([]byte(tc.body), &b); err != nil {
				t.Fatal(err)
			}
			got, err := b.request()
			if tc.wantErr != "" {
				var ae *apiError
				if !errors.As(err, &ae) || ae.status != 400 || !strings.Contains(ae.msg, tc.wantErr) {
					t.Fatalf("err %v, want a 400 saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got.TTLSeconds == nil || *got.TTLSeconds != defaultTimeout {
				t.Fatalf("got %+v, %v, want the default timeout", got, err)
			}
			got.TTLSeconds = nil
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v (network %+v), want %+v (network %+v)", got, got.Network, tc.want, tc.want.Network)
			}
		})
	}
}
