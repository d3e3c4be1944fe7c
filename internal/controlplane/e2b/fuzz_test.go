package e2b

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
)

// The fake world of the E2B fuzz targets: keys k1 and k2; k1's sandboxes
// sbx1 (running), sbx2 (paused) and gone1 (stopped); k2's other1
// (running).
var fuzzSandboxes = map[string]struct{ key, state string }{
	"sbx1":   {"key1", "running"},
	"sbx2":   {"key1", "paused"},
	"gone1":  {"key1", "stopped"},
	"other1": {"key2", "running"},
}

var fuzzKeys = map[string]string{"k1": "key1", "k2": "key2"}

var fuzzSecret = []byte("0123456789abcdef fuzz secret")

// Flags of FuzzE2B's requests.
const (
	feAPIKey    = 1 << iota // X-API-KEY: k1
	feEnvd                  // E2b-Sandbox-Id: sbx1 and its access token
	feEnvelope              // the body as one Connect stream message (application/connect+json)
	feJSON                  // Content-Type: application/json
	feGzip                  // the body gzip-compressed (Content-Encoding, or the envelope's flag)
	feProcesses             // the guest keeps background processes
	feBasicUser             // Authorization: Basic user:
	feMultipart             // the body as a multipart/form-data "file" part, named by the headers' first line
)

// FuzzE2B sends arbitrary requests through the E2B layer's Intercept (its
// control plane and envd, as the SDKs speak them: JSON bodies, Connect
// unary and stream messages, /files queries and multipart uploads) with
// arbitrary headers, over a fake Backend and guest, and checks:
//
//   - nothing answers 500 (every failure is classified), and every JSON
//     answer is JSON;
//   - the Backend does nothing for a control-plane request that did not
//     authenticate with an API key, and a guest is reached only for the
//     sandbox the request names with that sandbox's access token (or a
//     signed file URL it made);
//   - a guest is handed only absolute, clean paths without NUL of at most
//     4096 bytes, and commands run as a valid user;
//   - a sandbox's access token is answered only to its own key's
//     control-plane requests;
//   - a create's body is decoded into the request a plain reading of
//     E2B's NewSandbox makes, and a list's metadata filter into the pairs
//     of its query string;
//   - a body that decodes as an envd message re-encodes to a fixed point.
func FuzzE2B(f *testing.F) {
	tok := func(id string) string { s, _ := New(nil, fuzzSecret, "", nil); return s.AccessToken(id) }
	for _, s := range []struct {
		method, target, headers, body string
		flags                         uint8
	}{
		{"POST", "/sandboxes", "", `{"templateID":"base","timeout":60,"metadata":{"a":"b"},"envVars":{"X":"1"},"autoPause":true}`, feAPIKey},
		{"POST", "/v2/sandboxes", "", `{"templateID":"py","allow_internet_access":false,"network":{"allowOut":["1.2.3.4"],"denyOut":["0.0.0.0/0"]}}`, feAPIKey},
		{"POST", "/sandboxes", "", `{"network":{"egressProxy":{"url":"x"}}}`, feAPIKey},
		{"POST", "/sandboxes", "", `{"network":{"rules":{"a":1}}}`, feAPIKey},
		{"POST", "/sandboxes", "", `{"timeout":"60"}`, feAPIKey},
		{"POST", "/sandboxes", "Authorization: Bearer k2", `{}`, 0},
		{"POST", "/sandboxes", "X-API-KEY: nope", `{}`, 0},
		{"POST", "/sandboxes", "", `{}`, 0},
		{"GET", "/v2/sandboxes?state=running,paused&metadata=a%3Db%26c%3Dd", "", "", feAPIKey},
		{"GET", "/sandboxes?state=bogus", "", "", feAPIKey},
		{"GET", "/sandboxes?metadata=%zz", "", "", feAPIKey},
		{"GET", "/sandboxes/sbx1", "", "", feAPIKey},
		{"GET", "/sandboxes/other1", "", "", feAPIKey},
		{"GET", "/sandboxes/gone1", "", "", feAPIKey},
		{"DELETE", "/sandboxes/sbx1", "", "", feAPIKey},
		{"POST", "/sandboxes/sbx1/timeout", "", `{"timeout":30}`, feAPIKey},
		{"POST", "/sandboxes/sbx1/timeout", "", `{}`, feAPIKey},
		{"POST", "/sandboxes/sbx2/connect", "", `{"timeout":30}`, feAPIKey},
		{"POST", "/v2/sandboxes/sbx1/connect", "", ``, feAPIKey},
		{"POST", "/sandboxes/sbx1/pause", "", `{"memory":true}`, feAPIKey},
		{"POST", "/sandboxes/sbx2/resume", "", `{"timeout":10}`, feAPIKey},
		{"POST", "/sandboxes/sbx1/fork", "", `{"count":2,"timeout":5}`, feAPIKey},
		{"PUT", "/sandboxes/sbx1/network", "", `{"allow_internet_access":false,"allowOut":["example.com"]}`, feAPIKey},
		{"GET", "/sandboxes/sbx1/metrics", "", "", feAPIKey},
		{"POST", "/filesystem.Filesystem/Stat", "", `{"path":"~/a.txt"}`, feEnvd | feJSON},
		{"POST", "/filesystem.Filesystem/ListDir", "", `{"path":"/","depth":3}`, feEnvd | feJSON},
		{"POST", "/filesystem.Filesystem/MakeDir", "", `{"path":"new/dir"}`, feEnvd | feJSON | feBasicUser},
		{"POST", "/filesystem.Filesystem/Remove", "", `{"path":"/tmp/x\u0000y"}`, feEnvd | feJSON},
		{"POST", "/filesystem.Filesystem/Move", "", `{"source":"a","destination":"../../b"}`, feEnvd | feJSON},
		{"POST", "/filesystem.Filesystem/Stat", "X-Access-Token: wrong", `{"path":"/"}`, feJSON | feEnvd},
		{"POST", "/filesystem.Filesystem/Stat", "E2b-Sandbox-Id: other1", `{"path":"/"}`, feJSON},
		{"POST", "/filesystem.Filesystem/Stat", "", `{"path":"/"}`, feEnvd | feJSON | feGzip},
		{"POST", "/process.Process/Start", "", `{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"b"},"cwd":"/work"}}`, feEnvd | feEnvelope},
		{"POST", "/process.Process/Start", "Connect-Timeout-Ms: 1000", `{"process":{"cmd":"sh"},"pty":{"size":{"cols":80,"rows":24}},"tag":"t","stdin":true}`, feEnvd | feEnvelope | feProcesses},
		{"POST", "/process.Process/Start", "", `{"process":{"cmd":""}}`, feEnvd | feEnvelope | feGzip},
		{"POST", "/process.Process/Connect", "", `{"process":{"pid":7}}`, feEnvd | feEnvelope | feProcesses},
		{"POST", "/process.Process/List", "", `{}`, feEnvd | feJSON | feProcesses},
		{"POST", "/process.Process/SendInput", "", `{"process":{"tag":"t"},"input":{"stdin":"aGk="}}`, feEnvd | feJSON | feProcesses},
		{"POST", "/process.Process/SendSignal", "", `{"process":{"pid":7},"signal":"SIGNAL_SIGKILL"}`, feEnvd | feJSON | feProcesses},
		{"POST", "/process.Process/CloseStdin", "", `{"process":{"pid":0}}`, feEnvd | feJSON | feProcesses},
		{"POST", "/process.Process/Update", "", `{"process":{"pid":7},"pty":{"size":{"cols":100000,"rows":1}}}`, feEnvd | feJSON | feProcesses},
		{"POST", "/filesystem.Filesystem/WatchDir", "", `{"path":"/home/user","recursive":true}`, feEnvd | feEnvelope},
		{"POST", "/filesystem.Filesystem/CreateWatcher", "", `{}`, feEnvd | feJSON},
		{"POST", "/process.Process/StreamInput", "", `{}`, feEnvd | feEnvelope},
		{"GET", "/files?path=/etc/hosts&username=root", "", "", feEnvd},
		{"GET", "/files?path=a.txt&username=bad%20user", "", "", feEnvd},
		{"POST", "/files?path=/work/up.txt", "Content-Type: application/octet-stream", "hello", feEnvd},
		{"POST", "/files?path=/work/up.txt", "Content-Type: application/octet-stream", "hello", feEnvd | feGzip},
		{"POST", "/files", "/home/user/a.txt", "multipart bytes", feEnvd | feMultipart},
		{"POST", "/files?path=b.txt", "../../etc/passwd", "x", feEnvd | feMultipart},
		{"POST", "/files", "Content-Type: text/plain", "x", feEnvd},
		{"GET", "/health", "", "", feEnvd},
		{"GET", "/files?path=x&signature=v1_abc&signature_expiration=1", "", "", 0},
		{"GET", "/files?path=x&signature=v1_abc&signature_expiration=zz", "", "", 0},
		{"GET", "/nope", "", "", feEnvd},
		{"GET", "/v1/sandboxes", "", "", 0},
	} {
		f.Add(s.method, s.target, s.headers, []byte(s.body), s.flags)
	}
	f.Add("POST", "/filesystem.Filesystem/Stat", "X-Access-Token: "+tok("sbx1")+"\nE2b-Sandbox-Id: sbx1", []byte(`{"path":"/"}`), uint8(feJSON))
	f.Add("POST", "/filesystem.Filesystem/Stat", "X-Access-Token: "+tok("other1")+"\nE2b-Sandbox-Id: other1", []byte(`{"path":"/"}`), uint8(feJSON))
	f.Add("POST", "/filesystem.Filesystem/Stat", "X-Access-Token: "+tok("gone1")+"\nE2b-Sandbox-Id: gone1", []byte(`{"path":"/"}`), uint8(feJSON))
	traffic := func(id string) string { s, _ := New(nil, fuzzSecret, "", nil); return s.TrafficAccessToken(id) }
	code := "\nE2b-Sandbox-Port: 49999\nE2b-Sandbox-Id: "
	f.Add("POST", "/execute", "X-Access-Token: "+tok("sbx1")+"\nE2B-Traffic-Access-Token: "+traffic("sbx1")+code+"sbx1", []byte(`{"code":"1"}`), uint8(0))
	f.Add("GET", "/contexts", "E2B-Traffic-Access-Token: "+traffic("sbx1")+code+"sbx1", []byte(nil), uint8(0))
	f.Add("DELETE", "/contexts/abc", "E2B-Traffic-Access-Token: "+traffic("other1")+code+"sbx1", []byte(nil), uint8(0))
	f.Add("POST", "/contexts/abc/restart", "X-Access-Token: "+tok("sbx1")+"\nE2B-Traffic-Access-Token: "+tok("sbx1")+code+"sbx1", []byte(nil), uint8(0))
	f.Add("POST", "/execute", "E2B-Traffic-Access-Token: "+traffic("gone1")+code+"gone1", []byte(`{}`), uint8(0))
	f.Add("POST", "/execute", "X-API-KEY: k1"+code+"sbx1", []byte(`{}`), uint8(0))
	f.Fuzz(func(t *testing.T, method, target, headers string, body []byte, flags uint8) {
		if !strings.HasPrefix(target, "/") || strings.ContainsAny(target, " \r\n") {
			return // no request line an HTTP server would parse
		}
		if _, err := url.ParseRequestURI(target); err != nil {
			return
		}
		fuzzMessages(t, body)
		b := &fuzzBackend{processes: flags&feProcesses != 0}
		s, err := New(b, fuzzSecret, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		req, ok := fuzzRequest(method, target, headers, body, flags, s)
		if !ok {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req = req.WithContext(ctx)
		rec := httptest.NewRecorder()
		passed := false
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.Intercept(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				passed = true
				w.WriteHeader(http.StatusTeapot)
			})).ServeHTTP(rec, req)
		}()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Fatalf("%s %s: no answer after 15s", method, target)
		}
		res := rec.Result()
		out, _ := io.ReadAll(res.Body)
		if res.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(bytes.NewReader(out))
			if err != nil {
				t.Fatalf("%s %s: a gzip answer that is not gzip: %v", method, target, err)
			}
			if out, err = io.ReadAll(zr); err != nil {
				t.Fatalf("%s %s: a gzip answer that is not gzip: %v", method, target, err)
			}
		}
		if res.StatusCode == http.StatusInternalServerError {
			t.Fatalf("%s %s (headers %q, body %q): 500 %s", method, target, headers, body, out)
		}
		if strings.Contains(res.Header.Get("Content-Type"), "json") && res.Header.Get("Content-Type") != "application/connect+json" && len(out) > 0 && !json.Valid(out) {
			t.Fatalf("%s %s: %d, Content-Type %s, body not JSON: %q", method, target, res.StatusCode, res.Header.Get("Content-Type"), out)
		}
		if passed && (req.Header.Get("E2b-Sandbox-Id") != "" || signedFileURL(req)) {
			t.Fatalf("%s %s: an envd request was passed on to the REST API", method, target)
		}

		b.mu.Lock()
		defer b.mu.Unlock()
		key := ""
		if secret := fuzzAPIKey(req.Header); fuzzKeys[secret] != "" {
			key = fuzzKeys[secret]
		}
		if len(b.calls) > 0 && key == "" {
			t.Fatalf("%s %s without a valid API key: the Backend did %v", method, target, b.calls)
		}
		for _, id := range b.proxied {
			if !fuzzMayProxy(s, req, id) {
				t.Fatalf("%s %s (headers %q): sandbox %s's code interpreter reached without its tokens", method, target, headers, id)
			}
		}
		for _, id := range b.guests {
			if !fuzzMayReach(s, req, id) {
				t.Fatalf("%s %s (headers %q): sandbox %s's guest reached without its token or a signature it made", method, target, headers, id)
			}
		}
		for _, op := range b.g.ops {
			if op.path != "" && (!path.IsAbs(op.path) || path.Clean(op.path) != op.path || strings.ContainsRune(op.path, 0) || len(op.path) > 4096) {
				t.Fatalf("%s %s: the guest was asked to %s %q", method, target, op.op, op.path)
			}
			if op.user != "" && guestproto.ValidateUser(op.user) != nil {
				t.Fatalf("%s %s: the guest was asked to run %v as user %q", method, target, op.argv, op.user)
			}
			if len(op.argv) == 3 && op.argv[0] == "chown" {
				if u := strings.TrimSuffix(op.argv[1], ":"); guestproto.ValidateUser(u) != nil {
					t.Fatalf("%s %s: chown to user %q", method, target, u)
				}
			}
		}
		sent := fmt.Sprint(target, req.Header, string(body))
		for id, sb := range fuzzSandboxes {
			for _, tok := range []string{s.AccessToken(id), s.TrafficAccessToken(id)} {
				if bytes.Contains(out, []byte(tok)) && !strings.Contains(sent, tok) && (key != sb.key || req.Header.Get("E2b-Sandbox-Id") != "") {
					t.Fatalf("%s %s: sandbox %s's access or traffic token answered to key %q", method, target, id, key)
				}
			}
		}
		if len(b.created) > 0 {
			want, ok := fuzzCreateModel(body)
			if !ok || !reflect.DeepEqual(b.created[0], want) {
				t.Fatalf("create body %s: the Backend got %+v, want %+v", body, b.created[0], want)
			}
		}
		if len(b.lists) > 0 {
			want := map[string]string{}
			for _, v := range req.URL.Query()["metadata"] {
				kv, _ := url.ParseQuery(v)
				for k, vs := range kv {
					want[k] = vs[len(vs)-1]
				}
			}
			got := b.lists[0].Metadata
			if len(got) != len(want) || len(want) > 0 && !reflect.DeepEqual(got, want) {
				t.Fatalf("list %s: metadata filter %v, want %v", target, got, want)
			}
		}
	})
}

// fuzzMessages decodes b as each envd message the server accepts, with
// the server's codec, and checks that what decodes re-encodes to a
// message that decodes and re-encodes the same (a fixed point: JSON null
// and an absent field are alike).
func fuzzMessages(t *testing.T, b []byte) {
	for _, newMsg := range []func() any{
		func() any { return new(startRequest) }, func() any { return new(pathRequest) },
		func() any { return new(listDirRequest) }, func() any { return new(moveRequest) },
		func() any { return new(connectRequest) }, func() any { return new(sendInputRequest) },
		func() any { return new(sendSignalRequest) }, func() any { return new(closeStdinRequest) },
		func() any { return new(updateRequest) }, func() any { return new(watchDirRequest) },
	} {
		m := newMsg()
		if (jsonCodec{}).Unmarshal(b, m) != nil {
			continue
		}
		enc, err := (jsonCodec{}).Marshal(m)
		if err != nil {
			t.Fatalf("%T decoded from %q does not encode: %v", m, b, err)
		}
		again := newMsg()
		if err := (jsonCodec{}).Unmarshal(enc, again); err != nil {
			t.Fatalf("%T decoded from %q re-encodes as %s, which does not decode: %v", m, b, enc, err)
		}
		if enc2, _ := (jsonCodec{}).Marshal(again); !bytes.Equal(enc2, enc) {
			t.Fatalf("%T decoded from %q re-encodes as %s, then as %s", m, b, enc, enc2)
		}
	}
}

// fuzzRequest builds FuzzE2B's request: headers holds "Name: value"
// lines (for feMultipart its first line is the part's file name).
func fuzzRequest(method, target, headers string, body []byte, flags uint8, s *Server) (*http.Request, bool) {
	var fileName string
	if flags&feMultipart != 0 {
		fileName, headers, _ = strings.Cut(headers, "\n")
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		w, err := mw.CreateFormFile("file", fileName)
		if err != nil {
			return nil, false
		}
		w.Write(body)
		mw.Close()
		body = buf.Bytes()
		headers = "Content-Type: " + mw.FormDataContentType() + "\n" + headers
	}
	if flags&feGzip != 0 {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		zw.Write(body)
		zw.Close()
		body = buf.Bytes()
	}
	if flags&feEnvelope != 0 {
		env := []byte{0, 0, 0, 0, 0}
		if flags&feGzip != 0 {
			env[0] = 1 // compressed
		}
		binary.BigEndian.PutUint32(env[1:], uint32(len(body)))
		body = append(env, body...)
	}
	req, err := http.NewRequest(method, "http://api.test"+target, bytes.NewReader(body))
	if err != nil {
		return nil, false
	}
	req.RequestURI = target
	if flags&feAPIKey != 0 {
		req.Header.Set("X-API-KEY", "k1")
	}
	if flags&feEnvd != 0 {
		req.Header.Set("E2b-Sandbox-Id", "sbx1")
		req.Header.Set("X-Access-Token", s.AccessToken("sbx1"))
	}
	switch {
	case flags&feEnvelope != 0:
		req.Header.Set("Content-Type", "application/connect+json")
		if flags&feGzip != 0 {
			req.Header.Set("Connect-Content-Encoding", "gzip")
		}
	case flags&feJSON != 0:
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Connect-Protocol-Version", "1")
		if flags&feGzip != 0 {
			req.Header.Set("Content-Encoding", "gzip")
		}
	case flags&feGzip != 0:
		req.Header.Set("Content-Encoding", "gzip")
	}
	if flags&feBasicUser != 0 {
		req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("user:")))
	}
	for _, line := range strings.Split(headers, "\n") {
		k, v, ok := strings.Cut(line, ":")
		k = strings.TrimSpace(k)
		if !ok || k == "" || strings.ContainsAny(k, " \t\r\x00") {
			continue
		}
		req.Header.Set(k, strings.TrimSpace(v))
	}
	return req, true
}

// fuzzAPIKey is the API key a control-plane request carries, as auth
// reads it.
func fuzzAPIKey(h http.Header) string {
	secret := strings.TrimSpace(h.Get("X-API-KEY"))
	if secret == "" {
		secret, _ = strings.CutPrefix(h.Get("Authorization"), "Bearer ")
		secret = strings.TrimSpace(secret)
	}
	return secret
}

// fuzzMayReach reports whether r proves access to sandbox id: it names id
// with id's access token, or it is a signed file URL for /files made with
// id's token (for the operation its method is), unexpired.
func fuzzMayReach(s *Server, r *http.Request, id string) bool {
	if r.Header.Get("E2b-Sandbox-Id") == id && subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Access-Token")), []byte(s.AccessToken(id))) == 1 {
		return true
	}
	q := r.URL.Query()
	if r.URL.Path != "/files" || !q.Has("signature") {
		return false
	}
	if h := r.Header.Get("E2b-Sandbox-Id"); h != "" && h != id {
		return false
	}
	op := map[string]string{http.MethodGet: "read", http.MethodPost: "write"}[r.Method]
	exp := q.Get("signature_expiration")
	if exp != "" {
		at, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || time.Now().Unix() > at {
			return false
		}
	}
	return q.Get("signature") == fileSignature(q.Get("path"), op, q.Get("username"), s.AccessToken(id), exp)
}

// fuzzMayProxy reports whether r may reach sandbox id's code interpreter:
// it names it (E2b-Sandbox-Id, E2b-Sandbox-Port 49999) and carries at
// least one of its tokens and no other value in their headers.
func fuzzMayProxy(s *Server, r *http.Request, id string) bool {
	if r.Header.Get("E2b-Sandbox-Id") != id || strings.TrimSpace(r.Header.Get("E2b-Sandbox-Port")) != "49999" {
		return false
	}
	n := 0
	for h, want := range map[string]string{"X-Access-Token": s.AccessToken(id), "E2b-Traffic-Access-Token": s.TrafficAccessToken(id)} {
		for _, v := range r.Header.Values(h) {
			if subtle.ConstantTimeCompare([]byte(v), []byte(want)) != 1 {
				return false
			}
			n++
		}
	}
	return n > 0
}

// fuzzCreateModel is the CreateRequest a plain reading of E2B's
// NewSandbox makes of a create's body: false if it is refused.
func fuzzCreateModel(body []byte) (CreateRequest, bool) {
	var v struct {
		TemplateID string            `json:"templateID"`
		Timeout    *int              `json:"timeout"`
		Metadata   map[string]string `json:"metadata"`
		EnvVars    map[string]string `json:"envVars"`
		Internet   *bool             `json:"allow_internet_access"`
		Network    *struct {
			AllowOut    []string        `json:"allowOut"`
			DenyOut     []string        `json:"denyOut"`
			EgressProxy json.RawMessage `json:"egressProxy"`
			Rules       json.RawMessage `json:"rules"`
		} `json:"network"`
		AutoPause *bool `json:"autoPause"`
	}
	if len(bytes.TrimSpace(body)) > 0 && json.Unmarshal(body, &v) != nil {
		return CreateRequest{}, false
	}
	ttl := 300
	if v.Timeout != nil {
		ttl = *v.Timeout
	}
	req := CreateRequest{Template: v.TemplateID, TTLSeconds: &ttl, Metadata: v.Metadata, Env: v.EnvVars}
	if req.Template == "" {
		req.Template = "base"
	}
	if v.Internet != nil || v.Network != nil {
		n := Network{Internet: v.Internet == nil || *v.Internet}
		if v.Network != nil {
			if len(v.Network.EgressProxy) > 0 && string(v.Network.EgressProxy) != "null" ||
				len(v.Network.Rules) > 0 && string(v.Network.Rules) != "null" && string(v.Network.Rules) != "{}" {
				return CreateRequest{}, false
			}
			n.AllowOut, n.DenyOut = v.Network.AllowOut, v.Network.DenyOut
		}
		req.Network = &n
	}
	if v.AutoPause != nil && *v.AutoPause {
		req.OnExpire = "pause"
	}
	return req, true
}

// FuzzSignedFileURL sends signed file URLs (the SDK's uploadUrl and
// downloadUrl: /files?path&username&signature&signature_expiration, with
// or without E2b-Sandbox-Id) and checks that the guest of a sandbox is
// reached exactly when the signature is the one made with that
// sandbox's access token for this path, user and operation (and
// expiration, unexpired), for the sandbox the request names or else one
// of the running ones: signatures the harness makes itself (flag bit 1,
// with the token of sbx1, other1 or the stopped gone1) are accepted as
// made, any other is refused, and a signature never opens another
// sandbox than its maker's.
func FuzzSignedFileURL(f *testing.F) {
	far := strconv.FormatInt(time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), 10)
	for _, s := range []struct {
		path, user, exp, sig string
		flags                uint8
	}{
		{"/home/user/a.txt", "user", far, "", 2},
		{"a.txt", "", "", "", 2 | 4},
		{"/etc/passwd", "root", "", "", 1 | 2 | 8},
		{"/x", "", "1", "", 2},        // expired
		{"/x", "", "-5", "", 2},       // expired
		{"/x", "", far + "0", "", 2},  // the year 3000 and more
		{"/x", "", " 1", "", 2},       // not a number
		{"/x", "bad user", "", "", 2}, // signed, but no such user can be
		{"/x", "", "", "", 2 | 16},    // made with a stopped sandbox's token
		{"/x", "", "", "", 2 | 8 | 4}, // other1's signature, naming sbx1
		{"/x", "", "", "v1_" + strings.Repeat("A", 43), 0},
		{"/x", "", "", "v1_", 4},
		{"/x\x00y", "", "", "", 2},
		{"", "", "", "", 2 | 1},
	} {
		f.Add(s.path, s.user, s.exp, s.sig, s.flags)
	}
	f.Fuzz(func(t *testing.T, p, user, exp, sig string, flags uint8) {
		b := &fuzzBackend{}
		s, err := New(b, fuzzSecret, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		method, op := http.MethodGet, "read"
		if flags&1 != 0 {
			method, op = http.MethodPost, "write"
		}
		signer := "sbx1"
		switch {
		case flags&8 != 0:
			signer = "other1"
		case flags&16 != 0:
			signer = "gone1"
		}
		if flags&2 != 0 {
			sig = fileSignature(p, op, user, s.AccessToken(signer), exp)
		}
		q := url.Values{"path": {p}, "signature": {sig}}
		if user != "" {
			q.Set("username", user)
		}
		if exp != "" {
			q.Set("signature_expiration", exp)
		}
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader("data")
		}
		req := httptest.NewRequest(method, "/files?"+q.Encode(), body)
		if method == http.MethodPost {
			req.Header.Set("Content-Type", "application/octet-stream")
		}
		named := ""
		if flags&4 != 0 {
			named = "sbx1"
			req.Header.Set("E2b-Sandbox-Id", named)
		}
		rec := httptest.NewRecorder()
		s.Intercept(http.NotFoundHandler()).ServeHTTP(rec, req)

		// Which sandbox the model says the URL opens, if any: the named
		// one, or the first running one, whose token made the signature.
		want := ""
		candidates := []string{"sbx1", "other1"} // Running, in its order
		if named != "" {
			candidates = []string{named}
		}
		for _, id := range candidates {
			if sig == fileSignature(p, op, user, s.AccessToken(id), exp) {
				want = id
				break
			}
		}
		if exp != "" {
			at, err := strconv.ParseInt(exp, 10, 64)
			if err != nil || time.Now().Unix() > at {
				want = ""
			}
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		got := ""
		if len(b.guests) > 0 {
			got = b.guests[0]
		}
		if len(b.guests) > 1 || len(b.g.ops) > 0 && got == "" {
			t.Fatalf("%s /files?%s: guests %v reached, ops %v", method, q.Encode(), b.guests, b.g.ops)
		}
		if got != want {
			t.Fatalf("%s /files?%s (E2b-Sandbox-Id %q): reached sandbox %q, want %q; answer %d %s", method, q.Encode(), named, got, want, rec.Code, rec.Body)
		}
		if rec.Code >= 500 && rec.Code != http.StatusBadGateway {
			t.Fatalf("%s /files?%s: %d %s", method, q.Encode(), rec.Code, rec.Body)
		}
	})
}

// fuzzErr is an error of the fake Backend, classified by its status.
type fuzzErr struct {
	status int
	msg    string
}

func (e *fuzzErr) Error() string { return e.msg }

// fuzzBackend is the fake world's Backend. Embedding Backend keeps it
// compiling when the interface grows; a handler calling a new method
// then panics, and the seeds say which to add.
type fuzzBackend struct {
	Backend
	processes bool // its guests keep background processes

	mu      sync.Mutex
	calls   []string // Backend calls made for a key (after Authenticate)
	guests  []string // sandboxes whose guest was asked for
	proxied []string // sandboxes whose code interpreter was proxied to
	created []CreateRequest
	lists   []ListFilter
	g       fuzzGuestLog
}

func (b *fuzzBackend) call(name string) {
	b.mu.Lock()
	b.calls = append(b.calls, name)
	b.mu.Unlock()
}

func (b *fuzzBackend) Authenticate(ctx context.Context, secret string) (string, error) {
	if k, ok := fuzzKeys[secret]; ok {
		return k, nil
	}
	return "", &fuzzErr{http.StatusUnauthorized, "unknown API key"}
}

func (b *fuzzBackend) sandbox(keyID, id string) (Sandbox, error) {
	sb, ok := fuzzSandboxes[id]
	if !ok || sb.key != keyID {
		return Sandbox{}, &fuzzErr{http.StatusNotFound, fmt.Sprintf("sandbox %q not found", id)}
	}
	return Sandbox{ID: id, Template: "base", State: sb.state, MemoryMiB: 512, VCPUs: 1, CreatedAt: time.Unix(1700000000, 0),
		ExpiresAt: time.Unix(1700000300, 0), Metadata: map[string]string{"k": "v"}}, nil
}

func (b *fuzzBackend) Create(ctx context.Context, keyID string, req CreateRequest) (Sandbox, error) {
	b.call("Create")
	b.mu.Lock()
	b.created = append(b.created, req)
	b.mu.Unlock()
	return Sandbox{ID: "new" + keyID, Template: req.Template, State: "running", Metadata: req.Metadata}, nil
}

func (b *fuzzBackend) Get(ctx context.Context, keyID, id string) (Sandbox, error) {
	b.call("Get")
	return b.sandbox(keyID, id)
}

func (b *fuzzBackend) List(ctx context.Context, keyID string, f ListFilter) ([]Sandbox, error) {
	b.call("List")
	b.mu.Lock()
	b.lists = append(b.lists, f)
	b.mu.Unlock()
	var out []Sandbox
	for id := range fuzzSandboxes {
		if sb, err := b.sandbox(keyID, id); err == nil {
			out = append(out, sb)
		}
	}
	return out, nil
}

func (b *fuzzBackend) Kill(ctx context.Context, keyID, id string) error {
	b.call("Kill")
	_, err := b.sandbox(keyID, id)
	return err
}

func (b *fuzzBackend) SetTTL(ctx context.Context, keyID, id string, seconds int) error {
	b.call("SetTTL")
	if seconds < 0 {
		return &fuzzErr{http.StatusUnprocessableEntity, "a negative timeout"}
	}
	_, err := b.sandbox(keyID, id)
	return err
}

func (b *fuzzBackend) SetNetwork(ctx context.Context, keyID, id string, n Network) error {
	b.call("SetNetwork")
	_, err := b.sandbox(keyID, id)
	return err
}

func (b *fuzzBackend) Pause(ctx context.Context, keyID, id string) error {
	b.call("Pause")
	sb, err := b.sandbox(keyID, id)
	if err == nil && sb.State != "running" {
		err = &fuzzErr{http.StatusConflict, "not running"}
	}
	return err
}

func (b *fuzzBackend) Resume(ctx context.Context, keyID, id string) (Sandbox, error) {
	b.call("Resume")
	sb, err := b.sandbox(keyID, id)
	if err == nil && sb.State != "paused" {
		err = &fuzzErr{http.StatusConflict, "not paused"}
	}
	sb.State = "running"
	return sb, err
}

func (b *fuzzBackend) Fork(ctx context.Context, keyID, id string, count int, ttlSeconds *int) ([]ForkChild, error) {
	b.call("Fork")
	sb, err := b.sandbox(keyID, id)
	if err != nil {
		return nil, err
	}
	if count < 1 || count > 4 {
		return nil, &fuzzErr{http.StatusUnprocessableEntity, "count must be 1 to 4"}
	}
	out := make([]ForkChild, count)
	for i := range out {
		out[i].Sandbox = sb
		out[i].Sandbox.ID = fmt.Sprintf("%sc%d", id, i)
	}
	out[count-1] = ForkChild{Err: &fuzzErr{http.StatusTooManyRequests, "quota"}}
	return out, nil
}

func (b *fuzzBackend) Guest(ctx context.Context, id string) (host.Guest, error) {
	b.mu.Lock()
	b.guests = append(b.guests, id)
	b.mu.Unlock()
	if sb, ok := fuzzSandboxes[id]; !ok || sb.state != "running" {
		return nil, &fuzzErr{http.StatusNotFound, "not running"}
	}
	g := &fuzzGuest{id: id, log: &b.g, mu: &b.mu}
	if b.processes {
		return &fuzzProcGuest{g}, nil
	}
	return g, nil
}

// Proxy answers as a code interpreter of a running sandbox would, having
// read the body.
func (b *fuzzBackend) Proxy(w http.ResponseWriter, r *http.Request, id string, port int) error {
	b.mu.Lock()
	b.proxied = append(b.proxied, id)
	b.mu.Unlock()
	if sb, ok := fuzzSandboxes[id]; !ok || sb.state != "running" || port != CodePort {
		return &fuzzErr{http.StatusNotFound, "not running"}
	}
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Write([]byte(`{"type":"end_of_execution"}` + "\n"))
	return nil
}

// AcquireGuest grants a slot of every sandbox of the world (the caller
// proved access with its token); an unknown one is not found.
func (b *fuzzBackend) AcquireGuest(ctx context.Context, id string) (func(), error) {
	if _, ok := fuzzSandboxes[id]; !ok {
		return nil, &fuzzErr{http.StatusNotFound, "no such sandbox"}
	}
	return func() {}, nil
}

func (b *fuzzBackend) MaxUploadBytes() int64 { return 1 << 20 }

func (b *fuzzBackend) Running(ctx context.Context) ([]string, error) {
	return []string{"sbx1", "other1"}, nil
}

func (b *fuzzBackend) Status(err error) (int, string) {
	var fe *fuzzErr
	switch {
	case errors.As(err, &fe):
		return fe.status, fe.msg
	case errors.Is(err, context.Canceled):
		return 499, "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "timed out"
	}
	switch guestproto.CodeOf(err) {
	case guestproto.CodeNotFound:
		return http.StatusNotFound, err.Error()
	case guestproto.CodeExists, guestproto.CodeExited:
		return http.StatusConflict, err.Error()
	case guestproto.CodeInvalid, guestproto.CodeNotDir, guestproto.CodeIsDir:
		return http.StatusUnprocessableEntity, err.Error()
	}
	return http.StatusInternalServerError, "unclassified: " + err.Error()
}

// fuzzGuestOp is one call a guest got.
type fuzzGuestOp struct {
	sandbox, op, path, user string
	argv                    []string
}

type fuzzGuestLog struct{ ops []fuzzGuestOp }

// fuzzGuest is a guest with a small fixed file tree: /home/user exists,
// directories are d, d/d and d/d/d below any directory (so recursive
// listings end), a name "missing" is not there.
type fuzzGuest struct {
	id  string
	log *fuzzGuestLog
	mu  *sync.Mutex
}

func (g *fuzzGuest) record(op fuzzGuestOp) {
	op.sandbox = g.id
	g.mu.Lock()
	g.log.ops = append(g.log.ops, op)
	g.mu.Unlock()
}

func (g *fuzzGuest) info(p string) (guestproto.FileInfo, error) {
	if path.Base(p) == "missing" {
		return guestproto.FileInfo{}, guestproto.Errorf(guestproto.CodeNotFound, "%s: no such file", p)
	}
	dir := p == "/" || p == "/home/user" || path.Base(p) == "d"
	return guestproto.FileInfo{Name: path.Base(p), Path: p, Size: 5, Mode: 0o644, IsDir: dir, MtimeUnixNano: 1}, nil
}

func (g *fuzzGuest) StartExec(ctx context.Context, req guestproto.ExecRequest) (host.Process, error) {
	g.record(fuzzGuestOp{op: "exec", path: req.Cwd, user: req.User, argv: req.Argv})
	return &fuzzProcess{out: strings.NewReader("out\n")}, nil
}

func (g *fuzzGuest) ReadFile(ctx context.Context, p string) (io.ReadCloser, guestproto.FileInfo, error) {
	g.record(fuzzGuestOp{op: "read", path: p})
	fi, err := g.info(p)
	if err != nil {
		return nil, fi, err
	}
	return io.NopCloser(strings.NewReader("hello")), fi, nil
}

func (g *fuzzGuest) WriteFile(ctx context.Context, p string, r io.Reader, mode fs.FileMode) (int64, error) {
	g.record(fuzzGuestOp{op: "write", path: p})
	return io.Copy(io.Discard, io.LimitReader(r, 1<<20))
}

func (g *fuzzGuest) ListDir(ctx context.Context, p string) ([]guestproto.FileInfo, error) {
	g.record(fuzzGuestOp{op: "list", path: p})
	out := []guestproto.FileInfo{{Name: "a.txt", Size: 1, Mode: 0o644}, {Name: "link", IsSymlink: true, LinkTarget: "/"}}
	if strings.Count(p, "/d") < 3 {
		out = append(out, guestproto.FileInfo{Name: "d", IsDir: true, Mode: 0o755})
	}
	return out, nil
}

func (g *fuzzGuest) Stat(ctx context.Context, p string) (guestproto.FileInfo, error) {
	g.record(fuzzGuestOp{op: "stat", path: p})
	return g.info(p)
}

func (g *fuzzGuest) Mkdir(ctx context.Context, p string) error {
	g.record(fuzzGuestOp{op: "mkdir", path: p})
	return nil
}

func (g *fuzzGuest) Remove(ctx context.Context, p string, recursive bool) error {
	g.record(fuzzGuestOp{op: "remove", path: p})
	return nil
}

func (g *fuzzGuest) Rename(ctx context.Context, oldpath, newpath string) error {
	g.record(fuzzGuestOp{op: "rename", path: oldpath})
	g.record(fuzzGuestOp{op: "rename", path: newpath})
	return nil
}

func (g *fuzzGuest) WatchDir(ctx context.Context, p string, recursive bool) (*guestproto.DirWatch, error) {
	g.record(fuzzGuestOp{op: "watch", path: p})
	sent := false
	return guestproto.NewDirWatch(func() (guestproto.WatchEvent, error) {
		if !sent {
			sent = true
			return guestproto.WatchEvent{Type: "create", Path: path.Join(p, "new")}, nil
		}
		return guestproto.WatchEvent{}, io.EOF
	}, func() error { return nil }), nil
}

// fuzzProcess is a command that printed "out" and exited 0.
type fuzzProcess struct{ out io.Reader }

func (p *fuzzProcess) PID() int              { return 7 }
func (p *fuzzProcess) Stdin() io.WriteCloser { return nopWriteCloser{} }
func (p *fuzzProcess) Stdout() io.Reader     { return p.out }
func (p *fuzzProcess) Stderr() io.Reader     { return strings.NewReader("") }
func (p *fuzzProcess) Wait() (guestproto.ExecResult, error) {
	return guestproto.ExecResult{ExitCode: 0}, nil
}

type nopWriteCloser struct{}

func (nopWriteCloser) Write(p []byte) (int, error) { return len(p), nil }
func (nopWriteCloser) Close() error                { return nil }

// fuzzProcGuest is a fuzzGuest that keeps background processes: pid 7
// runs, prints "out" and has exited by the time one attaches to it.
type fuzzProcGuest struct{ *fuzzGuest }

var _ host.ProcessGuest = (*fuzzProcGuest)(nil)

func (g *fuzzProcGuest) proc(pid int) (guestproto.ProcInfo, error) {
	if pid != 7 {
		return guestproto.ProcInfo{}, guestproto.Errorf(guestproto.CodeNotFound, "no process %d", pid)
	}
	return guestproto.ProcInfo{PID: 7, Cmd: "sh", State: guestproto.ProcRunning}, nil
}

func (g *fuzzProcGuest) StartProcess(ctx context.Context, req guestproto.ExecRequest) (guestproto.ProcInfo, error) {
	g.record(fuzzGuestOp{op: "start", path: req.Cwd, user: req.User, argv: req.Argv})
	return g.proc(7)
}

func (g *fuzzProcGuest) ListProcesses(ctx context.Context) ([]guestproto.ProcInfo, error) {
	p, _ := g.proc(7)
	return []guestproto.ProcInfo{p}, nil
}

func (g *fuzzProcGuest) AttachProcess(ctx context.Context, pid int, stdoutOffset, stderrOffset int64) (*guestproto.Attachment, error) {
	p, err := g.proc(pid)
	if err != nil {
		return nil, err
	}
	exited := p
	exited.State, exited.Exit = guestproto.ProcExited, &guestproto.ExecResult{ExitCode: 1}
	return guestproto.NewAttachment(guestproto.AttachStart{}, p, strings.NewReader("out"), strings.NewReader(""),
		func() (guestproto.ProcInfo, bool, error) { return exited, false, nil }, func() {}), nil
}

func (g *fuzzProcGuest) WriteProcessStdin(ctx context.Context, pid int, p []byte) error {
	_, err := g.proc(pid)
	return err
}

func (g *fuzzProcGuest) CloseProcessStdin(ctx context.Context, pid int) error {
	_, err := g.proc(pid)
	return err
}

func (g *fuzzProcGuest) SignalProcess(ctx context.Context, pid int, signal string) error {
	_, err := g.proc(pid)
	return err
}

func (g *fuzzProcGuest) WaitProcess(ctx context.Context, pid int) (guestproto.ProcInfo, error) {
	return g.proc(pid)
}

func (g *fuzzProcGuest) RemoveProcess(ctx context.Context, pid int) error {
	_, err := g.proc(pid)
	return err
}

func (g *fuzzProcGuest) ResizeProcess(ctx context.Context, pid, rows, cols int) error {
	_, err := g.proc(pid)
	return err
}
