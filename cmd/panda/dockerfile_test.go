package main

// Templates built from Dockerfiles, end to end: `panda up` pulls the FROM
// image from a registry in this test process, runs each RUN in a build VM
// (a real guest), copies the uploaded context in, caches each step's
// layer, and sandboxes of the template see the result with the
// Dockerfile's ENV, WORKDIR and USER.

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/pandastack/pandastack/internal/testing/nettest"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// writeTree writes files (name → contents) under dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// tarOf is a tar archive of one file owned by uid:gid.
func tarOf(t *testing.T, name, body string, uid, gid int) string {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	tw.WriteHeader(&tar.Header{Name: name, Mode: 0o640, Size: int64(len(body)), Uid: uid, Gid: gid, ModTime: time.Unix(1700000000, 0)})
	tw.Write([]byte(body))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestTemplateDockerfile(t *testing.T) {
	e2e(t)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	pushImage(t, busyboxLayer(t), host+"/test/hello:v1", "hello from v1") // USER nobody, WORKDIR /srv

	dataDir := newDataDir(t)
	// The registry is on loopback: allowed to builds by the operator.
	s := startServer(t, "up", dataDir, "--registry-allow-net", "127.0.0.1")
	c := s.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()

	dir := t.TempDir()
	const head = `# every supported instruction
ARG BASE
FROM ${BASE}
ARG GREETING=hi
ENV APP_HOME=/opt/app MODE=prod
LABEL purpose=test
EXPOSE 8000
USER root
WORKDIR $APP_HOME
COPY app/ ./
COPY --chown=nobody:nogroup --chmod=600 app/hello.txt /home/nobody/
ADD data.tar /opt/data/
RUN echo "$GREETING from $MODE" > built.txt && id -u > uid-root && chown nobody .
USER nobody
WORKDIR sub
ENTRYPOINT ["/bin/sh", "-c"]
CMD ["sh"]
`
	writeTree(t, dir, map[string]string{
		"Dockerfile":     head + "RUN id -u > /opt/app/uid-nobody && echo one > /opt/app/last\n",
		"app/hello.txt":  "hello file\n",
		"app/sub/x":      "x\n",
		"app/secret.txt": "must not be sent\n",
		".dockerignore":  "app/secret.txt\n",
		"data.tar":       tarOf(t, "f", "data\n", 123, 456),
	})

	// Built through the CLI, which sends the context and follows the log.
	out, err := runCLI(t, s, "template", "build", "df", "-f", filepath.Join(dir, "Dockerfile"), dir,
		"--build-arg", "BASE="+host+"/test/hello:v1", "--build-arg", "GREETING=hey")
	if err != nil {
		t.Fatalf("panda template build -f: %v\n%s", err, out)
	}
	for _, want := range []string{"sending context", "RUN id -u > /opt/app/uid-nobody", "is ready"} {
		if !strings.Contains(out, want) {
			t.Errorf("build output lacks %q:\n%s", want, out)
		}
	}
	sb, err := c.Create(ctx, pandastack.CreateOptions{Template: "df", MemoryMiB: 256, TTLSeconds: 1800})
	if err != nil {
		t.Fatalf("create from the Dockerfile template: %v", err)
	}
	if got := mustExec(t, ctx, sb, "pwd; id -u; echo $MODE $APP_HOME"); got != "/opt/app/sub\n65534\nprod /opt/app\n" {
		t.Errorf("the template's WORKDIR, USER and ENV: %q", got)
	}
	got := mustExec(t, ctx, sb, `cd /opt/app && cat built.txt hello.txt sub/x uid-root uid-nobody last; ls secret.txt 2>&1 | grep -c 'No such';
stat -c '%U %a' /home/nobody/hello.txt; stat -c '%u:%g %a' /opt/data/f; cat /etc/hello`)
	want := "hey from prod\nhello file\nx\n0\n65534\none\n1\nnobody 600\n123:456 640\nhello from v1\n"
	if got != want {
		t.Errorf("the Dockerfile template's sandbox:\n%s\nwant:\n%s", got, want)
	}
	if r, err := sb.Exec(ctx, pandastack.Command{Cmd: "cat /opt/data/f", User: "root"}); err != nil || r.Stdout != "data\n" {
		t.Errorf("the file ADD unpacked: %+v, %v", r, err)
	}

	// A rebuild that changes only the last step runs only that one.
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(head+"RUN echo two > /opt/app/last\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var lines []string
	b, err := c.BuildTemplateFromDockerfile(ctx, "df", "", dir, func(l string) { lines = append(lines, l) },
		pandastack.WithBuildArg("BASE", host+"/test/hello:v1"), pandastack.WithBuildArg("GREETING", "hey"))
	if err != nil {
		t.Fatalf("rebuild: %v (%+v)\n%s", err, b, strings.Join(lines, "\n"))
	}
	log := strings.Join(lines, "\n")
	if n := strings.Count(log, "cached"); n < 5 || !strings.Contains(log, "RUN echo two") || strings.Contains(log, "hey from") {
		t.Errorf("rebuild log (want the steps before the last cached):\n%s", log)
	}
	sb2, err := c.Create(ctx, pandastack.CreateOptions{Template: "df", MemoryMiB: 256, TTLSeconds: 1800})
	if err != nil {
		t.Fatal(err)
	}
	if got := mustExec(t, ctx, sb2, "cat /opt/app/last /opt/app/built.txt"); got != "two\nhey from prod\n" {
		t.Errorf("after the rebuild: %q", got)
	}
	if got := mustExec(t, ctx, sb, "cat /opt/app/last"); got != "one\n" {
		t.Errorf("the sandbox of the first build: %q, want its own files", got)
	}

	// A failing RUN fails the build with its line, exit code and output,
	// and registers nothing. Here RUN steps have no network (the server
	// runs with --network off): a connection fails at once (it hung until
	// TCP gave up), and the error says why.
	b, err = c.BuildTemplateFromDockerfile(ctx, "broken", "FROM tiny\nRUN echo step-output; wget -q -O /dev/null http://198.51.100.7/ || exit 3\n", "", nil)
	var pe *pandastack.Error
	if !errors.As(err, &pe) || b.Status != pandastack.BuildFailed ||
		!strings.Contains(pe.Message, "line 2") || !strings.Contains(pe.Message, "exit code 3") || !strings.Contains(pe.Message, "step-output") {
		t.Errorf("a failing RUN: %+v, %v", b, err)
	}
	if err != nil && (!strings.Contains(err.Error(), "Network is unreachable") || !strings.Contains(err.Error(), "RUN steps have no network: this server runs with --network off")) {
		t.Errorf("a RUN without network: %v; want the connection refused at once, and the note", err)
	}
	if _, err := c.Create(ctx, pandastack.CreateOptions{Template: "broken", MemoryMiB: 256}); !errors.Is(err, pandastack.ErrNotFound) {
		t.Errorf("create from a failed build: %v, want not found", err)
	}
	// An unsupported instruction is refused at once, naming its line.
	_, err = c.StartDockerfileBuild(ctx, "bad", "FROM tiny\nHEALTHCHECK CMD true\n", "")
	if !errors.As(err, &pe) || pe.Code != pandastack.CodeInvalid || !strings.Contains(pe.Message, "line 2") {
		t.Errorf("HEALTHCHECK: %v, want invalid naming line 2", err)
	}
	// A context with a path leaving it fails the build, and leaves nothing.
	code, body := postMultipart(t, ctx, s, `{"name":"escape"}`, "FROM tiny\nCOPY . /x\n", tarOf(t, "../evil", "x", 0, 0))
	if code == http.StatusAccepted {
		id := buildID(t, body)
		st, _ := c.FollowTemplateBuild(ctx, id, nil)
		if st.Status != pandastack.BuildFailed || !strings.Contains(st.Error, "..") {
			t.Errorf("a context with ../evil: %+v", st)
		}
	} else if code != http.StatusBadRequest {
		t.Errorf("a context with ../evil: HTTP %d %s", code, body)
	}
	if ents, _ := os.ReadDir(filepath.Join(dataDir, "build-tmp")); len(ents) != 0 {
		t.Errorf("build-tmp after the builds: %d entries left", len(ents))
	}
}

// TestTemplateDockerfileNetwork: with --bake-network, RUN steps reach the
// network (here the test world's internet, never the machine's uplink).
func TestTemplateDockerfileNetwork(t *testing.T) {
	e2e(t)
	env := nettest.NewEnv(t)
	s := startNetServer(t, newDataDir(t), env, "--bake-network")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	b, err := s.c.BuildTemplateFromDockerfile(ctx, "fetched",
		"FROM tiny\nRUN timeout 20 wget -q -O /page http://allowed.test/\n", "", nil)
	if err != nil {
		t.Fatalf("build with a RUN that fetches: %v (%+v)", err, b)
	}
	sb, err := s.c.Create(ctx, pandastack.CreateOptions{Template: "fetched", MemoryMiB: 256, TTLSeconds: 1800})
	if err != nil {
		t.Fatal(err)
	}
	if got := mustExec(t, ctx, sb, "cat /page"); got != "hello from "+nettest.WebAddr.String() {
		t.Errorf("the page fetched at build time: %q", got)
	}
}

// postMultipart sends a Dockerfile build as raw multipart (a context the
// SDK would never make).
func postMultipart(t *testing.T, ctx context.Context, s *proc, spec, dockerfile, contextTar string) (int, string) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, p := range [][2]string{{"spec", spec}, {"dockerfile", dockerfile}, {"context", contextTar}} {
		w, err := mw.CreateFormField(p[0])
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, p[1])
	}
	mw.Close()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/templates", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Authorization", "Bearer "+s.AdminKey())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func buildID(t *testing.T, body string) string {
	t.Helper()
	_, rest, ok := strings.Cut(body, `"build_id":"`)
	id, _, ok2 := strings.Cut(rest, `"`)
	if !ok || !ok2 {
		t.Fatalf("no build_id in %s", body)
	}
	return id
}
