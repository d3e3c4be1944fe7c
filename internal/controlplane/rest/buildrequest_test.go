package rest_test

// The request side of Dockerfile builds (POST /v1/templates as JSON with a
// dockerfile, or multipart with spec, dockerfile and context parts), over
// the real tmplbuild.Manager whose Dockerfile hook records the Spec it is
// given: what reaches the builder, the refusals, and that no received
// context is left behind.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/pandastack/pandastack/internal/hostagent/template/build"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// gotSpec is what the Dockerfile hook saw: the Spec, and its context's
// bytes (read while the build runs; the Manager removes the file after).
type gotSpec struct {
	spec    builds.Spec
	context []byte
}

// newDockerfileServer is a build server whose Dockerfile builds go to a
// hook sending what it was given on the returned channel (hook false: no
// hook, so Dockerfile builds are unsupported), receiving contexts in dir,
// at most maxContext bytes.
func newDockerfileServer(t *testing.T, hook bool, maxContext int64) (*buildServer, string, chan gotSpec) {
	t.Helper()
	dir := t.TempDir()
	got := make(chan gotSpec, 1)
	b := newBuildServerWith(t, func(bc *build.Config, ac *rest.Config, _ *controlplane.Config) {
		ac.TemplateContextDir, ac.TemplateContextMaxBytes = dir, maxContext
		if !hook {
			return
		}
		bc.Dockerfile = func(ctx context.Context, spec builds.Spec, out string, progress func(string)) (builds.Result, error) {
			var ctxBytes []byte
			if spec.ContextTar != "" {
				var err error
				if ctxBytes, err = os.ReadFile(spec.ContextTar); err != nil {
					return builds.Result{}, err
				}
			}
			got <- gotSpec{spec, ctxBytes}
			progress("building")
			return builds.Result{Digest: "sha256:def"}, os.WriteFile(out, []byte("rootfs"), 0o644)
		}
	})
	return b, dir, got
}

// part is one part of a multipart body.
type part struct{ name, body string }

func multipartBody(t *testing.T, parts ...part) (io.Reader, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, p := range parts {
		var w io.Writer
		var err error
		if p.name == "context" {
			w, err = mw.CreateFormFile(p.name, "context.tar.gz")
		} else {
			w, err = mw.CreateFormField(p.name)
		}
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, p.body)
	}
	mw.Close()
	return &buf, mw.FormDataContentType()
}

// tarOf is a tar archive of files (name -> content), gzip-compressed if gz.
func tarOf(t *testing.T, gz bool, files ...string) string {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for i := 0; i+1 < len(files); i += 2 {
		tw.WriteHeader(&tar.Header{Name: files[i], Mode: 0o644, Size: int64(len(files[i+1])), Typeflag: tar.TypeReg})
		io.WriteString(tw, files[i+1])
	}
	tw.Close()
	if zw != nil {
		zw.Close()
	}
	return buf.String()
}

func (b *buildServer) post(t *testing.T, body io.Reader, contentType string) (*http.Response, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("POST", b.url+"/v1/templates", body)
	req.Header.Set("Authorization", "Bearer "+b.admin)
	req.Header.Set("Content-Type", contentType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp, out
}

// noContexts fails t if dir holds any file.
func noContexts(t *testing.T, dir, what string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		t.Errorf("%s: %s left in the context directory", what, e.Name())
	}
}

func TestTemplateBuildDockerfileRequestRefused(t *testing.T) {
	b, dir, _ := newDockerfileServer(t, true, 64<<10)
	spec := `{"name":"app"}`
	ctxTar := tarOf(t, true, "Dockerfile", "FROM alpine\n", "app.py", "print(1)\n")
	for _, tc := range []struct {
		name   string
		parts  []part
		status int
		want   string // in the error message
	}{
		{"both image and dockerfile", []part{{"spec", `{"name":"app","from_image":"r.example/app:1"}`}, {"dockerfile", "FROM alpine\n"}}, 400, "not both"},
		{"image and context", []part{{"spec", `{"name":"app","from_image":"r.example/app:1"}`}, {"context", ctxTar}}, 400, "takes none"},
		{"neither", []part{{"spec", spec}}, 400, "nothing to build from"},
		{"no spec", []part{{"dockerfile", "FROM alpine\n"}}, 400, "spec part is missing"},
		{"context before spec", []part{{"dockerfile", "FROM alpine\n"}, {"context", ctxTar}, {"spec", spec}}, 400, "comes before the spec part"},
		{"bad JSON in spec", []part{{"spec", `{"name":"app",`}, {"dockerfile", "FROM alpine\n"}, {"context", ctxTar}}, 400, "malformed JSON in the spec part"},
		{"unknown field in spec", []part{{"spec", `{"name":"app","extra":1}`}, {"dockerfile", "FROM alpine\n"}}, 400, "malformed JSON"},
		{"dockerfile in spec", []part{{"spec", `{"name":"app","dockerfile":"FROM alpine"}`}, {"context", ctxTar}}, 400, "dockerfile part"},
		{"unknown part", []part{{"spec", spec}, {"context", ctxTar}, {"secrets", "x"}}, 400, `unknown part "secrets"`},
		{"spec twice", []part{{"spec", spec}, {"spec", spec}, {"dockerfile", "FROM alpine\n"}}, 400, "twice"},
		{"context twice", []part{{"spec", spec}, {"context", ctxTar}, {"context", ctxTar}}, 400, "twice"},
		{"oversize dockerfile", []part{{"spec", spec}, {"dockerfile", "FROM alpine\n" + strings.Repeat("#", rest.MaxDockerfileBytes)}}, 400, "larger than"},
		{"empty dockerfile", []part{{"spec", spec}, {"dockerfile", " \n"}}, 400, "empty"},
		{"build_args not an object", []part{{"spec", `{"name":"app","build_args":["A"]}`}, {"dockerfile", "FROM alpine\n"}, {"context", ctxTar}}, 400, "object of strings"},
		{"build_args number", []part{{"spec", `{"name":"app","build_args":{"A":1}}`}, {"dockerfile", "FROM alpine\n"}, {"context", ctxTar}}, 400, `build_args["A"] must be a string, not a number`},
		{"build_args bad name", []part{{"spec", `{"name":"app","build_args":{"1A":"x"}}`}, {"dockerfile", "FROM alpine\n"}}, 400, "not an ARG name"},
		{"build_args with image", []part{{"spec", `{"name":"app","from_image":"r.example/app:1","build_args":{"A":"x"}}`}}, 400, "Dockerfile builds"},
		{"context not a tar", []part{{"spec", spec}, {"dockerfile", "FROM alpine\n"}, {"context", strings.Repeat("not a tar ", 100)}}, 400, "not a tar archive"},
		{"no Dockerfile in context", []part{{"spec", spec}, {"context", tarOf(t, false, "app.py", "x")}}, 400, "no Dockerfile"},
		{"dockerfile_path missing", []part{{"spec", `{"name":"app","dockerfile_path":"docker/Dockerfile"}`}, {"context", ctxTar}}, 400, "has no docker/Dockerfile"},
		{"dockerfile_path outside", []part{{"spec", `{"name":"app","dockerfile_path":"../Dockerfile"}`}, {"context", ctxTar}}, 400, "inside the context"},
		{"dockerfile_path and part", []part{{"spec", `{"name":"app","dockerfile_path":"Dockerfile"}`}, {"dockerfile", "FROM alpine\n"}, {"context", ctxTar}}, 400, "not both"},
		{"dockerfile_path without context", []part{{"spec", `{"name":"app","dockerfile_path":"Dockerfile"}`}}, 400, "no context part"},
		{"context too large", []part{{"spec", spec}, {"dockerfile", "FROM alpine\n"}, {"context", strings.Repeat("x", 65<<10)}}, 413, "larger than this server accepts (64 KiB)"},
		{"bad name", []part{{"spec", `{"name":"App!"}`}, {"dockerfile", "FROM alpine\n"}, {"context", ctxTar}}, 422, ""},
		{"built-in name", []part{{"spec", `{"name":"tiny"}`}, {"context", ctxTar}}, 422, ""},
	} {
		body, ct := multipartBody(t, tc.parts...)
		resp, out := b.post(t, body, ct)
		if resp.StatusCode != tc.status {
			t.Errorf("%s: status %d (%v), want %d", tc.name, resp.StatusCode, out, tc.status)
		}
		msg, _ := out["error"].(map[string]any)["message"].(string)
		if !strings.Contains(msg, tc.want) {
			t.Errorf("%s: message %q, want it to contain %q", tc.name, msg, tc.want)
		}
		noContexts(t, dir, tc.name)
	}
	// JSON bodies.
	for _, tc := range []struct {
		body   string
		status int
		want   string
	}{
		{`{"name":"app","from_image":"r.example/app:1","dockerfile":"FROM alpine"}`, 400, "not both"},
		{`{"name":"app"}`, 400, "nothing to build from"},
		{`{"name":"app","dockerfile":""}`, 400, "empty"},
		{`{"name":"app","dockerfile":"FROM alpine","build_args":{"A":true}}`, 400, "not a boolean"},
		{`{"name":"app","dockerfile":"FROM alpine","dockerfile_path":"Dockerfile"}`, 400, "multipart"},
	} {
		resp, out := b.post(t, strings.NewReader(tc.body), "application/json")
		msg, _ := out["error"].(map[string]any)["message"].(string)
		if resp.StatusCode != tc.status || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: %d %q, want %d and %q", tc.body, resp.StatusCode, msg, tc.status, tc.want)
		}
	}
	// A user key's build refused after its upload leaves nothing either.
	body, ct := multipartBody(t, part{"spec", `{"name":"tiny"}`}, part{"dockerfile", "FROM tiny\n"}, part{"context", ctxTar})
	req, _ := http.NewRequest("POST", b.url+"/v1/templates", body)
	req.Header.Set("Authorization", "Bearer "+b.user)
	req.Header.Set("Content-Type", ct)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 422 {
		t.Errorf("user key, a built-in name: status %d, want 422", resp.StatusCode)
	}
	noContexts(t, dir, "user key")
}

// waitBuild follows build id to its end and returns its final status.
func (b *buildServer) waitBuild(t *testing.T, id string) map[string]any {
	t.Helper()
	_, final := b.logs(t, id)
	return final
}

func TestTemplateBuildDockerfileReachesBuilder(t *testing.T) {
	b, dir, got := newDockerfileServer(t, true, 1<<20)
	ctxGz := tarOf(t, true, "Dockerfile", "FROM alpine\nCOPY . /app\n", "docker/Dockerfile.dev", "FROM busybox\n", "app.py", "print(1)\n")
	ctxPlain := tarOf(t, false, "./Dockerfile", "FROM debian\n")
	for _, tc := range []struct {
		name        string
		body        func() (io.Reader, string)
		want        builds.Spec
		wantContext string
	}{
		{
			name: "multipart with every part",
			body: func() (io.Reader, string) {
				return multipartBody(t,
					part{"spec", `{"name":"app","build_args":{"VERSION":"1.2","_X":""},"start_cmd":"exec srv","ready_cmd":"true","ready_timeout_seconds":30}`},
					part{"context", ctxGz},
					part{"dockerfile", "FROM alpine:3.20\nARG VERSION\n"}) // the Dockerfile may come last
			},
			want: builds.Spec{Name: "app", Dockerfile: []byte("FROM alpine:3.20\nARG VERSION\n"),
				BuildArgs: map[string]string{"VERSION": "1.2", "_X": ""},
				Startup:   templates.Startup{StartCmd: "exec srv", ReadyCmd: "true", ReadyTimeoutSeconds: 30}},
			wantContext: ctxGz,
		},
		{
			name: "Dockerfile from the context root",
			body: func() (io.Reader, string) {
				return multipartBody(t, part{"spec", `{"name":"plain"}`}, part{"context", ctxPlain})
			},
			want:        builds.Spec{Name: "plain", Dockerfile: []byte("FROM debian\n")},
			wantContext: ctxPlain,
		},
		{
			name: "dockerfile_path",
			body: func() (io.Reader, string) {
				return multipartBody(t, part{"spec", `{"name":"dev","dockerfile_path":"./docker/Dockerfile.dev"}`}, part{"context", ctxGz})
			},
			want:        builds.Spec{Name: "dev", Dockerfile: []byte("FROM busybox\n")},
			wantContext: ctxGz,
		},
		{
			name: "multipart without context",
			body: func() (io.Reader, string) {
				return multipartBody(t, part{"spec", `{"name":"bare"}`}, part{"dockerfile", "FROM scratch\n"})
			},
			want: builds.Spec{Name: "bare", Dockerfile: []byte("FROM scratch\n")},
		},
		{
			name: "JSON",
			body: func() (io.Reader, string) {
				return strings.NewReader(`{"name":"json","dockerfile":"FROM alpine\n","build_args":{"A":"b"}}`), "application/json"
			},
			want: builds.Spec{Name: "json", Dockerfile: []byte("FROM alpine\n"), BuildArgs: map[string]string{"A": "b"}},
		},
	} {
		body, ct := tc.body()
		resp, out := b.post(t, body, ct)
		if resp.StatusCode != 202 {
			t.Fatalf("%s: status %d (%v), want 202", tc.name, resp.StatusCode, out)
		}
		if out["from_image"] != "Dockerfile" {
			t.Errorf("%s: from_image %v, want Dockerfile", tc.name, out["from_image"])
		}
		var g gotSpec
		select {
		case g = <-got:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the builder was not called", tc.name)
		}
		if final := b.waitBuild(t, out["build_id"].(string)); final["status"] != "succeeded" {
			t.Errorf("%s: build %v, want succeeded", tc.name, final)
		}
		ctxPath := g.spec.ContextTar
		g.spec.ContextTar = ""
		if g.spec.Owner != b.adminID {
			t.Errorf("%s: owner %q, want the admin key's %q", tc.name, g.spec.Owner, b.adminID)
		}
		g.spec.Owner = ""
		if !reflect.DeepEqual(g.spec, tc.want) {
			t.Errorf("%s: spec\n got %+v\nwant %+v", tc.name, g.spec, tc.want)
		}
		switch {
		case tc.wantContext == "" && ctxPath != "":
			t.Errorf("%s: context %s, want none", tc.name, ctxPath)
		case tc.wantContext != "" && filepath.Dir(ctxPath) != dir:
			t.Errorf("%s: context %q, want a file of %s", tc.name, ctxPath, dir)
		case string(g.context) != tc.wantContext:
			t.Errorf("%s: context of %d bytes, want the %d sent", tc.name, len(g.context), len(tc.wantContext))
		}
		noContexts(t, dir, tc.name+" (after the build)")
	}
}

func TestTemplateBuildDockerfileNotImplemented(t *testing.T) {
	b, dir, _ := newDockerfileServer(t, false, 1<<20)
	body, ct := multipartBody(t, part{"spec", `{"name":"app"}`}, part{"dockerfile", "FROM alpine\n"}, part{"context", tarOf(t, true, "a", "b")})
	resp, out := b.post(t, body, ct)
	e, _ := out["error"].(map[string]any)
	if resp.StatusCode != 501 || e["code"] != "not_implemented" || !strings.Contains(e["message"].(string), "Dockerfile") {
		t.Errorf("status %d %v, want 501 not_implemented about Dockerfiles", resp.StatusCode, out)
	}
	noContexts(t, dir, "unsupported")
	// Image builds still work.
	resp, out = b.post(t, strings.NewReader(`{"name":"app","from_image":"r.example/app:1"}`), "application/json")
	if resp.StatusCode != 202 {
		t.Errorf("image build: status %d %v, want 202", resp.StatusCode, out)
	}
}

// The Go SDK's request (what the CLI sends) is what the server reads: the
// wire format is held to itself from both ends.
func TestTemplateBuildDockerfileFromSDK(t *testing.T) {
	b, dir, got := newDockerfileServer(t, true, 1<<20)
	src := t.TempDir()
	for name, content := range map[string]string{"Dockerfile": "FROM alpine\nCOPY . /app\n", "app.py": "print(1)\n", "x.log": "no", ".dockerignore": "*.log\n"} {
		os.WriteFile(filepath.Join(src, name), []byte(content), 0o644)
	}
	c, err := pandastack.NewClient(pandastack.Options{APIURL: b.url, APIKey: b.admin})
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.BuildTemplateFromDockerfile(context.Background(), "app", "", src, nil, pandastack.WithBuildArg("V", "1"))
	if err != nil || st.Status != "succeeded" {
		t.Fatalf("build: %+v, %v", st, err)
	}
	g := <-got
	if string(g.spec.Dockerfile) != "FROM alpine\nCOPY . /app\n" || g.spec.BuildArgs["V"] != "1" {
		t.Errorf("spec %+v: want the context's Dockerfile and V=1", g.spec)
	}
	zr, err := gzip.NewReader(bytes.NewReader(g.context))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(zr)
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		names = append(names, h.Name)
	}
	if want := []string{".dockerignore", "Dockerfile", "app.py"}; !reflect.DeepEqual(names, want) {
		t.Errorf("context %q, want %q", names, want)
	}
	noContexts(t, dir, "SDK build")
}
