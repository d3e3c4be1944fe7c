package main

// Templates built from users' images, end to end: a registry in this test
// process (go-containerregistry's, on 127.0.0.1) holds images made here
// from the host's static busybox; `panda up` pulls them, builds the
// template, and sandboxes of it run the image's files with its ENV and
// WORKDIR.

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/testing/pandatest"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// tarFile is one entry of a test layer: a directory (Dir), a symlink
// (Link) or a regular file (Body).
type tarFile struct {
	Name string
	Dir  bool
	Link string
	Body []byte
	Mode int64
}

func layer(t *testing.T, files []tarFile) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.Name, Mode: f.Mode, ModTime: time.Unix(1700000000, 0)}
		switch {
		case f.Dir:
			h.Typeflag, h.Name = tar.TypeDir, f.Name+"/"
			if h.Mode == 0 {
				h.Mode = 0o755
			}
		case f.Link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.Link, 0o777
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Body))
			if h.Mode == 0 {
				h.Mode = 0o644
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.Body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// busyboxLayer is the tiny root filesystem's contents: the host's static
// busybox with a link for each applet.
func busyboxLayer(t *testing.T) v1.Layer {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("the test image needs the host's static /bin/busybox: %v", err)
	}
	list, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		t.Fatalf("busybox --list: %v", err)
	}
	files := []tarFile{
		{Name: "bin", Dir: true}, {Name: "etc", Dir: true}, {Name: "root", Dir: true, Mode: 0o700},
		{Name: "bin/busybox", Body: bb, Mode: 0o755},
		{Name: "etc/passwd", Body: []byte("root:x:0:0:root:/root:/bin/sh\n")},
		{Name: "etc/group", Body: []byte("root:x:0:\n")},
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet != "busybox" {
			files = append(files, tarFile{Name: "bin/" + applet, Link: "busybox"})
		}
	}
	return layer(t, files)
}

// pushImage pushes busybox plus /etc/hello holding hello and a user
// nobody (65534, home /srv), with ENV HELLO=world, WORKDIR /srv and USER
// nobody, as ref.
func pushImage(t *testing.T, base v1.Layer, ref, hello string) {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, base, layer(t, []tarFile{
		{Name: "etc/hello", Body: []byte(hello + "\n")}, {Name: "srv", Dir: true},
		{Name: "etc/passwd", Body: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/srv:/bin/sh\n")},
		{Name: "etc/group", Body: []byte("root:x:0:\nnogroup:x:65534:\n")},
	}))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin", "HELLO=world"}
	cf.Config.WorkingDir = "/srv"
	cf.Config.User = "nobody"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

func TestTemplateFromImage(t *testing.T) {
	e2e(t)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://") // 127.0.0.1:PORT
	base := busyboxLayer(t)
	pushImage(t, base, host+"/test/hello:v1", "hello from v1")

	// The registry is on loopback: allowed to builds by the operator.
	s := startServer(t, "up", newDataDir(t), "--registry-allow-net", "127.0.0.1")
	c := s.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// Bad requests fail at once.
	for _, tc := range []struct{ name, from, code string }{
		{"tiny", host + "/test/hello:v1", pandastack.CodeInvalid},
		{"Bad Name", host + "/test/hello:v1", pandastack.CodeInvalid},
		{"app", "/etc/passwd", pandastack.CodeInvalid},
		{"app", "oci:/var", pandastack.CodeInvalid},
	} {
		_, err := c.StartTemplateBuild(ctx, tc.name, tc.from)
		var pe *pandastack.Error
		if !errors.As(err, &pe) || pe.Code != tc.code {
			t.Errorf("build %q from %q: %v, want code %s", tc.name, tc.from, err, tc.code)
		}
	}
	// An image the registry lacks: the build fails with image_not_found.
	b, err := c.BuildTemplate(ctx, "missing", host+"/test/nothing:v1", nil)
	var pe *pandastack.Error
	if !errors.As(err, &pe) || pe.Code != pandastack.CodeImageNotFound || b.Status != pandastack.BuildFailed {
		t.Errorf("build from a missing image: %+v, %v; want failed with %s", b, err, pandastack.CodeImageNotFound)
	}

	// Build, through the CLI: it streams progress lines.
	out, err := runCLI(t, s, "template", "build", "hello", "--from-image", host+"/test/hello:v1")
	if err != nil {
		t.Fatalf("panda template build: %v\n%s", err, out)
	}
	if !strings.Contains(out, "building template hello") || !strings.Contains(out, "is ready") {
		t.Errorf("panda template build printed:\n%s", out)
	}
	ts, err := c.Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, tp := range ts {
		if tp.Name == "hello" {
			found = tp.FromImage == host+"/test/hello:v1" && strings.HasPrefix(tp.Digest, "sha256:") && tp.State == pandastack.TemplateNotBaked
		}
	}
	if !found {
		t.Errorf("templates after the build: %+v", ts)
	}

	sb1, err := c.Create(ctx, pandastack.CreateOptions{Template: "hello", MemoryMiB: 256, TTLSeconds: 1800})
	if err != nil {
		t.Fatalf("create from the built template: %v", err)
	}
	check := func(sb *pandastack.Sandbox, want string) {
		t.Helper()
		if got := mustExec(t, ctx, sb, "cat /etc/hello; echo $HELLO; pwd"); got != want {
			t.Errorf("sandbox %s: got %q, want %q", sb.ID, got, want)
		}
	}
	checkUser := func(sb *pandastack.Sandbox, user, want string) {
		t.Helper()
		r, err := sb.Exec(ctx, pandastack.Command{Cmd: "echo $(id -u):$(id -g) $HOME $USER", User: user})
		if err != nil || r.Stdout != want {
			t.Errorf("sandbox %s, user %q: %+v, %v; want stdout %q", sb.ID, user, r, err, want)
		}
	}
	check(sb1, "hello from v1\nworld\n/srv\n")
	// The image's USER is the default user; an exec's own user wins.
	checkUser(sb1, "", "65534:65534 /srv nobody\n")
	checkUser(sb1, "root", "0:0 /root root\n")
	// An exec's own env and cwd win over the image's.
	r, err := sb1.Exec(ctx, pandastack.Command{Cmd: "echo $HELLO; pwd", Env: map[string]string{"HELLO": "there"}, Cwd: "/etc"})
	if err != nil || r.Stdout != "there\n/etc\n" {
		t.Errorf("exec with its own env and cwd: %+v, %v", r, err)
	}
	// A fork keeps the defaults.
	kids, err := sb1.Fork(ctx, 1)
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	check(kids[0], "hello from v1\nworld\n/srv\n")
	checkUser(kids[0], "", "65534:65534 /srv nobody\n")
	if err := kids[0].Kill(ctx); err != nil {
		t.Fatal(err)
	}
	// So does the sandbox's env.
	sb2, err := c.Create(ctx, pandastack.CreateOptions{Template: "hello", MemoryMiB: 256, TTLSeconds: 1800, Env: map[string]string{"HELLO": "sandbox"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := mustExec(t, ctx, sb2, "echo $HELLO"); got != "sandbox\n" {
		t.Errorf("sandbox env over the image's: got %q", got)
	}

	// Rebuild from v2: new sandboxes get it (the shape re-bakes), the
	// running one keeps v1.
	pushImage(t, base, host+"/test/hello:v2", "hello from v2")
	if _, err := c.BuildTemplate(ctx, "hello", host+"/test/hello:v2", nil); err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	sb3, err := c.Create(ctx, pandastack.CreateOptions{Template: "hello", MemoryMiB: 256, TTLSeconds: 1800})
	if err != nil {
		t.Fatalf("create after the rebuild: %v", err)
	}
	check(sb3, "hello from v2\nworld\n/srv\n")
	check(sb1, "hello from v1\nworld\n/srv\n")
	// Each sandbox records its version; NAME:1 pins the first.
	if sb1.Info.Template != "hello:1" || sb3.Info.Template != "hello:2" {
		t.Errorf("sandboxes' templates: %q and %q, want hello:1 and hello:2", sb1.Info.Template, sb3.Info.Template)
	}
	pinned, err := c.Create(ctx, pandastack.CreateOptions{Template: "hello:1", MemoryMiB: 256, TTLSeconds: 1800})
	if err != nil {
		t.Fatalf("create from hello:1: %v", err)
	}
	check(pinned, "hello from v1\nworld\n/srv\n")

	// Delete: refused while its sandboxes live, unless forced.
	if err := c.DeleteTemplate(ctx, "hello", false); !errors.Is(err, pandastack.ErrConflict) {
		t.Errorf("delete with live sandboxes: %v, want conflict", err)
	}
	if err := c.DeleteTemplate(ctx, "tiny", false); !errors.Is(err, pandastack.ErrInvalid) {
		t.Errorf("delete tiny: %v, want invalid", err)
	}
	for _, sb := range []*pandastack.Sandbox{sb2, sb3, pinned} {
		if err := sb.Kill(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := runCLI(t, s, "template", "rm", "hello"); err == nil {
		t.Errorf("panda template rm with a live sandbox succeeded:\n%s", out)
	}
	if out, err := runCLI(t, s, "template", "rm", "hello", "--force"); err != nil {
		t.Fatalf("panda template rm --force: %v\n%s", err, out)
	}
	check(sb1, "hello from v1\nworld\n/srv\n") // running on its own files
	if _, err := c.Create(ctx, pandastack.CreateOptions{Template: "hello", MemoryMiB: 256}); !errors.Is(err, pandastack.ErrNotFound) {
		t.Errorf("create after delete: %v, want not found", err)
	}
	if err := c.DeleteTemplate(ctx, "hello", false); !errors.Is(err, pandastack.ErrNotFound) {
		t.Errorf("delete again: %v, want not found", err)
	}
}

// runCLI runs the panda CLI against s with its admin key.
func runCLI(t *testing.T, s *proc, args ...string) (string, error) {
	t.Helper()
	bin, err := pandatest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append(args, "--api-url", s.URL(), "--api-key", s.AdminKey())...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestTemplateStartCmd builds a template whose snapshot is taken with a
// server running (start_cmd) once it answers (ready_cmd): its sandboxes
// find the server running with the state it holds in memory only, each
// its own copy. A ready command that never succeeds fails the build and
// leaves no template.
func TestTemplateStartCmd(t *testing.T) {
	e2e(t)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	pushImage(t, busyboxLayer(t), host+"/test/web:v1", "web")

	// The registry is on loopback: allowed to builds by the operator.
	s := startServer(t, "up", newDataDir(t), "--registry-allow-net", "127.0.0.1")
	c := s.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	// The token lives in a tmpfs only: it is in the snapshot's memory,
	// not on its disk.
	const startCmd = `mkdir -p /dev/shm && (grep -q ' /dev/shm tmpfs ' /proc/mounts || mount -t tmpfs tmpfs /dev/shm) &&
mkdir -p /dev/shm/www && head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n' >/dev/shm/www/token &&
echo serving $(cat /dev/shm/www/token) && exec httpd -f -p 8000 -h /dev/shm/www`
	const get = `timeout 5 wget -q -O- http://127.0.0.1:8000/token`
	t0 := time.Now()
	out, err := runCLI(t, s, "template", "build", "web", "--from-image", host+"/test/web:v1",
		"--start-cmd", startCmd, "--ready-cmd", get, "--ready-timeout", "90s")
	if err != nil {
		t.Fatalf("panda template build --start-cmd: %v\n%s", err, out)
	}
	t.Logf("build with a start command: %.1fs\n%s", time.Since(t0).Seconds(), out)
	if !strings.Contains(out, "ready after") || !strings.Contains(out, "is ready") {
		t.Errorf("panda template build printed:\n%s", out)
	}
	ts, err := c.Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, tp := range ts {
		if tp.Name == "web" {
			found = tp.State == pandastack.TemplateReady && tp.StartCmd == startCmd && tp.ReadyCmd == get && tp.ReadyTimeoutSeconds == 90
			t.Logf("template web: state %s, baked in %d ms", tp.State, tp.BakeMS)
		}
	}
	if !found {
		t.Errorf("templates after the build: %+v", ts)
	}

	var sbs []*pandastack.Sandbox
	for range 2 {
		sb, err := c.Create(ctx, pandastack.CreateOptions{Template: "web", TTLSeconds: 1800})
		if err != nil {
			t.Fatalf("create from the template: %v", err)
		}
		sbs = append(sbs, sb)
	}
	token := mustExec(t, ctx, sbs[0], get)
	if len(token) != 16 {
		t.Fatalf("token served in %s: %q", sbs[0].ID, token)
	}
	for _, sb := range sbs {
		if got := mustExec(t, ctx, sb, get); got != token {
			t.Errorf("sandbox %s serves %q, want the template's %q", sb.ID, got, token)
		}
		if got := mustExec(t, ctx, sb, "pidof httpd"); strings.TrimSpace(got) == "" {
			t.Errorf("sandbox %s: no httpd running", sb.ID)
		}
		if got := mustExec(t, ctx, sb, "grep -c ' /dev/shm tmpfs ' /proc/mounts"); got != "1\n" {
			t.Errorf("sandbox %s: /dev/shm is not one tmpfs: %q", sb.ID, got)
		}
		if got := mustExec(t, ctx, sb, "cat "+templates.StartLog); got != "serving "+token+"\n" {
			t.Errorf("sandbox %s: start log %q", sb.ID, got)
		}
	}
	mustExec(t, ctx, sbs[0], "echo changed >/dev/shm/www/token")
	if got := mustExec(t, ctx, sbs[0], get); got != "changed\n" {
		t.Errorf("sandbox %s after the change serves %q", sbs[0].ID, got)
	}
	if got := mustExec(t, ctx, sbs[1], get); got != token {
		t.Errorf("sandbox %s serves %q after the other one changed its token; want %q", sbs[1].ID, got, token)
	}

	// A ready command that never succeeds: the build fails with its
	// output and the start command's, and keeps nothing.
	t0 = time.Now()
	b, err := c.BuildTemplate(ctx, "never", host+"/test/web:v1", nil,
		pandastack.WithStartCmd("echo started-marker; exec sleep 1000"),
		pandastack.WithReadyCmd("echo not-ready-marker; exit 3"),
		pandastack.WithReadyTimeout(3*time.Second))
	var pe *pandastack.Error
	if !errors.As(err, &pe) || pe.Code != pandastack.CodeBuildFailed || b.Status != pandastack.BuildFailed {
		t.Fatalf("build with a ready command that fails: %+v, %v; want failed with %s", b, err, pandastack.CodeBuildFailed)
	}
	t.Logf("failed build: %.1fs: %s", time.Since(t0).Seconds(), b.Error)
	for _, want := range []string{"not-ready-marker", "exit 3", "started-marker"} {
		if !strings.Contains(b.Error, want) {
			t.Errorf("build error %q lacks %q", b.Error, want)
		}
	}
	ts, err = c.Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range ts {
		if tp.Name == "never" {
			t.Errorf("template of the failed build is listed: %+v", tp)
		}
	}
	if _, err := c.Create(ctx, pandastack.CreateOptions{Template: "never"}); !errors.Is(err, pandastack.ErrNotFound) {
		t.Errorf("create from the failed template: %v, want not found", err)
	}
	// A rebuild that fails so leaves the template as it was, baked.
	if _, err := c.BuildTemplate(ctx, "web", host+"/test/web:v1", nil,
		pandastack.WithStartCmd(startCmd), pandastack.WithReadyCmd("exit 1"), pandastack.WithReadyTimeout(time.Second)); err == nil {
		t.Errorf("rebuild with a ready command that fails succeeded")
	}
	ts, err = c.Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found = false
	for _, tp := range ts {
		if tp.Name == "web" {
			found = tp.State == pandastack.TemplateReady && tp.ReadyCmd == get
		}
	}
	if !found {
		t.Errorf("templates after a failed rebuild of web: %+v", ts)
	}
	sb3, err := c.Create(ctx, pandastack.CreateOptions{Template: "web", TTLSeconds: 1800})
	if err != nil {
		t.Fatalf("create after a failed rebuild: %v", err)
	}
	if got := mustExec(t, ctx, sb3, get); got != token {
		t.Errorf("sandbox of web after a failed rebuild serves %q, want %q", got, token)
	}
	sbs = append(sbs, sb3)
	for _, sb := range sbs {
		if err := sb.Kill(ctx); err != nil {
			t.Error(err)
		}
	}
}
