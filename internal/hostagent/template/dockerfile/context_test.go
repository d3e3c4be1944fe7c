package dockerfile

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func openTestContext(t *testing.T, max int64, es ...tentry) (*buildContext, error) {
	t.Helper()
	return openContext(context.Background(), writeTarFile(t, es...), t.TempDir(), max)
}

// appContext is a typical build context.
func appContext(t *testing.T) *buildContext {
	t.Helper()
	c, err := openTestContext(t, 1<<20,
		tfile(".dockerignore", "node_modules\n*.log\n!keep.log\nsecret/\n"),
		tfile("package.json", "{}"),
		tfile("server.js", "js"),
		tfile("a.log", "log"),
		tfile("keep.log", "kept"),
		tdir("node_modules/"), tfile("node_modules/x/index.js", "x"),
		tdir("secret/"), tfile("secret/key", "k"),
		tentry{name: "src/", typ: tar.TypeDir, mode: 0o750},
		tentry{name: "src/main.go", typ: tar.TypeReg, body: "go", mode: 0o600},
		tfile("src/lib/util.go", "util"),
		tlink("src/link.go", "main.go"),
		tlink("current", "/src"),
		tlink("abs", "/src/main.go"),
		tlink("escape", "../../etc/passwd"),
		tfile("docs/a.md", "a"), tfile("docs/b.md", "b"), tfile("docs/c.txt", "c"),
		tdir("empty/"),
	)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// copyTar plans "FROM img\n"+steps and returns the tar of its last
// COPY/ADD (a single file goes into an existing directory if intoDir).
func copyTar(t *testing.T, bctx *buildContext, steps string, intoDir bool) ([]string, *copySpec, error) {
	t.Helper()
	p, err := planOf(t, "FROM img\n"+steps, nil, bctx)
	if err != nil {
		return nil, nil, err
	}
	cs := p.steps[len(p.steps)-1].copy
	var buf bytes.Buffer
	if err := writeTar(&buf, cs, intoDir); err != nil {
		t.Fatal(err)
	}
	return tarNames(t, buf.Bytes()), cs, nil
}

func TestCopySemantics(t *testing.T) {
	tests := []struct {
		name    string
		steps   string
		intoDir bool
		want    []string
	}{
		{"file to dir/", "COPY package.json /app/\n", false,
			[]string{"app/ 755", "app/package.json 644 {}"}},
		{"file to file", "COPY package.json /app/pkg.json\n", false,
			[]string{"app/ 755", "app/pkg.json 644 {}"}},
		{"file into an existing dir without slash", "COPY package.json /app\n", true,
			[]string{"app/ 755", "app/package.json 644 {}"}},
		{"relative dst against WORKDIR", "WORKDIR /srv/app\nCOPY package.json .\n", false,
			[]string{"srv/ 755", "srv/app/ 755", "srv/app/package.json 644 {}"}},
		{"relative dst file", "COPY server.js bin/s.js\n", false, // the base's WORKDIR is /srv
			[]string{"srv/ 755", "srv/bin/ 755", "srv/bin/s.js 644 js"}},
		{"dir copies its contents", "COPY src /code\n", false,
			[]string{"code/ 755", "code/lib/ 755", "code/lib/util.go 644 util", "code/link.go -> main.go", "code/main.go 600 go"}},
		{"wildcard", "COPY docs/*.md /d/\n", false,
			[]string{"d/ 755", "d/a.md 644 a", "d/b.md 644 b"}},
		{"several sources", "COPY package.json server.js /app/\n", false,
			[]string{"app/ 755", "app/package.json 644 {}", "app/server.js 644 js"}},
		{"chmod", "COPY --chmod=0700 src/lib /x/\n", false,
			[]string{"x/ 755", "x/util.go 700 util"}},
		{"dockerignore exception", "COPY *.log /l/\n", false,
			[]string{"l/ 755", "l/keep.log 644 kept"}},
		{"symlink source followed in the context", "COPY current/main.go /m\n", false,
			[]string{"m 600 go"}},
		{"absolute symlink is scoped to the context", "COPY abs /m\n", false,
			[]string{"m 600 go"}},
		{"empty dir", "COPY empty /e\n", false,
			[]string{"e/ 755"}},
		{"copy to /", "COPY docs/a.md /\n", false,
			[]string{"a.md 644 a"}},
	}
	bctx := appContext(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _, err := copyTar(t, bctx, tt.steps, tt.intoDir)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestDockerignore(t *testing.T) {
	bctx := appContext(t)
	got, _, err := copyTar(t, bctx, "COPY . /app/\n", false)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range got {
		names = append(names, strings.Fields(g)[0])
	}
	all := strings.Join(names, "\n")
	for _, gone := range []string{"node_modules", "secret", "a.log"} {
		if strings.Contains(all, gone) {
			t.Errorf("COPY . copied %s, which .dockerignore excludes:\n%s", gone, all)
		}
	}
	for _, kept := range []string{"app/keep.log", "app/src/main.go", "app/package.json", "app/.dockerignore"} {
		if !strings.Contains(all, kept) {
			t.Errorf("COPY . did not copy %s:\n%s", kept, all)
		}
	}
}

func TestCopyErrors(t *testing.T) {
	bctx := appContext(t)
	tests := []struct{ steps, want string }{
		{"COPY missing.txt /x\n", "Dockerfile line 2: COPY: missing.txt: no such file or directory in the build context"},
		{"COPY node_modules/x/index.js /x\n", "no such file"}, // ignored
		{"COPY ../outside /x\n", "../outside is outside the build context"},
		{"COPY escape /x\n", "a symlink points outside the build context"},
		{"COPY *.nothing /x/\n", "no file in the build context matches *.nothing"},
		{"COPY package.json server.js /app\n", "the destination must be a directory ending in /"},
	}
	for _, tt := range tests {
		_, _, err := copyTar(t, bctx, tt.steps, false)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: got %v, want an ErrInvalid containing %q", tt.steps, err, tt.want)
		}
	}
}

func TestCopyHash(t *testing.T) {
	a := appContext(t)
	_, csA, err := copyTar(t, a, "COPY src /code/\n", false)
	if err != nil {
		t.Fatal(err)
	}
	_, csA2, _ := copyTar(t, a, "COPY src /code/\n", false)
	if csA.Hash != csA2.Hash {
		t.Errorf("the same copy hashed differently")
	}
	// Change one byte of one copied file; then one mode.
	if err := os.WriteFile(filepath.Join(a.root, "src/lib/util.go"), []byte("utiL"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, csB, _ := copyTar(t, a, "COPY src /code/\n", false)
	if csB.Hash == csA.Hash {
		t.Errorf("changing a file's content kept the hash")
	}
	os.Chmod(filepath.Join(a.root, "src/lib/util.go"), 0o755)
	_, csC, _ := copyTar(t, a, "COPY src /code/\n", false)
	if csC.Hash == csB.Hash {
		t.Errorf("changing a file's mode kept the hash")
	}
	os.Remove(filepath.Join(a.root, "src/link.go"))
	os.Symlink("lib/util.go", filepath.Join(a.root, "src/link.go"))
	_, csD, _ := copyTar(t, a, "COPY src /code/\n", false)
	if csD.Hash == csC.Hash {
		t.Errorf("changing a symlink's target kept the hash")
	}
}

func TestAddArchive(t *testing.T) {
	inner := tarBytes(t, tdir("pkg/"), tentry{name: "pkg/bin", typ: tar.TypeReg, body: "elf", mode: 0o755}, tlink("pkg/l", "bin"))
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(inner)
	zw.Close()
	bctx, err := openTestContext(t, 1<<20,
		tfile("plain.tar", string(inner)), tfile("comp.tar.gz", gz.String()), tfile("notes.txt", "n"),
		tfile("evil.tar", string(tarBytes(t, tfile("../../etc/x", "x")))))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"opt/ 755", "opt/pkg/ 755", "opt/pkg/bin 755 elf", "opt/pkg/l -> bin"}
	for _, src := range []string{"plain.tar", "comp.tar.gz"} {
		got, _, err := copyTar(t, bctx, "ADD "+src+" /opt\n", false)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("ADD %s: got %q, want %q", src, got, want)
		}
	}
	got, _, _ := copyTar(t, bctx, "ADD plain.tar /\n", false)
	if wantRoot := []string{"pkg/ 755", "pkg/bin 755 elf", "pkg/l -> bin"}; !reflect.DeepEqual(got, wantRoot) {
		t.Errorf("ADD to /: got %q, want %q", got, wantRoot)
	}
	// COPY does not unpack; ADD of a non-archive copies it.
	got, _, _ = copyTar(t, bctx, "COPY plain.tar /opt/\n", false)
	if len(got) != 2 || !strings.HasPrefix(got[1], "opt/plain.tar 644") {
		t.Errorf("COPY of an archive: got %q", got)
	}
	got, _, _ = copyTar(t, bctx, "ADD notes.txt /opt/n.txt\n", false)
	if !reflect.DeepEqual(got, []string{"opt/ 755", "opt/n.txt 644 n"}) {
		t.Errorf("ADD of a file: got %q", got)
	}
	p, err := planOf(t, "FROM img\nADD evil.tar /opt/\n", nil, bctx)
	if err != nil {
		t.Fatal(err)
	}
	err = writeTar(&bytes.Buffer{}, p.steps[0].copy, false)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "outside the archive") {
		t.Errorf("ADD of an archive with ../: got %v, want ErrInvalid", err)
	}
}

func TestContextSafety(t *testing.T) {
	tests := []struct {
		name string
		es   []tentry
		want string
	}{
		{"dotdot", []tentry{tfile("a/../../evil", "x")}, "outside the context"},
		{"absolute", []tentry{tfile("/etc/passwd", "x")}, "has an absolute path"},
		{"through a symlink", []tentry{tlink("l", "/etc"), tfile("l/passwd", "x")}, "inside a symlink"},
		{"device", []tentry{{name: "dev", typ: tar.TypeChar}}, "is a device or fifo"},
		{"fifo", []tentry{{name: "p", typ: tar.TypeFifo}}, "is a device or fifo"},
		{"hard link through a symlink", []tentry{tlink("l", "/etc"), {name: "h", typ: tar.TypeLink, link: "l/passwd"}}, "inside a symlink"},
		{"hard link out", []tentry{{name: "h", typ: tar.TypeLink, link: "../x"}}, "points outside the context"},
		{"size cap", []tentry{tfile("a", strings.Repeat("x", 600)), tfile("b", strings.Repeat("x", 600))}, "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			outside := t.TempDir()
			os.Mkdir(filepath.Join(outside, "ctx"), 0o755)
			_, err := openContext(context.Background(), writeTarFile(t, tt.es...), filepath.Join(outside, "ctx"), 1000)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an ErrInvalid containing %q", err, tt.want)
			}
			if _, err := os.Stat(filepath.Join(outside, "evil")); err == nil {
				t.Errorf("an entry was written outside the context")
			}
		})
	}
	// A symlink that points out of the context is kept (not an error) but
	// never followed: only COPYing through it fails (TestCopyErrors).
	if _, err := openTestContext(t, 1000, tlink("l", "../../../etc")); err != nil {
		t.Errorf("a dangling symlink: got %v, want it kept", err)
	}
}

func TestGzipContext(t *testing.T) {
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(tarBytes(t, tfile("x/y.txt", "yy")))
	zw.Close()
	p := filepath.Join(t.TempDir(), "c.tgz")
	os.WriteFile(p, gz.Bytes(), 0o644)
	c, err := openContext(context.Background(), p, t.TempDir(), 1000)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(c.root, "x/y.txt"))
	if err != nil || string(b) != "yy" {
		t.Errorf("got %q, %v, want yy", b, err)
	}
}
