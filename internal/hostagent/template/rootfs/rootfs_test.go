package rootfs_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/pandastack/pandastack/internal/hostagent/template/rootfs"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// needRoot gates a test that builds file systems with their owners (as
// root) and checks e2fsprogs, which builds them.
func needRoot(t *testing.T) {
	t.Helper()
	testkit.Root(t)
	for _, tool := range []string{"mkfs.ext4", "debugfs", "e2fsck"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("rootfs tests need %s (e2fsprogs; make setup installs it)", tool)
		}
	}
}

// entry is one tar entry of a test layer: a header and a regular file's body.
type entry struct {
	tar.Header
	body string
}

var (
	t1 = time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	t2 = time.Date(2021, 6, 7, 8, 9, 10, 0, time.UTC)
)

func dir(name string, mode int64) entry {
	return entry{Header: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: t1}}
}

func file(name string, mode int64, body string) entry {
	return entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, ModTime: t1, Size: int64(len(body))}, body: body}
}

func symlink(name, target string) entry {
	return entry{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: t1}}
}

func hardlink(name, target string) entry {
	return entry{Header: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, ModTime: t1}}
}

func owned(e entry, uid, gid int) entry {
	e.Uid, e.Gid = uid, gid
	return e
}

// layer makes a layer of entries, written with archive/tar in PAX format
// (for the extended attributes).
func layer(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.Header
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("tar header %s: %v", h.Name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatalf("tar body %s: %v", h.Name, err)
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

// image makes an image for platform ("linux/amd64") of layers, bottom first.
func image(t *testing.T, platform string, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	p, err := v1.ParsePlatform(platform)
	if err != nil {
		t.Fatal(err)
	}
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// startRegistry runs go-containerregistry's registry on 127.0.0.1 and
// returns its host:port.
func startRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func push(t *testing.T, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

// build runs FromImage into a fresh directory and returns the image's path
// and the progress lines.
func build(t *testing.T, src string, opts rootfs.Options) (string, rootfs.Config, []string, error) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "rootfs-test.ext4")
	var lines []string
	opts.Progress = func(s string) { lines = append(lines, s) }
	cfg, err := rootfs.FromImage(context.Background(), src, out, opts)
	if err == nil {
		if msg, ferr := exec.Command("e2fsck", "-fn", out).CombinedOutput(); ferr != nil {
			t.Fatalf("e2fsck -fn of the new image: %v\n%s", ferr, msg)
		}
	} else {
		assertEmpty(t, filepath.Dir(out))
	}
	return out, cfg, lines, err
}

// assertEmpty checks that a failed build left nothing behind.
func assertEmpty(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) > 0 {
		t.Errorf("a failed build left %v in its directory", names)
	}
}

// inode is what debugfs's stat says about a path of an ext4 image.
type inode struct {
	typ          string // "regular", "directory", "symlink", "FIFO", "character special", ...
	mode         int64  // permission bits and setuid/setgid/sticky
	uid, gid     int
	size         int64
	links        int
	mtime        int64
	target       string // a fast symlink's target
	xattrs       string // the "Extended attributes:" section, raw
	major, minor int
	statOutput   string
}

var (
	reHead  = regexp.MustCompile(`Type: (.+?)\s+Mode:\s+(\d+)`)
	reOwner = regexp.MustCompile(`User:\s+(\d+)\s+Group:\s+(\d+).*Size: (\d+)`)
	reLinks = regexp.MustCompile(`Links: (\d+)`)
	reMtime = regexp.MustCompile(`mtime: 0x([0-9a-f]+)`)
	reFast  = regexp.MustCompile(`Fast link dest: "(.*)"`)
	reDev   = regexp.MustCompile(`Device major/minor number: (\d+):(\d+)`)
)

func debugfs(t *testing.T, img, req string) string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", req, img).Output()
	if err != nil {
		t.Fatalf("debugfs -R %q: %v", req, err)
	}
	return string(out)
}

// stat returns path's inode, or nil if the image has no such path.
func stat(t *testing.T, img, path string) *inode {
	t.Helper()
	cmd := exec.Command("debugfs", "-R", "stat "+path, img)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("debugfs stat %s: %v: %s", path, err, stderr.String())
	}
	if strings.Contains(stderr.String(), "File not found") {
		return nil
	}
	s := string(out)
	m := reHead.FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("debugfs stat %s: no type in %q (%s)", path, s, stderr.String())
	}
	in := &inode{typ: m[1], statOutput: s}
	in.mode, _ = strconv.ParseInt(m[2], 8, 64)
	if m := reOwner.FindStringSubmatch(s); m != nil {
		in.uid, _ = strconv.Atoi(m[1])
		in.gid, _ = strconv.Atoi(m[2])
		in.size, _ = strconv.ParseInt(m[3], 10, 64)
	}
	if m := reLinks.FindStringSubmatch(s); m != nil {
		in.links, _ = strconv.Atoi(m[1])
	}
	if m := reMtime.FindStringSubmatch(s); m != nil {
		in.mtime, _ = strconv.ParseInt(m[1], 16, 64)
	}
	if m := reFast.FindStringSubmatch(s); m != nil {
		in.target = m[1]
	}
	if m := reDev.FindStringSubmatch(s); m != nil {
		in.major, _ = strconv.Atoi(m[1])
		in.minor, _ = strconv.Atoi(m[2])
	}
	if _, rest, ok := strings.Cut(s, "Extended attributes:\n"); ok {
		in.xattrs = rest
	}
	return in
}

func mustStat(t *testing.T, img, path string) *inode {
	t.Helper()
	in := stat(t, img, path)
	if in == nil {
		t.Fatalf("%s is missing from the image", path)
	}
	return in
}

// ls returns the names in dir, without "." and "..".
func ls(t *testing.T, img, dir string) []string {
	t.Helper()
	var names []string
	for _, f := range strings.Fields(debugfs(t, img, "ls -p "+dir)) {
		// -p prints /inode/mode/uid/gid/name/size/
		parts := strings.Split(f, "/")
		if len(parts) > 5 && parts[5] != "." && parts[5] != ".." {
			names = append(names, parts[5])
		}
	}
	slices.Sort(names)
	return names
}

func cat(t *testing.T, img, path string) string {
	t.Helper()
	return debugfs(t, img, "cat "+path)
}

// treeLayers are two layers holding what a real image's layers hold, the
// upper one whiting out, replacing and linking into the lower.
func treeLayers(t *testing.T) []v1.Layer {
	xattr := file("data/xattr", 0o644, "x")
	xattr.PAXRecords = map[string]string{"SCHILY.xattr.user.panda": "yes"}
	fifo := entry{Header: tar.Header{Typeflag: tar.TypeFifo, Name: "data/fifo", Mode: 0o640, ModTime: t1}}
	null := entry{Header: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3, ModTime: t1}}
	dated := file("data/file", 0o644, "hello")
	dated.ModTime = t2
	root := dir("./", 0o755)
	return []v1.Layer{
		layer(t,
			root,
			dir("etc/", 0o755),
			file("etc/gone", 0o644, "bye"),
			file("etc/passwd", 0o644, "root:x:0:0::/root:/bin/sh\n"),
			dir("opq/", 0o755),
			file("opq/a", 0o644, "a"),
			file("opq/b", 0o644, "b"),
			dir("opq/sub/", 0o755),
			file("opq/sub/deep", 0o644, "deep"),
			dir("data/", 0o755),
			dated,
			hardlink("data/hard", "data/file"),
			dir("bin/", 0o755),
			file("bin/su", 0o4755, "su"),
			owned(dir("home/user/", 0o750), 1000, 1000),
			owned(file("home/user/notes", 0o600, "mine"), 1000, 1000),
			file("replaced", 0o644, "a file"),
		),
		layer(t,
			file("etc/.wh.gone", 0o644, ""),
			dir("opq/", 0o755),
			file("opq/.wh..wh..opq", 0o644, ""),
			file("opq/c", 0o644, "c"),
			hardlink("data/hard2", "data/file"), // to a lower layer's file
			symlink("etc/alias", "/data/file"),
			symlink("long", "/"+strings.Repeat("x", 80)),
			xattr,
			fifo,
			null,
			dir("shared/", 0o1777),
			dir("sgid/", 0o2755),
			file("usr/bin/tool", 0o755, "#!/bin/sh\n"), // parents not listed
			file("data/same", 0o644, "kept"),
			file("data/.wh.same", 0o644, ""), // hides lower layers only
			dir("replaced/", 0o700),
		),
	}
}

func TestFromImageRegistryTree(t *testing.T) {
	needRoot(t)
	host := startRegistry(t)
	cfg := v1.Config{
		Env:        []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"},
		WorkingDir: "/work/app",
		User:       "1000:1000",
		Entrypoint: []string{"/bin/sh", "-c"},
		Cmd:        []string{"echo hi"},
	}
	img := image(t, "linux/amd64", cfg, treeLayers(t)...)
	push(t, host+"/test/tree:v1", img)
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}

	out, got, lines, err := build(t, host+"/test/tree:v1", rootfs.Options{SizeMiB: 64})
	if err != nil {
		t.Fatalf("FromImage: %v", err)
	}
	want := rootfs.Config{Digest: digest.String(), Env: cfg.Env, WorkingDir: cfg.WorkingDir, User: cfg.User, Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd}
	if !configEqual(got, want) {
		t.Errorf("config: got %+v, want %+v", got, want)
	}
	for _, w := range []string{"pulling layer 1/2 (", "pulling layer 2/2 (", "making ext4 (64 MiB)"} {
		if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, w) }) {
			t.Errorf("progress %q has no line starting %q", lines, w)
		}
	}
	checkTree(t, out)

	// The same image by digest, plain HTTP allowed.
	out, got, _, err = build(t, host+"/test/tree@"+digest.String(), rootfs.Options{SizeMiB: 64, Insecure: true})
	if err != nil {
		t.Fatalf("FromImage by digest: %v", err)
	}
	if got.Digest != digest.String() {
		t.Errorf("digest: got %s, want %s", got.Digest, digest)
	}
	if body := cat(t, out, "/data/file"); body != "hello" {
		t.Errorf("/data/file: got %q, want %q", body, "hello")
	}
}

func configEqual(a, b rootfs.Config) bool {
	return a.Digest == b.Digest && a.WorkingDir == b.WorkingDir && a.User == b.User &&
		slices.Equal(a.Env, b.Env) && slices.Equal(a.Entrypoint, b.Entrypoint) && slices.Equal(a.Cmd, b.Cmd)
}

// checkTree checks the image built from treeLayers.
func checkTree(t *testing.T, img string) {
	t.Helper()
	for _, gone := range []string{"/etc/gone", "/opq/a", "/opq/b", "/opq/sub"} {
		if stat(t, img, gone) != nil {
			t.Errorf("%s: whited out, but in the image", gone)
		}
	}
	if got, want := ls(t, img, "/opq"), []string{"c"}; !slices.Equal(got, want) {
		t.Errorf("/opq after its opaque whiteout: got %v, want %v", got, want)
	}
	if got := cat(t, img, "/data/same"); got != "kept" {
		t.Errorf("/data/same, whited out in its own layer: got %q, want %q", got, "kept")
	}

	tests := []struct {
		path     string
		typ      string
		mode     int64
		uid, gid int
		links    int
	}{
		{"/", "directory", 0o755, 0, 0, 0},
		{"/data/file", "regular", 0o644, 0, 0, 3},
		{"/data/hard", "regular", 0o644, 0, 0, 3},
		{"/data/hard2", "regular", 0o644, 0, 0, 3},
		{"/bin/su", "regular", 0o4755, 0, 0, 1},
		{"/home/user", "directory", 0o750, 1000, 1000, 0},
		{"/home/user/notes", "regular", 0o600, 1000, 1000, 1},
		{"/etc/alias", "symlink", 0o777, 0, 0, 1},
		{"/data/fifo", "FIFO", 0o640, 0, 0, 1},
		{"/dev/null", "character special", 0o666, 0, 0, 1},
		{"/shared", "directory", 0o1777, 0, 0, 0},
		{"/sgid", "directory", 0o2755, 0, 0, 0},
		{"/usr", "directory", 0o755, 0, 0, 0},
		{"/usr/bin/tool", "regular", 0o755, 0, 0, 1},
		{"/replaced", "directory", 0o700, 0, 0, 0},
		// What FromImage adds.
		{"/run", "directory", 0o755, 0, 0, 0},
		{"/tmp", "directory", 0o1777, 0, 0, 0},
		{"/work", "directory", 0o755, 0, 0, 0},
		{"/etc/hosts", "regular", 0o644, 0, 0, 1},
	}
	for _, tt := range tests {
		in := mustStat(t, img, tt.path)
		if in.typ != tt.typ || in.mode != tt.mode || in.uid != tt.uid || in.gid != tt.gid {
			t.Errorf("%s: got %s %#o %d:%d, want %s %#o %d:%d", tt.path, in.typ, in.mode, in.uid, in.gid, tt.typ, tt.mode, tt.uid, tt.gid)
		}
		if tt.links != 0 && in.links != tt.links {
			t.Errorf("%s: got %d links, want %d", tt.path, in.links, tt.links)
		}
	}
	if in := mustStat(t, img, "/etc/alias"); in.target != "/data/file" {
		t.Errorf("/etc/alias: got target %q, want /data/file", in.target)
	}
	if in := mustStat(t, img, "/long"); in.typ != "symlink" || in.size != 81 {
		t.Errorf("/long: got %s of %d bytes, want a symlink of 81", in.typ, in.size)
	}
	if in := mustStat(t, img, "/dev/null"); in.major != 1 || in.minor != 3 {
		t.Errorf("/dev/null: got device %d:%d, want 1:3", in.major, in.minor)
	}
	if in := mustStat(t, img, "/data/xattr"); !strings.Contains(in.xattrs, `user.panda (3) = "yes"`) {
		t.Errorf("/data/xattr: extended attributes %q, want user.panda = yes", in.xattrs)
	}
	if in := mustStat(t, img, "/data/file"); in.mtime != t2.Unix() {
		t.Errorf("/data/file: got mtime %d, want %d", in.mtime, t2.Unix())
	}
	if in := mustStat(t, img, "/etc"); in.mtime != t1.Unix() {
		t.Errorf("/etc: got mtime %d, want %d (the layer's, though entries were added and removed)", in.mtime, t1.Unix())
	}
	if got, want := cat(t, img, "/etc/hosts"), "127.0.0.1 localhost\n"; got != want {
		t.Errorf("/etc/hosts: got %q, want %q", got, want)
	}
	if got, want := cat(t, img, "/data/hard2"), "hello"; got != want {
		t.Errorf("/data/hard2: got %q, want %q", got, want)
	}
}

func TestFromImageLocal(t *testing.T) {
	needRoot(t)
	img := image(t, "linux/amd64", v1.Config{Cmd: []string{"/bin/true"}}, treeLayers(t)...)
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}

	ociDir := filepath.Join(t.TempDir(), "oci")
	p, err := layout.Write(ociDir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "saved.tar")
	tag, err := name.NewTag("example.com/saved:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}

	for _, src := range []string{"oci:" + ociDir, ociDir, "docker-archive:" + archive, archive} {
		t.Run(src, func(t *testing.T) {
			out, cfg, lines, err := build(t, src, rootfs.Options{SizeMiB: 64})
			if err != nil {
				t.Fatalf("FromImage: %v", err)
			}
			if cfg.Digest != digest.String() || !slices.Equal(cfg.Cmd, []string{"/bin/true"}) {
				t.Errorf("config: got %+v, want digest %s and Cmd /bin/true", cfg, digest)
			}
			if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "reading layer 2/2") }) {
				t.Errorf("progress %q: no reading layer 2/2", lines)
			}
			checkTree(t, out)
		})
	}
}

func TestFromImagePlatforms(t *testing.T) {
	needRoot(t)
	host := startRegistry(t)
	of := func(platform string) v1.Image {
		return image(t, platform, v1.Config{}, layer(t, file("platform", 0o644, platform)))
	}
	index := func(platforms ...string) v1.ImageIndex {
		var adds []mutate.IndexAddendum
		for _, p := range platforms {
			pl, err := v1.ParsePlatform(p)
			if err != nil {
				t.Fatal(err)
			}
			adds = append(adds, mutate.IndexAddendum{Add: of(p), Descriptor: v1.Descriptor{Platform: pl}})
		}
		return mutate.AppendManifests(empty.Index, adds...)
	}
	pushIndex := func(ref string, idx v1.ImageIndex) {
		r, err := name.ParseReference(ref)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.WriteIndex(r, idx); err != nil {
			t.Fatal(err)
		}
	}
	pushIndex(host+"/multi:with-amd64", index("linux/arm64", "linux/amd64", "linux/s390x"))
	pushIndex(host+"/multi:without", index("linux/arm64", "linux/arm/v7"))
	push(t, host+"/single:arm64", of("linux/arm64"))
	push(t, host+"/single:windows", of("windows/amd64"))

	out, _, _, err := build(t, host+"/multi:with-amd64", rootfs.Options{SizeMiB: 16})
	if err != nil {
		t.Fatalf("index with linux/amd64: %v", err)
	}
	if got := cat(t, out, "/platform"); got != "linux/amd64" {
		t.Errorf("index with linux/amd64: got the image for %q", got)
	}

	for _, tt := range []struct {
		ref  string
		want []string // in the message
	}{
		{"multi:without", []string{"no linux/amd64 variant", "linux/arm/v7", "linux/arm64"}},
		{"single:arm64", []string{"is for linux/arm64"}},
		{"single:windows", []string{"is for windows/amd64"}},
	} {
		_, _, _, err := build(t, host+"/"+tt.ref, rootfs.Options{SizeMiB: 16})
		if !errors.Is(err, rootfs.ErrPlatform) {
			t.Errorf("%s: got %v, want ErrPlatform", tt.ref, err)
			continue
		}
		for _, w := range append(tt.want, tt.ref) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tt.ref, err, w)
			}
		}
	}
}

func TestFromImageErrors(t *testing.T) {
	needRoot(t)
	host := startRegistry(t)
	plumbing, err := random.Image(1024, 3) // a platform-less config: accepted
	if err != nil {
		t.Fatal(err)
	}
	push(t, host+"/exists:v1", plumbing)
	if _, _, lines, err := build(t, host+"/exists:v1", rootfs.Options{SizeMiB: 16}); err != nil || len(lines) != 4 {
		t.Fatalf("random image: got %v, progress %q; want success in 3 layers", err, lines)
	}
	refuse := func(code int) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			w.WriteHeader(code)
		}))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://")
	}
	notLayout := t.TempDir()
	for _, tt := range []struct {
		src   string
		class error
		want  string // in the message
	}{
		{host + "/exists:nope", rootfs.ErrNotFound, "not found"},
		{host + "/missing/repo:v1", rootfs.ErrNotFound, "not found"},
		{host + "/exists@sha256:" + strings.Repeat("0", 64), rootfs.ErrNotFound, "not found"},
		{refuse(401) + "/private:v1", rootfs.ErrDenied, "refused"},
		{refuse(403) + "/private:v1", rootfs.ErrDenied, "HTTP 403"},
		{"Bad::Ref", rootfs.ErrInvalid, "bad image reference"},
		{host + "/UPPER:v1", rootfs.ErrInvalid, "bad image reference"},
		{"containers-storage:foo", rootfs.ErrInvalid, "unsupported image source"},
		{"oci:/nonexistent/layout", rootfs.ErrNotFound, "not found"},
		{"docker-archive:/nonexistent.tar", rootfs.ErrNotFound, "not found"},
		{"/nonexistent/saved.tar", rootfs.ErrNotFound, "not found"},
		{notLayout, rootfs.ErrInvalid, "not an OCI image layout"},
	} {
		_, _, _, err := build(t, tt.src, rootfs.Options{SizeMiB: 16})
		t.Logf("%s: %v", tt.src, err)
		if !errors.Is(err, tt.class) {
			t.Errorf("%s: got %v, want %v", tt.src, err, tt.class)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %q does not say %q", tt.src, err, tt.want)
		}
		if tt.class != rootfs.ErrInvalid && !strings.Contains(err.Error(), tt.src) {
			t.Errorf("%s: %q does not name the image", tt.src, err)
		}
	}
}

// TestFromImageEscapes builds images whose layers try to write outside the
// tree: refused, or contained in it.
func TestFromImageEscapes(t *testing.T) {
	needRoot(t)
	host := t.TempDir() // stands for the host's file system
	hostFile := filepath.Join(host, "victim")
	rel := strings.Repeat("../", 20) + strings.TrimPrefix(host, "/")
	for _, tt := range []struct {
		name    string
		entries []entry
		// A refused layer is ErrInvalid; a contained one builds and has
		// contained (a path in the image) holding "pwned".
		refused   bool
		contained string
	}{
		{name: "dotdot", entries: []entry{file("../x", 0o644, "pwned")}, refused: true},
		{name: "dotdot inside", entries: []entry{file("a/../../"+rel+"/victim", 0o644, "pwned")}, refused: true},
		{name: "absolute", entries: []entry{file(hostFile, 0o644, "pwned")}, contained: hostFile},
		{name: "symlink absolute", entries: []entry{
			dir(strings.TrimPrefix(host, "/")+"/", 0o755),
			symlink("evil", host),
			file("evil/victim", 0o644, "pwned"),
		}, contained: hostFile},
		// Every case aims at host, never at the real /etc: were the
		// containment broken, running this as root must not harm the machine.
		{name: "symlink relative", entries: []entry{
			dir("in/", 0o755),
			dir(strings.TrimPrefix(host, "/")+"/", 0o755),
			symlink("in/evil", "../"+rel),
			file("in/evil/victim", 0o644, "pwned"),
		}, contained: hostFile},
		{name: "symlink dangling", entries: []entry{
			symlink("evil", host+"/nowhere"),
			file("evil/victim", 0o644, "pwned"),
		}, refused: true},
		{name: "symlink then file over it", entries: []entry{
			symlink("evil", hostFile),
			file("evil", 0o644, "pwned"),
		}, contained: "/evil"},
		{name: "hard link out", entries: []entry{hardlink("hl", "../"+rel+"/victim")}, refused: true},
		{name: "hard link through symlink", entries: []entry{
			symlink("evil", host),
			hardlink("hl", "evil/victim"),
		}, refused: true}, // resolves to the image's own (missing) file
		{name: "whiteout dotdot", entries: []entry{file("a/.wh..", 0o644, "")}, refused: true},
		{name: "whiteout through symlink", entries: []entry{
			symlink("evil", host),
			file("evil/.wh.victim", 0o644, ""),
		}, contained: ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := os.WriteFile(hostFile, []byte("untouched"), 0o644); err != nil {
				t.Fatal(err)
			}
			img := image(t, "linux/amd64", v1.Config{}, layer(t, tt.entries...))
			src := filepath.Join(t.TempDir(), "escape.tar")
			if err := tarball.WriteToFile(src, name.MustParseReference("example.com/escape:v1").(name.Tag), img); err != nil {
				t.Fatal(err)
			}
			out, _, _, err := build(t, src, rootfs.Options{SizeMiB: 16})
			if body, rerr := os.ReadFile(hostFile); rerr != nil || string(body) != "untouched" {
				t.Fatalf("the host's file: got %q, %v; want it untouched", body, rerr)
			}
			if tt.refused {
				if !errors.Is(err, rootfs.ErrInvalid) {
					t.Fatalf("got %v, want ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("FromImage: %v", err)
			}
			if tt.contained != "" {
				if got := cat(t, out, tt.contained); got != "pwned" {
					t.Errorf("%s in the image: got %q, want %q", tt.contained, got, "pwned")
				}
			}
		})
	}
}

func TestFromImageSize(t *testing.T) {
	needRoot(t)
	zeros := strings.Repeat("\x00", 24<<20) // compresses to little
	img := image(t, "linux/amd64", v1.Config{}, layer(t, file("big", 0o644, zeros), file("small", 0o644, "s")))
	src := filepath.Join(t.TempDir(), "big.tar")
	if err := tarball.WriteToFile(src, name.MustParseReference("example.com/big:v1").(name.Tag), img); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		opts rootfs.Options
		want string // in the message; "" for success
		size int64  // of the image, MiB, on success
	}{
		{"over the limit while extracting", rootfs.Options{MaxSizeMiB: 16}, "more than the limit of 16 MiB", 0},
		{"over the limit in total", rootfs.Options{MaxSizeMiB: 28}, "more than the limit of 28 MiB", 0},
		{"size too small", rootfs.Options{SizeMiB: 20}, "more than the size of 20 MiB", 0},
		{"size over the limit", rootfs.Options{SizeMiB: 64, MaxSizeMiB: 32}, "over the limit of 32 MiB", 0},
		{"size given", rootfs.Options{SizeMiB: 48}, "", 48},
		{"capped", rootfs.Options{MaxSizeMiB: 100}, "", 100},
		{"headroom", rootfs.Options{}, "", 320},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, _, lines, err := build(t, src, tt.opts)
			if tt.want != "" {
				if !errors.Is(err, rootfs.ErrTooLarge) || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("got %v, want ErrTooLarge saying %q", err, tt.want)
				}
				return
			}
			if err != nil {
				t.Fatalf("FromImage: %v", err)
			}
			fi, err := os.Stat(out)
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Size() >> 20; got != tt.size {
				t.Errorf("size: got %d MiB, want %d (progress %q)", got, tt.size, lines)
			}
			if in := mustStat(t, out, "/big"); in.size != int64(len(zeros)) {
				t.Errorf("/big: got %d bytes, want %d", in.size, len(zeros))
			}
		})
	}
}

// TestFromImageReplacesOut checks that out is replaced whole and that a
// failed build leaves an existing out as it was.
func TestFromImageReplacesOut(t *testing.T) {
	needRoot(t)
	src := filepath.Join(t.TempDir(), "img.tar")
	if err := tarball.WriteToFile(src, name.MustParseReference("example.com/img:v1").(name.Tag),
		image(t, "linux/amd64", v1.Config{}, layer(t, file("f", 0o644, "new")))); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "rootfs-x.ext4")
	if err := os.WriteFile(out, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := rootfs.FromImage(ctx, src, out, rootfs.Options{SizeMiB: 1}); !errors.Is(err, rootfs.ErrTooLarge) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
	if body, _ := os.ReadFile(out); string(body) != "old" {
		t.Errorf("a failed build changed out")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("a failed build left %d entries, want only out", len(ents))
	}
	if _, err := rootfs.FromImage(ctx, src, out, rootfs.Options{SizeMiB: 16}); err != nil {
		t.Fatal(err)
	}
	if got := cat(t, out, "/f"); got != "new" {
		t.Errorf("/f: got %q, want new", got)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("out: got %v, %v; want mode 0644", fi.Mode(), err)
	}
}

// TestFromImageRootDir checks that the root directory gets the owner and mode
// the image's "./" entry gives it, which mke2fs -d does not copy.
func TestFromImageRootDir(t *testing.T) {
	needRoot(t)
	src := filepath.Join(t.TempDir(), "img.tar")
	img := image(t, "linux/amd64", v1.Config{}, layer(t, owned(dir("./", 0o711), 5, 6), file("f", 0o644, "f")))
	if err := tarball.WriteToFile(src, name.MustParseReference("example.com/img:v1").(name.Tag), img); err != nil {
		t.Fatal(err)
	}
	out, _, _, err := build(t, src, rootfs.Options{SizeMiB: 16})
	if err != nil {
		t.Fatal(err)
	}
	if in := mustStat(t, out, "/"); in.typ != "directory" || in.mode != 0o711 || in.uid != 5 || in.gid != 6 {
		t.Errorf("/: got %s %#o %d:%d, want directory 0711 5:6", in.typ, in.mode, in.uid, in.gid)
	}
	if got := cat(t, out, "/f"); got != "f" {
		t.Errorf("/f: got %q, want f", got)
	}
}

// TestFromImageUmask: under panda up's umask 077, an image that does not
// say what / is gets a 0755 one, and directories the layers imply but do
// not list are 0755 too (0700 ones would lock every user but root out).
func TestFromImageUmask(t *testing.T) {
	needRoot(t)
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	src := filepath.Join(t.TempDir(), "img.tar")
	img := image(t, "linux/amd64", v1.Config{}, layer(t, file("usr/bin/x", 0o755, "x")))
	if err := tarball.WriteToFile(src, name.MustParseReference("example.com/img:v1").(name.Tag), img); err != nil {
		t.Fatal(err)
	}
	out, _, _, err := build(t, src, rootfs.Options{SizeMiB: 16})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/", "/usr", "/usr/bin"} {
		if in := mustStat(t, out, p); in.typ != "directory" || in.mode != 0o755 {
			t.Errorf("%s: got %s %#o, want directory 0755", p, in.typ, in.mode)
		}
	}
}
