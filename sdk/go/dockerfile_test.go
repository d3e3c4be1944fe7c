package pandastack

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// writeTree makes files (path -> content; a content starting with "->"
// makes a symlink to the rest) under a new directory.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, content := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if target, ok := strings.CutPrefix(content, "->"); ok {
			err = os.Symlink(target, full)
		} else {
			err = os.WriteFile(full, []byte(content), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// tarEntries reads a gzip-compressed tar: name -> content (or "->target"
// for a symlink, "/" for a directory).
func tarEntries(t *testing.T, r io.Reader) map[string]string {
	t.Helper()
	zr, err := gzip.NewReader(r)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			out[h.Name] = "/"
		case tar.TypeSymlink:
			out[h.Name] = "->" + h.Linkname
		default:
			b, _ := io.ReadAll(tr)
			out[h.Name] = string(b)
		}
		if h.Uid != 0 || h.Uname != "" {
			t.Errorf("%s: owner %d %q, want none", h.Name, h.Uid, h.Uname)
		}
	}
}

func TestWriteContextTarDockerignore(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ignore string // "" for no .dockerignore
		want   []string
	}{
		{"no .dockerignore", "", []string{"Dockerfile", "app.py", "build/", "build/keep.txt", "build/out.bin", "debug.log", "link", "src/", "src/main.go", "src/secret", "src/sub/", "src/sub/secret"}},
		{"patterns", "# comment\n*.log\nbuild\n**/secret\n", []string{".dockerignore", "Dockerfile", "app.py", "link", "src/", "src/main.go", "src/sub/"}},
		{"exception under an excluded directory", "build\n!build/keep.txt\n", []string{".dockerignore", "Dockerfile", "app.py", "build/keep.txt", "debug.log", "link", "src/", "src/main.go", "src/secret", "src/sub/", "src/sub/secret"}},
		{"the last matching line wins", "*\n!src\nsrc/secret\n", []string{"src/", "src/main.go", "src/sub/", "src/sub/secret"}},
		{"leading slash and dot", "/app.py\n./debug.log\n.dockerignore\n", []string{"Dockerfile", "build/", "build/keep.txt", "build/out.bin", "link", "src/", "src/main.go", "src/secret", "src/sub/", "src/sub/secret"}},
	} {
		files := map[string]string{
			"Dockerfile": "FROM alpine\n", "app.py": "print(1)\n", "debug.log": "x",
			"build/out.bin": "bin", "build/keep.txt": "keep",
			"src/main.go": "package main", "src/secret": "s", "src/sub/secret": "s2",
			"link": "->/etc/passwd",
		}
		if tc.ignore != "" {
			files[".dockerignore"] = tc.ignore
		}
		dir := writeTree(t, files)
		var buf bytes.Buffer
		var last ContextStats
		st, err := WriteContextTar(&buf, dir, func(s ContextStats) { last = s })
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := tarEntries(t, &buf)
		var names []string
		for n := range got {
			names = append(names, n)
		}
		sort.Strings(names)
		if !reflect.DeepEqual(names, tc.want) {
			t.Errorf("%s: entries\n got %q\nwant %q", tc.name, names, tc.want)
		}
		if l, ok := got["link"]; ok && l != "->/etc/passwd" {
			t.Errorf("%s: link is %q, want the symlink itself", tc.name, l)
		}
		if st.Files != len(tc.want) || last != st {
			t.Errorf("%s: stats %+v (last progress %+v), want %d files", tc.name, st, last, len(tc.want))
		}
	}
}

func TestWriteContextTarNotADirectory(t *testing.T) {
	dir := writeTree(t, map[string]string{"f": "x"})
	for _, p := range []string{filepath.Join(dir, "f"), filepath.Join(dir, "missing")} {
		if _, err := WriteContextTar(io.Discard, p, nil); err == nil {
			t.Errorf("WriteContextTar(%s): no error", p)
		}
	}
}

func TestStartDockerfileBuildMultipart(t *testing.T) {
	dir := writeTree(t, map[string]string{"Dockerfile": "FROM alpine\n", "app.py": "print(1)\n", ".dockerignore": "*.log\n", "x.log": "no"})
	var spec map[string]any
	var dockerfile string
	var entries map[string]string
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		mr, err := r.MultipartReader()
		if err != nil {
			t.Errorf("multipart: %v", err)
			return
		}
		var order []string
		for {
			p, err := mr.NextPart()
			if err != nil {
				break
			}
			order = append(order, p.FormName())
			switch p.FormName() {
			case "spec":
				json.NewDecoder(p).Decode(&spec)
			case "dockerfile":
				b, _ := io.ReadAll(p)
				dockerfile = string(b)
			case "context":
				entries = tarEntries(t, p)
			}
		}
		if want := []string{"spec", "dockerfile", "context"}; !reflect.DeepEqual(order, want) {
			t.Errorf("parts %q, want %q", order, want)
		}
		writeJSON(w, http.StatusAccepted, map[string]any{"build_id": "b1", "name": "web", "from_image": "Dockerfile", "status": "queued"})
	})
	var last ContextStats
	b, err := c.StartDockerfileBuild(context.Background(), "web", "FROM alpine:3.20\n", dir,
		WithBuildArg("VERSION", "1"), WithBuildArg("VERSION", "2"), WithStartCmd("srv"),
		WithContextProgress(func(s ContextStats) { last = s }))
	if err != nil || b.ID != "b1" {
		t.Fatalf("StartDockerfileBuild: %+v, %v", b, err)
	}
	wantSpec := map[string]any{"name": "web", "build_args": map[string]any{"VERSION": "2"}, "start_cmd": "srv"}
	if !reflect.DeepEqual(spec, wantSpec) {
		t.Errorf("spec %v, want %v", spec, wantSpec)
	}
	if dockerfile != "FROM alpine:3.20\n" {
		t.Errorf("dockerfile part %q", dockerfile)
	}
	if _, ok := entries["x.log"]; ok || entries["app.py"] != "print(1)\n" {
		t.Errorf("context entries %v: want app.py and no x.log", entries)
	}
	if last.Files != 3 || last.Bytes != int64(len("FROM alpine\nprint(1)\n*.log\n")) {
		t.Errorf("context progress %+v, want 3 files of %d bytes", last, len("FROM alpine\nprint(1)\n*.log\n"))
	}
}

func TestStartDockerfileBuildJSONAndErrors(t *testing.T) {
	var got string
	c := testClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Content-Type") != "application/json" {
			// A refusal before the body is read.
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]any{"error": map[string]any{"code": "payload_too_large", "message": "the build context is larger than this server accepts (2 GiB)"}})
			return
		}
		b, _ := io.ReadAll(r.Body)
		got = string(b)
		writeJSON(w, http.StatusAccepted, map[string]any{"build_id": "b2", "name": "web", "status": "queued"})
	})
	ctx := context.Background()
	if _, err := c.StartDockerfileBuild(ctx, "web", "FROM alpine\n", "", WithBuildArg("A", "b")); err != nil {
		t.Fatal(err)
	}
	if want := `{"name":"web","dockerfile":"FROM alpine\n","build_args":{"A":"b"}}`; canonJSON(got) != canonJSON(want) {
		t.Errorf("JSON body %s, want %s", got, want)
	}
	if _, err := c.StartDockerfileBuild(ctx, "web", "", ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("no Dockerfile, no context: %v, want ErrInvalid", err)
	}
	if _, err := c.StartDockerfileBuild(ctx, "web", "FROM x", filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "build context") {
		t.Errorf("missing context: %v", err)
	}
	big := writeTree(t, map[string]string{"Dockerfile": "FROM x", "blob": strings.Repeat("x", 4<<20)})
	_, err := c.StartDockerfileBuild(ctx, "web", "", big)
	if !errors.Is(err, ErrPayloadTooLarge) || !strings.Contains(err.Error(), "2 GiB") {
		t.Errorf("refused upload: %v, want the server's 413", err)
	}
}
