package cli

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
)

func TestTemplateBuildArgumentErrors(t *testing.T) {
	isolateEnv(t)
	dir := t.TempDir()
	df := filepath.Join(dir, "Dockerfile")
	os.WriteFile(df, []byte("FROM alpine\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "file"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, "Empty"), nil, 0o644)
	for _, tc := range []struct {
		args  []string
		stdin string
		want  string
	}{
		{[]string{"template", "build", "app"}, "", "--from-image REF or -f DOCKERFILE is required"},
		{[]string{"template", "build", "app", "--from-image", "r/app:1", "-f", df}, "", "not both"},
		{[]string{"template", "build", "app", "--from-image", "r/app:1", dir}, "", "CONTEXT_DIR is for Dockerfile builds"},
		{[]string{"template", "build", "app", "--from-image", "r/app:1", "--build-arg", "A=b"}, "", "--build-arg is for Dockerfile builds"},
		{[]string{"template", "build", "app", "-f", filepath.Join(dir, "missing")}, "", "no such file"},
		{[]string{"template", "build", "app", "-f", dir}, "", "is a directory"},
		{[]string{"template", "build", "app", "-f", filepath.Join(dir, "Empty")}, "", "empty"},
		{[]string{"template", "build", "app", "-f", df, filepath.Join(dir, "file")}, "", "is not a directory"},
		{[]string{"template", "build", "app", "-f", df, filepath.Join(dir, "nodir")}, "", "no such directory"},
		{[]string{"template", "build", "app", "-f", df, "--build-arg", "NOVALUE"}, "", "want KEY=VALUE"},
		{[]string{"template", "build", "app", "-f", "-"}, "", "empty"},
		{[]string{"template", "build", "app", "-f", "-", dir, "extra"}, "FROM x", "usage:"},
	} {
		r := runCLI(context.Background(), tc.stdin, tc.args...)
		if r.err == nil || !strings.Contains(r.err.Error(), tc.want) {
			t.Errorf("%q: got error %v, want one containing %q", tc.args, r.err, tc.want)
		}
	}
}

// buildAPI is a fake of the build endpoints: it records the multipart
// request (its spec, Dockerfile and the context's entry names) and
// answers a log stream ending in success.
type buildAPI struct {
	url         string
	contentType string
	spec        map[string]any
	dockerfile  string
	entries     []string
}

func newBuildAPI(t *testing.T) *buildAPI {
	t.Helper()
	a := &buildAPI{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v1/templates":
			a.contentType = r.Header.Get("Content-Type")
			if strings.HasPrefix(a.contentType, "application/json") {
				json.NewDecoder(r.Body).Decode(&a.spec)
			} else if mr, err := r.MultipartReader(); err == nil {
				for {
					p, err := mr.NextPart()
					if err != nil {
						break
					}
					switch p.FormName() {
					case "spec":
						json.NewDecoder(p).Decode(&a.spec)
					case "dockerfile":
						b, _ := io.ReadAll(p)
						a.dockerfile = string(b)
					case "context":
						zr, err := gzip.NewReader(p)
						if err != nil {
							t.Errorf("context: %v", err)
							break
						}
						tr := tar.NewReader(zr)
						for h, err := tr.Next(); err == nil; h, err = tr.Next() {
							a.entries = append(a.entries, h.Name)
						}
					}
				}
			}
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, `{"build_id":"b1","name":"app","from_image":"Dockerfile","status":"queued","created_at":"2025-01-02T03:04:05Z"}`)
		case "/v1/templates/builds/b1/logs":
			io.WriteString(w, `{"line":"step 1/2 FROM alpine"}`+"\n"+`{"build_id":"b1","name":"app","from_image":"Dockerfile","status":"succeeded","created_at":"2025-01-02T03:04:05Z"}`+"\n")
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	a.url = srv.URL
	return a
}

func TestTemplateBuildDockerfile(t *testing.T) {
	isolateEnv(t)
	dir := t.TempDir()
	for name, content := range map[string]string{
		"Dockerfile": "FROM alpine\nCOPY . /app\n", ".dockerignore": "*.log\nnode_modules\n",
		"app.py": "print(1)\n", "debug.log": "x", "node_modules/m.js": "m",
	} {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
		os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644)
	}
	os.Symlink("/etc/passwd", filepath.Join(dir, "passwd"))

	a := newBuildAPI(t)
	r := runCLI(context.Background(), "", "template", "build", "app", "-f", filepath.Join(dir, "Dockerfile"),
		"--build-arg", "VERSION=1.2", "--build-arg", "EMPTY=", "--start-cmd", "srv", "--api-url", a.url, "--api-key", "k")
	if r.err != nil {
		t.Fatalf("build: %v\n%s", r.err, r.stderr)
	}
	wantSpec := map[string]any{"name": "app", "build_args": map[string]any{"VERSION": "1.2", "EMPTY": ""}, "start_cmd": "srv"}
	if !reflect.DeepEqual(a.spec, wantSpec) {
		t.Errorf("spec %v, want %v", a.spec, wantSpec)
	}
	if a.dockerfile != "FROM alpine\nCOPY . /app\n" {
		t.Errorf("dockerfile part %q", a.dockerfile)
	}
	sort.Strings(a.entries)
	if want := []string{".dockerignore", "Dockerfile", "app.py", "passwd"}; !reflect.DeepEqual(a.entries, want) {
		t.Errorf("context entries %q, want %q", a.entries, want)
	}
	for _, want := range []string{"sending context: 4 files, ", "step 1/2 FROM alpine"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output %q, want it to contain %q", r.stdout, want)
		}
	}

	// -f - with no directory: the Dockerfile alone, as JSON.
	a = newBuildAPI(t)
	r = runCLI(context.Background(), "FROM busybox\n", "template", "build", "app", "-f", "-", "--api-url", a.url, "--api-key", "k")
	if r.err != nil {
		t.Fatalf("build from stdin: %v", r.err)
	}
	if !strings.HasPrefix(a.contentType, "application/json") || a.spec["dockerfile"] != "FROM busybox\n" {
		t.Errorf("stdin build: %s %v, want JSON with the Dockerfile", a.contentType, a.spec)
	}
	if strings.Contains(r.stdout, "sending context") {
		t.Errorf("stdin build without a context: output %q says it sent one", r.stdout)
	}

	// -f - with a directory: that context.
	a = newBuildAPI(t)
	r = runCLI(context.Background(), "FROM busybox\n", "template", "build", "app", "-f", "-", dir, "--api-url", a.url, "--api-key", "k")
	if r.err != nil {
		t.Fatalf("build from stdin with a context: %v", r.err)
	}
	if a.dockerfile != "FROM busybox\n" || len(a.entries) != 4 {
		t.Errorf("stdin build with a context: dockerfile %q, entries %q", a.dockerfile, a.entries)
	}
}
