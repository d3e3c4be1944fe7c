package cli

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// result is what one CLI invocation did.
type result struct {
	stdout, stderr string
	err            error
}

// exitCode is the status main would exit with.
func (r result) exitCode() int {
	var ee ExitError
	switch {
	case r.err == nil:
		return 0
	case errors.As(r.err, &ee):
		return ee.Code
	}
	return 1
}

// runCLI runs the verbs in-process under a root command like main's.
func runCLI(ctx context.Context, stdin string, args ...string) result {
	root := &cobra.Command{Use: "panda", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(Commands()...)
	var stdout, stderr strings.Builder
	root.SetArgs(args)
	root.SetOut(&stdout)
	root.SetErr(&stderr)
	root.SetIn(strings.NewReader(stdin))
	err := root.ExecuteContext(ctx)
	return result{stdout.String(), stderr.String(), err}
}

// fakeAPI is a test double of the HTTP layer that records requests.
type fakeAPI struct {
	t    *testing.T
	url  string
	reqs []string // "METHOD PATH?QUERY BODY AUTH"
}

func newFakeAPI(t *testing.T, h func(w http.ResponseWriter, r *http.Request, body string)) *fakeAPI {
	f := &fakeAPI{t: t}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.reqs = append(f.reqs, strings.TrimSpace(r.Method+" "+r.URL.RequestURI()+" "+canonJSON(b)+" "+r.Header.Get("Authorization")))
		h(w, r, string(b))
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL
	return f
}

// canonJSON is a JSON body with its object keys sorted (what a field's
// place in a struct decides is not part of the wire contract), or b as it
// is when it is not JSON.
func canonJSON(b []byte) string {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return string(b)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

func isolateEnv(t *testing.T) {
	t.Setenv("PANDASTACK_API_URL", "")
	t.Setenv("PANDASTACK_API_KEY", "")
	t.Setenv("PANDA_DATA_DIR", t.TempDir()) // no admin.key
}

func TestArgumentErrors(t *testing.T) {
	isolateEnv(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"get"}, "usage: panda get ID"},
		{[]string{"get", "a", "b"}, "usage: panda get ID"},
		{[]string{"exec", "abc"}, "usage: panda exec ID"},
		{[]string{"ttl", "abc", "soon"}, `SECONDS "soon"`},
		{[]string{"ttl", "abc", "0"}, "at least 1"},
		{[]string{"create", "--meta", "novalue"}, `--meta "novalue": want KEY=VALUE`},
		{[]string{"exec", "abc", "--env", "=x", "--", "true"}, "want KEY=VALUE"},
		{[]string{"exec", "abc", "--timeout", "-1", "--", "true"}, "--timeout"},
		{[]string{"fs", "put", "abc", "/no/such/local/file", "/x"}, "no such file"},
		{[]string{"fs", "put", "abc", "-", "/x", "--mode", "9z"}, "octal"},
		{[]string{"kill"}, "usage: panda kill ID..."},
		{[]string{"create", "--api-url", "localhost:7788"}, "invalid API URL"},
		{[]string{"port", "abc"}, "usage: panda port ID PORT"},
		{[]string{"port", "abc", "http"}, `PORT "http"`},
		{[]string{"port", "abc", "65536"}, `PORT "65536"`},
		{[]string{"port", "abc", "80", "--ttl", "-1m"}, "--ttl"},
		{[]string{"port", "abc", "80", "--ttl", "10"}, "--ttl"},
		{[]string{"port", "ls"}, "usage: panda port ls ID"},
		{[]string{"network"}, "usage: panda network ID"},
		{[]string{"network", "abc", "--internet=maybe"}, "--internet"},
		{[]string{"create", "--on-expire", "later"}, "--on-expire must be kill or pause"},
		{[]string{"create", "--host", ""}, "--host needs a host id"},
		{[]string{"fork", "abc", "--host", "h2", "--spread"}, "--host and --spread cannot be used together"},
		{[]string{"fork", "abc", "--spread", "--host", ""}, "--host and --spread cannot be used together"},
		{[]string{"fork", "abc", "--host", ""}, "--host needs a host id"},
		{[]string{"resume", "abc", "--host", ""}, "--host needs a host id"},
		{[]string{"fork", "abc", "-n", "0"}, "--count must be at least 1"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := runCLI(context.Background(), "", tt.args...)
			if r.err == nil || !strings.Contains(r.err.Error(), tt.want) {
				t.Errorf("got error %v, want one containing %q", r.err, tt.want)
			}
			if r.exitCode() != 1 {
				t.Errorf("got exit code %d, want 1", r.exitCode())
			}
		})
	}
}

func TestConnectionRefused(t *testing.T) {
	isolateEnv(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	l.Close()
	r := runCLI(context.Background(), "", "ls", "--api-url", url)
	if r.err == nil || !strings.Contains(r.err.Error(), "is `panda up` running at "+url) {
		t.Errorf("got %v, want a hint to run panda up", r.err)
	}
}

func TestAPIKeySources(t *testing.T) {
	empty := func(w http.ResponseWriter, r *http.Request, _ string) {
		if r.Header.Get("Authorization") == "" {
			w.WriteHeader(401)
			io.WriteString(w, `{"error":{"code":"unauthorized","message":"missing API key"}}`)
			return
		}
		io.WriteString(w, `{"sandboxes":[]}`)
	}
	t.Run("admin key file", func(t *testing.T) {
		isolateEnv(t)
		dir := t.TempDir()
		t.Setenv("PANDA_DATA_DIR", dir)
		os.WriteFile(filepath.Join(dir, "admin.key"), []byte("ps_admin\n"), 0o600)
		f := newFakeAPI(t, empty)
		if r := runCLI(context.Background(), "", "ls", "--api-url", f.url); r.err != nil {
			t.Fatal(r.err)
		}
		if got := f.reqs[0]; !strings.HasSuffix(got, "Bearer ps_admin") {
			t.Errorf("got request %q, want the admin key file's key", got)
		}
	})
	t.Run("env beats file", func(t *testing.T) {
		isolateEnv(t)
		dir := t.TempDir()
		t.Setenv("PANDA_DATA_DIR", dir)
		os.WriteFile(filepath.Join(dir, "admin.key"), []byte("ps_admin\n"), 0o600)
		f := newFakeAPI(t, empty)
		t.Setenv("PANDASTACK_API_URL", f.url)
		t.Setenv("PANDASTACK_API_KEY", "ps_env")
		runCLI(context.Background(), "", "ls")
		runCLI(context.Background(), "", "ls", "--api-key", "ps_flag")
		if len(f.reqs) != 2 || !strings.HasSuffix(f.reqs[0], "Bearer ps_env") || !strings.HasSuffix(f.reqs[1], "Bearer ps_flag") {
			t.Errorf("got requests %q, want the env key then the flag's", f.reqs)
		}
	})
	t.Run("no key hint", func(t *testing.T) {
		isolateEnv(t)
		f := newFakeAPI(t, empty)
		r := runCLI(context.Background(), "", "ls", "--api-url", f.url)
		if r.err == nil || !strings.Contains(r.err.Error(), "no API key is set") || !strings.Contains(r.err.Error(), "missing API key") {
			t.Errorf("got %v, want the server's message and a hint", r.err)
		}
	})
}

func TestExecStreamsAndExits(t *testing.T) {
	isolateEnv(t)
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, body string) {
		if strings.HasSuffix(r.URL.Path, "/exec") {
			io.WriteString(w, `{"exit_code":2,"stdout":"o","stderr":"e","duration_ms":1}`)
			return
		}
		io.WriteString(w, `{"type":"start","pid":1}`+"\n"+`{"type":"stdout","data":"out\n"}`+"\n"+
			`{"type":"stderr","data":"err\n"}`+"\n"+`{"type":"exit","exit_code":7,"duration_ms":3}`+"\n")
	})
	ctx := context.Background()
	r := runCLI(ctx, "", "exec", "--api-url", f.url, "--api-key", "k", "abc", "--", "echo hi; exit 7")
	if r.exitCode() != 7 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Errorf("got exit %d stdout %q stderr %q (%v), want 7 out err", r.exitCode(), r.stdout, r.stderr, r.err)
	}
	runCLI(ctx, "in", "exec", "--api-url", f.url, "--api-key", "k", "-i", "abc", "--cwd", "/tmp", "--user", "1000:1000", "-e", "A=1", "--timeout", "0", "--", "ls", "-l", "a b")
	runCLI(ctx, "", "exec", "--api-url", f.url, "--api-key", "k", "abc", "--timeout", "2.5", "--", "true")
	want := []string{
		`POST /v1/sandboxes/abc/exec/stream {"cmd":"echo hi; exit 7"} Bearer k`,
		`POST /v1/sandboxes/abc/exec/stream {"argv":["ls","-l","a b"],"cwd":"/tmp","env":{"A":"1"},"stdin":"in","timeout_seconds":0,"user":"1000:1000"} Bearer k`,
		`POST /v1/sandboxes/abc/exec/stream {"cmd":"true","timeout_seconds":2.5} Bearer k`,
	}
	for i := range want {
		if i >= len(f.reqs) || f.reqs[i] != want[i] {
			t.Errorf("request %d: got %q, want %q", i, f.reqs[min(i, len(f.reqs)-1)], want[i])
		}
	}

	r = runCLI(ctx, "", "exec", "--api-url", f.url, "--api-key", "k", "--json", "abc", "--", "x")
	var res struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || res.ExitCode != 2 || res.Stdout != "o" || r.exitCode() != 2 {
		t.Errorf("got %q (%v), exit %d, want the JSON result and exit 2", r.stdout, err, r.exitCode())
	}
}

func TestKillReportsEach(t *testing.T) {
	isolateEnv(t)
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, _ string) {
		if strings.HasSuffix(r.URL.Path, "/bad") {
			w.WriteHeader(404)
			io.WriteString(w, `{"error":{"code":"not_found","message":"sandbox bad not found"}}`)
			return
		}
		w.WriteHeader(204)
	})
	r := runCLI(context.Background(), "", "kill", "--api-url", f.url, "--api-key", "k", "a1", "bad", "a2")
	if r.stdout != "a1\na2\n" || r.err == nil || !strings.Contains(r.err.Error(), "kill bad: sandbox bad not found") {
		t.Errorf("got %q %v", r.stdout, r.err)
	}
}

func TestForkPartial(t *testing.T) {
	isolateEnv(t)
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, _ string) {
		io.WriteString(w, `{"children":[{"sandbox":{"id":"c1","state":"running"}},{"error":{"code":"quota_exceeded","message":"at most 2 sandboxes"}}]}`)
	})
	r := runCLI(context.Background(), "", "fork", "--api-url", f.url, "--api-key", "k", "abc", "-n", "2")
	if r.stdout != "c1\n" || !strings.Contains(r.stderr, "at most 2 sandboxes") || r.err == nil || r.exitCode() != 1 {
		t.Errorf("got %q %q %v", r.stdout, r.stderr, r.err)
	}
	if f.reqs[0] != `POST /v1/sandboxes/abc/fork {"count":2} Bearer k` {
		t.Errorf("got request %q", f.reqs[0])
	}
}

// TestPlacementFlags: --host and --spread reach the API as placement.
func TestPlacementFlags(t *testing.T) {
	isolateEnv(t)
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, _ string) {
		if strings.HasSuffix(r.URL.Path, "/fork") {
			io.WriteString(w, `{"children":[{"sandbox":{"id":"c1","state":"running","host_id":"h2"}}]}`)
			return
		}
		io.WriteString(w, `{"id":"abc","state":"running","host_id":"h2"}`)
	})
	tests := []struct {
		args []string
		req  string
	}{
		{[]string{"create", "--host", "h2"}, `POST /v1/sandboxes?progress=1 {"placement":{"host":"h2"}}`},
		{[]string{"fork", "abc"}, `POST /v1/sandboxes/abc/fork {"count":1}`},
		{[]string{"fork", "abc", "-n", "3", "--spread"}, `POST /v1/sandboxes/abc/fork {"count":3,"placement":"spread"}`},
		{[]string{"fork", "abc", "--host", "h2"}, `POST /v1/sandboxes/abc/fork {"count":1,"placement":{"host":"h2"}}`},
		{[]string{"fork", "abc", "--host", "h2", "--spread=false"}, `POST /v1/sandboxes/abc/fork {"count":1,"placement":{"host":"h2"}}`},
		{[]string{"resume", "abc"}, `POST /v1/sandboxes/abc/resume `},
		{[]string{"resume", "abc", "--host", "h2"}, `POST /v1/sandboxes/abc/resume {"placement":{"host":"h2"}}`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			f.reqs = nil
			r := runCLI(context.Background(), "", append(tt.args, "--api-url", f.url, "--api-key", "k")...)
			if r.err != nil && !strings.Contains(r.err.Error(), "children failed") {
				t.Fatal(r.err)
			}
			if want := tt.req + " Bearer k"; len(f.reqs) != 1 || f.reqs[0] != want {
				t.Errorf("got requests %q, want %q", f.reqs, want)
			}
		})
	}
}

func TestHumanOutputs(t *testing.T) {
	isolateEnv(t)
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, _ string) {
		switch r.URL.Path {
		case "/v1/sandboxes":
			io.WriteString(w, `{"sandboxes":[{"id":"k3v9","template":"tiny","state":"running","memory_mib":256,"vcpus":1,"created_at":"2025-01-01T00:00:00Z","metadata":{"b":"2","a":"1"},"host_id":"h7"}]}`)
		case "/v1/templates":
			io.WriteString(w, `{"templates":[{"name":"tiny","memory_mib":256,"vcpus":1,"state":"ready","bake_ms":1500},`+
				`{"name":"app","version":2,"latest_version":2,"public":true,"memory_mib":256,"vcpus":1,"state":"not_baked","disk_bytes":52428800,"from_image":"r/app:2",`+
				`"versions":[{"version":1,"size_bytes":104857600,"disk_bytes":31457280,"from_image":"r/app:1","build_ms":2500},{"version":2,"published":true,"size_bytes":104857600,"disk_bytes":52428800,"from_image":"r/app:2"}]}]}`)
		case "/v1/keys":
			io.WriteString(w, `{"keys":[{"id":"key1","name":"ci","admin":false,"prefix":"ps_ab","created_at":"2025-01-01T00:00:00Z"},`+
				`{"id":"key2","name":"old","admin":false,"prefix":"ps_cd","created_at":"2025-01-01T00:00:00Z","revoked":true}]}`)
		case "/v1/sandboxes/abc/files/list":
			io.WriteString(w, `{"entries":[{"name":"d","path":"/d","size":4096,"mode":493,"is_dir":true},{"name":"l","path":"/l","size":1,"mode":511,"is_dir":false,"is_symlink":true,"link_target":"/d"}]}`)
		case "/v1/hosts":
			io.WriteString(w, `{"hosts":[{"id":"h1","state":"ready","sandboxes":3},{"id":"h2","state":"ready","network_off":true},{"id":"h3","state":"lost"}]}`)
		case "/v1/snapshots":
			io.WriteString(w, `{"snapshots":[{"id":"s1","template":"tiny","memory_mib":256,"stored":"durable"},`+
				`{"id":"s2","template":"tiny","memory_mib":256,"stored":"uploading","store_error":"the object store is unavailable"}]}`)
		case "/v1/sandboxes/abc/ports":
			io.WriteString(w, `{"ports":[{"port":8000,"address":"::"},{"port":9000,"address":"127.0.0.1"}]}`)
		case "/v1/sandboxes/abc/ports/8000/url":
			io.WriteString(w, `{"url":"http://h/p/TOKEN/","expires_at":"2030-01-01T00:00:00Z"}`)
		}
	})
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"ls"}, []string{"ID", "HOST", "k3v9", "tiny", "running", "h7", "256 MiB", "a=1,b=2"}},
		{[]string{"template", "ls"}, []string{"tiny", "ready", "1.5s", "SIZE", "BUILT", "2 (latest), published", "50.0 MiB", "r/app:2"}},
		{[]string{"template", "ls", "app"}, []string{"app:1 ", "30.0 MiB", "100.0 MiB", "2.5s", "r/app:1", "app:2 (latest, published)"}},
		{[]string{"keys", "ls"}, []string{"key1", "ci", "active", "ps_ab"}},
		{[]string{"keys", "ls", "--all"}, []string{"key1", "active", "key2", "old", "revoked"}},
		{[]string{"fs", "ls", "abc", "/"}, []string{"drwxr-xr-x", "d/", "Lrwxrwxrwx", "l -> /d"}},
		{[]string{"hosts"}, []string{"NETWORK", "h1", "ready", "3", " on ", " off ", "h3", "lost"}},
		{[]string{"snapshot", "ls"}, []string{"STORED", "s1", "durable", "s2", "uploading (the object store is unavailable)"}},
		{[]string{"port", "ls", "abc"}, []string{"PORT", "8000", "::", "yes", "9000", "127.0.0.1", "no: loopback only"}},
		{[]string{"port", "abc", "8000", "--ttl", "10m"}, []string{"http://h/p/TOKEN/\n"}},
		{[]string{"port", "abc", "8000", "--json"}, []string{`"url": "http://h/p/TOKEN/"`, `"expires_at": "2030-01-01T00:00:00Z"`}},
	}
	for _, tt := range tests {
		r := runCLI(context.Background(), "", append(tt.args, "--api-url", f.url, "--api-key", "k")...)
		if r.err != nil {
			t.Errorf("%v: %v", tt.args, r.err)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(r.stdout, w) {
				t.Errorf("%v: got\n%s\nwant it to contain %q", tt.args, r.stdout, w)
			}
		}
	}
	// ls -q prints the ids alone.
	if r := runCLI(context.Background(), "", "ls", "-q", "--api-url", f.url, "--api-key", "k"); r.err != nil || r.stdout != "k3v9\n" {
		t.Errorf("ls -q: %v, got %q, want the id alone", r.err, r.stdout)
	}
	// Revoked keys are left out unless asked for.
	if r := runCLI(context.Background(), "", "keys", "ls", "--api-url", f.url, "--api-key", "k"); r.err != nil || strings.Contains(r.stdout, "key2") {
		t.Errorf("keys ls: %v, got\n%s\nwant the revoked key2 left out", r.err, r.stdout)
	}
	if want := `POST /v1/sandboxes/abc/ports/8000/url {"ttl_seconds":600} Bearer k`; !slices.Contains(f.reqs, want) {
		t.Errorf("requests %q: want %q among them", f.reqs, want)
	}
}

func TestFsWatch(t *testing.T) {
	isolateEnv(t)
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, body string) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"type":"create","path":"/w/f"}`+"\n"+`{"type":"rename","path":"/w/g","old_path":"/w/f"}`+"\n"+`{"type":"overflow"}`+"\n")
	})
	r := runCLI(context.Background(), "", "fs", "watch", "abc", "/w", "-r", "--api-url", f.url, "--api-key", "k")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if want := "GET /v1/sandboxes/abc/watch?path=%2Fw&recursive=true  Bearer k"; len(f.reqs) != 1 || f.reqs[0] != want {
		t.Errorf("got requests %q, want %q", f.reqs, want)
	}
	if want := "create /w/f\nrename /w/f -> /w/g\noverflow (events were lost)\n"; r.stdout != want {
		t.Errorf("got\n%s\nwant\n%s", r.stdout, want)
	}
}

func TestEvents(t *testing.T) {
	isolateEnv(t)
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, body string) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"type":"hello","seq":3}`+"\n"+`{"type":"ping"}`+"\n"+
			`{"seq":4,"type":"sandbox","id":"abc","sandbox":{"id":"abc","state":"running"}}`+"\n"+
			`{"seq":5,"type":"sandbox_deleted","id":"abc","stop_reason":"killed"}`+"\n"+
			`{"seq":6,"type":"snapshot_deleted","id":"sn"}`+"\n")
	})
	r := runCLI(context.Background(), "", "events", "--api-url", f.url, "--api-key", "k")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if want := "GET /v1/events  Bearer k"; len(f.reqs) != 1 || f.reqs[0] != want {
		t.Errorf("got requests %q, want %q", f.reqs, want)
	}
	if want := "4 sandbox abc running\n5 sandbox_deleted abc killed\n6 snapshot_deleted sn\n"; r.stdout != want {
		t.Errorf("got\n%s\nwant\n%s", r.stdout, want)
	}
}

func TestNetworkFlags(t *testing.T) {
	isolateEnv(t)
	sandbox := `{"id":"abc","state":"running","network":{"internet":false,"allow_out":["pypi.org","10.0.0.0/8"]}}`
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, body string) {
		if strings.Contains(body, "bad entry") {
			w.WriteHeader(400)
			io.WriteString(w, `{"error":{"code":"bad_request","message":"network policy: deny_out entry \"bad entry\": not a valid domain name (character ' ')"}}`)
			return
		}
		if r.URL.Path == "/v1/sandboxes/off" { // on a host without sandbox networking
			io.WriteString(w, `{"id":"off","state":"running","network":{"internet":true},"network_off":true}`)
			return
		}
		io.WriteString(w, sandbox)
	})
	tests := []struct {
		args []string
		req  string // the request sent: method, target and body
		out  []string
	}{
		{[]string{"create"}, `POST /v1/sandboxes?progress=1 {}`, []string{"abc\n"}},
		{[]string{"create", "--no-internet", "--allow-out", "pypi.org", "--allow-out", "10.0.0.0/8,*.example.com"},
			`POST /v1/sandboxes?progress=1 {"network":{"allow_out":["pypi.org","10.0.0.0/8","*.example.com"],"internet":false}}`, nil},
		{[]string{"create", "--ttl", "600", "--on-expire", "pause"}, `POST /v1/sandboxes?progress=1 {"on_expire":"pause","ttl_seconds":600}`, []string{"abc\n"}},
		{[]string{"create", "--deny-out", "example.com"}, `POST /v1/sandboxes?progress=1 {"network":{"deny_out":["example.com"],"internet":true}}`, nil},
		{[]string{"network", "abc"}, `GET /v1/sandboxes/abc`, []string{"internet:", "no", "allow_out:", "pypi.org,10.0.0.0/8", "deny_out:", "-"}},
		{[]string{"network", "abc", "--internet=false"}, `PATCH /v1/sandboxes/abc/network {"internet":false}`, nil},
		{[]string{"net", "abc", "--internet", "--deny-out", "a.com", "--deny-out", "b.com"}, `PATCH /v1/sandboxes/abc/network {"deny_out":["a.com","b.com"],"internet":true}`, nil},
		{[]string{"network", "abc", "--allow-out", ""}, `PATCH /v1/sandboxes/abc/network {"allow_out":[]}`, nil},
		{[]string{"network", "abc", "--json"}, `GET /v1/sandboxes/abc`, []string{`"internet": false`, `"allow_out": [`}},
		{[]string{"get", "abc"}, `GET /v1/sandboxes/abc`, []string{"network:", "no internet; allow pypi.org,10.0.0.0/8"}},
		{[]string{"get", "off"}, `GET /v1/sandboxes/off`, []string{"network:", "off (its host runs without sandbox networking; policy: internet)"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			f.reqs = nil
			r := runCLI(context.Background(), "", append(tt.args, "--api-url", f.url, "--api-key", "k")...)
			if r.err != nil {
				t.Fatal(r.err)
			}
			// A GET has no body: the record has two spaces there.
			if want := tt.req + " Bearer k"; len(f.reqs) != 1 || strings.Join(strings.Fields(f.reqs[0]), " ") != want {
				t.Errorf("got requests %q, want %q", f.reqs, want)
			}
			for _, w := range tt.out {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("got\n%s\nwant it to contain %q", r.stdout, w)
				}
			}
		})
	}
	r := runCLI(context.Background(), "", "network", "abc", "--deny-out", "bad entry", "--api-url", f.url, "--api-key", "k")
	if r.err == nil || !strings.Contains(r.err.Error(), `set network of abc: network policy: deny_out entry "bad entry"`) {
		t.Errorf("bad entry: got %v, want the server's message naming the entry", r.err)
	}
}

func TestShort(t *testing.T) {
	tests := []struct {
		secs int
		want string
	}{{0, "0s"}, {59, "59s"}, {61, "1m01s"}, {3600, "1h00m"}, {3 * 86400, "3d"}}
	for _, tt := range tests {
		if got := short(timeSeconds(tt.secs)); got != tt.want {
			t.Errorf("short(%ds) = %q, want %q", tt.secs, got, tt.want)
		}
	}
}

// TestExecCommandWithoutDashes: as with docker exec, panda's flags go
// before the command and everything from its first word on is the
// command's, with or without "--" ("panda exec ID ls -la" failed with
// "unknown shorthand flag").
func TestExecCommandWithoutDashes(t *testing.T) {
	isolateEnv(t)
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, body string) {
		io.WriteString(w, `{"type":"exit","exit_code":0,"duration_ms":1}`+"\n")
	})
	ctx := context.Background()
	for _, args := range [][]string{
		{"abc", "ls", "-la"},
		{"abc", "--", "ls", "-la"},
		{"abc", "--cwd", "/tmp", "ls", "-la", "--json", "-i"},
		{"--cwd", "/tmp", "abc", "-e", "A=1", "--", "ls", "-la"},
		{"abc", "echo hi; ls -la"},
	} {
		if r := runCLI(ctx, "", append([]string{"exec", "--api-url", f.url, "--api-key", "k"}, args...)...); r.err != nil {
			t.Errorf("exec %q: %v", args, r.err)
		}
	}
	want := []string{
		`POST /v1/sandboxes/abc/exec/stream {"argv":["ls","-la"]} Bearer k`,
		`POST /v1/sandboxes/abc/exec/stream {"argv":["ls","-la"]} Bearer k`,
		`POST /v1/sandboxes/abc/exec/stream {"argv":["ls","-la","--json","-i"],"cwd":"/tmp"} Bearer k`,
		`POST /v1/sandboxes/abc/exec/stream {"argv":["ls","-la"],"cwd":"/tmp","env":{"A":"1"}} Bearer k`,
		`POST /v1/sandboxes/abc/exec/stream {"cmd":"echo hi; ls -la"} Bearer k`,
	}
	if !slices.Equal(f.reqs, want) {
		t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(f.reqs, "\n"), strings.Join(want, "\n"))
	}
	for _, args := range [][]string{{"exec", "abc", "--"}, {"exec", "abc", "--cwd", "/tmp"}} {
		if r := runCLI(ctx, "", args...); r.err == nil || !strings.Contains(r.err.Error(), "usage: panda exec ID") {
			t.Errorf("%q: got %v, want the usage", args, r.err)
		}
	}
	if r := runCLI(ctx, "", "exec", "abc", "--help"); r.err != nil || !strings.Contains(r.stdout, "Usage:") {
		t.Errorf("exec ID --help: %v, stdout %q; want the help", r.err, r.stdout)
	}
}

// TestFlagErrorHint: an argument taken for an unknown flag (a negative
// number) gets a hint that names "--".
func TestFlagErrorHint(t *testing.T) {
	isolateEnv(t)
	r := runCLI(context.Background(), "", "ttl", "abc", "-1")
	want := "if -1 is an argument, not a flag of panda ttl, put it after --: panda ttl [flags] -- ID SECONDS"
	if r.err == nil || !strings.Contains(r.err.Error(), "unknown shorthand flag") || !strings.Contains(r.err.Error(), want) {
		t.Errorf("ttl ID -1: got %v, want the flag error and %q", r.err, want)
	}
	r = runCLI(context.Background(), "", "ttl", "abc", "--", "-1")
	if r.err == nil || !strings.Contains(r.err.Error(), `SECONDS "-1": want a whole number of seconds, at least 1`) {
		t.Errorf("ttl ID -- -1: got %v, want the SECONDS error", r.err)
	}
	r = runCLI(context.Background(), "", "fs", "rm", "abc", "-x")
	if r.err == nil || !strings.Contains(r.err.Error(), "put it after --: panda fs rm [flags] -- ID PATH...") {
		t.Errorf("fs rm ID -x: got %v, want the hint", r.err)
	}
}

// TestTemplateRmInUse: the server's refusal of a template in use names
// the API's ?force=true; the CLI says --force.
func TestTemplateRmInUse(t *testing.T) {
	isolateEnv(t)
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request, _ string) {
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"error":{"code":"conflict","message":"template app is in use: 1 sandboxes not stopped and 0 snapshots were made from it; kill and delete them first, or delete with ?force=true (they keep working from their own files)"}}`)
	})
	r := runCLI(context.Background(), "", "template", "rm", "--api-url", f.url, "--api-key", "k", "app")
	if r.err == nil || !strings.Contains(r.err.Error(), "or remove it with --force (they keep working") || strings.Contains(r.err.Error(), "?force") {
		t.Errorf("got %v, want the refusal naming --force", r.err)
	}
}
