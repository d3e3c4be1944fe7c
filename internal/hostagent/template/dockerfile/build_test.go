package dockerfile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/template"
)

type testBuild struct {
	w     *fakeWorld
	b     *Builder
	cache string
	// scope is the scope of the builds build runs (Request.Scope).
	scope string
}

func newTestBuilder(t *testing.T) *testBuild {
	t.Helper()
	w := &fakeWorld{}
	cache := filepath.Join(t.TempDir(), "cache")
	b, err := New(Config{Boot: w.boot, FromImage: w.fromImage, CacheDir: cache, TempDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return &testBuild{w: w, b: b, cache: cache}
}

// build runs a build and returns the output disk, the result and the
// progress lines.
func (tb *testBuild) build(t *testing.T, df, contextTar string, args map[string]string) (fakeDisk, Result, []string, error) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "out.ext4")
	var lines []string
	var mu sync.Mutex
	res, err := tb.b.Build(context.Background(), Request{Dockerfile: []byte(df), ContextTar: contextTar, BuildArgs: args, Scope: tb.scope}, out, func(s string) {
		mu.Lock()
		lines = append(lines, s)
		mu.Unlock()
	})
	if err != nil {
		return fakeDisk{}, res, lines, err
	}
	d, err := readDisk(out)
	if err != nil {
		t.Fatal(err)
	}
	return d, res, lines, nil
}

// reset forgets what the fake world recorded.
func (w *fakeWorld) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.boots, w.runs, w.chowns, w.commits, w.froms = nil, nil, nil, 0, 0
	w.restores, w.restoreDisks = nil, nil
}

// shells lists the shell commands the VMs ran.
func (w *fakeWorld) shells() []string {
	var out []string
	for _, r := range w.runs {
		if r.Shell != "" {
			out = append(out, r.Shell)
		}
	}
	return out
}

const appDockerfile = `FROM node:22
WORKDIR /app
COPY package.json ./
RUN npm ci
COPY src/ ./src/
RUN npm run build
ENV NODE_ENV=production
CMD ["node", "src/main.js"]
`

func appTar(t *testing.T, main string) string {
	return writeTarFile(t, tfile("package.json", "{}"), tdir("src/"), tfile("src/main.js", main))
}

func TestBuildAndCache(t *testing.T) {
	tb := newTestBuilder(t)
	d, res, _, err := tb.build(t, appDockerfile, appTar(t, "v1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	wantLog := []string{"from node:22", "extract /app /app/package.json", "run npm ci", "extract /app /app/src /app/src/main.js", "run npm run build"}
	if !reflect.DeepEqual(d.Log, wantLog) {
		t.Errorf("first build: got log %q, want %q", d.Log, wantLog)
	}
	if f := d.Files["/app/src/main.js"]; f.Data != "v1" {
		t.Errorf("got main.js %+v, want v1", f)
	}
	wantImg := templates.ImageConfig{Env: []string{"PATH=/usr/bin:/bin", "LANG=C", "NODE_ENV=production"}, WorkingDir: "/app", Cmd: []string{"node", "src/main.js"}}
	if !reflect.DeepEqual(res.Image, wantImg) || !strings.HasPrefix(res.Digest, "sha256:") {
		t.Errorf("got result %+v, want image %+v", res, wantImg)
	}
	if len(tb.w.boots) != 1 || tb.w.commits != 5 {
		t.Errorf("first build: got %d boots, %d commits, want 1 and 5", len(tb.w.boots), tb.w.commits)
	}

	// The same build again: nothing runs, the same disk comes out.
	tb.w.reset()
	d2, res2, lines, err := tb.build(t, appDockerfile, appTar(t, "v1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tb.w.boots) != 0 || !reflect.DeepEqual(d2, d) || res2.Digest != res.Digest {
		t.Errorf("rebuild: got %d boots, disk equal %v, digest %s vs %s", len(tb.w.boots), reflect.DeepEqual(d2, d), res2.Digest, res.Digest)
	}
	if n := strings.Count(strings.Join(lines, "\n"), "  cached"); n != 5 {
		t.Errorf("rebuild: got %d cached steps, want 5:\n%s", n, strings.Join(lines, "\n"))
	}

	// Only the last RUN changes: one boot, from the layer of the COPY
	// before it, and only that step runs.
	tb.w.reset()
	df3 := strings.Replace(appDockerfile, "RUN npm run build", "RUN npm run build:prod", 1)
	d3, _, _, err := tb.build(t, df3, appTar(t, "v1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tb.w.boots) != 1 {
		t.Fatalf("last RUN changed: got %d boots, want 1", len(tb.w.boots))
	}
	if got, want := tb.w.boots[0].Log, wantLog[:4]; !reflect.DeepEqual(got, want) {
		t.Errorf("last RUN changed: booted a disk with log %q, want %q", got, want)
	}
	if dir := filepath.Base(filepath.Dir(tb.w.disks[0])); !strings.HasPrefix(dir, tmpPrefix) {
		t.Errorf("booted %s, want a clone of the layer, not a cache entry in place", tb.w.disks[0])
	}
	if got := tb.w.shells(); !reflect.DeepEqual(got, []string{"npm run build:prod"}) {
		t.Errorf("last RUN changed: ran %q, want only the new RUN", got)
	}
	if got := d3.Log[len(d3.Log)-1]; got != "run npm run build:prod" {
		t.Errorf("got last log %q", got)
	}

	// A copied file changes: everything from that COPY on runs again.
	tb.w.reset()
	d4, _, _, err := tb.build(t, appDockerfile, appTar(t, "v2"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tb.w.boots[0].Log, wantLog[:3]; len(tb.w.boots) != 1 || !reflect.DeepEqual(got, want) {
		t.Errorf("source changed: got boots %v, want one from the layer with log %q", tb.w.boots, want)
	}
	if got := tb.w.shells(); !reflect.DeepEqual(got, []string{"npm run build"}) {
		t.Errorf("source changed: ran %q, want only npm run build", got)
	}
	if f := d4.Files["/app/src/main.js"]; f.Data != "v2" {
		t.Errorf("got main.js %+v, want v2", f)
	}
	// The FROM image is converted each build for a tag (it may move).
	if tb.w.froms != 1 {
		t.Errorf("got %d FROM conversions, want 1", tb.w.froms)
	}
}

func TestBaseCache(t *testing.T) {
	tb := newTestBuilder(t)
	pinned := "FROM node@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\nRUN make\n"
	for i := 0; i < 2; i++ {
		if _, _, _, err := tb.build(t, pinned, "", nil); err != nil {
			t.Fatal(err)
		}
	}
	if tb.w.froms != 1 {
		t.Errorf("a digest-pinned FROM: got %d conversions over 2 builds, want 1", tb.w.froms)
	}
	// A tag whose image changed (new digest) runs every step again.
	tb.w.reset()
	tb.build(t, "FROM node\nRUN make\n", "", nil)
	tb.w.digest = "sha256:other"
	tb.build(t, "FROM node\nRUN make\n", "", nil)
	if got := tb.w.shells(); !reflect.DeepEqual(got, []string{"make", "make"}) {
		t.Errorf("a moved tag: ran %q, want make twice", got)
	}
}

var durRE = regexp.MustCompile(`done in \d+\.\ds$`)

func TestProgress(t *testing.T) {
	tb := newTestBuilder(t)
	df := "FROM img\nLABEL a=b\nRUN echo hi\nUSER app\n"
	_, _, lines, err := tb.build(t, df, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range lines {
		lines[i] = durRE.ReplaceAllString(l, "done in Xs")
	}
	want := []string{
		"step 1/4: FROM img", "pulling img", "step 1/4 done in Xs",
		"step 2/4: LABEL a=b", "  ignored: templates keep no labels",
		"step 3/4: RUN echo hi", "ran echo hi", "step 3/4 done in Xs",
		"step 4/4: USER app",
	}
	if !reflect.DeepEqual(lines, want) {
		t.Errorf("got progress\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	_, _, lines, _ = tb.build(t, df, "", nil)
	if lines[5] != "step 3/4: RUN echo hi" || lines[6] != "  cached" {
		t.Errorf("rebuild: got progress %q, want the RUN cached", lines)
	}
}

func TestRunFails(t *testing.T) {
	tb := newTestBuilder(t)
	df := "FROM img\nRUN echo ok\n\nRUN many-lines; exit 3\nRUN never\n"
	_, _, _, err := tb.build(t, df, "", nil)
	if !errors.Is(err, ErrRunFailed) {
		t.Fatalf("got %v, want ErrRunFailed", err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "Dockerfile line 4: RUN many-lines; exit 3: exit code 3") {
		t.Errorf("got %q", msg)
	}
	// The last 20 lines: 12..30 and the fake's own last line.
	if !strings.Contains(msg, "\nline 12\n") || strings.Contains(msg, "line 11\n") || !strings.HasSuffix(msg, "ran many-lines; exit 3") {
		t.Errorf("got %q, want the last 20 output lines", msg)
	}
	if got := tb.w.shells(); !reflect.DeepEqual(got, []string{"echo ok", "many-lines; exit 3"}) {
		t.Errorf("ran %q", got)
	}
	// The step before the failure is cached: a fixed build resumes there.
	tb.w.reset()
	if _, _, _, err := tb.build(t, strings.Replace(df, "exit 3", "true", 1), "", nil); err != nil {
		t.Fatal(err)
	}
	if got := tb.w.shells(); !reflect.DeepEqual(got, []string{"many-lines; true", "never"}) {
		t.Errorf("after the fix: ran %q", got)
	}
}

func TestCopyInBuild(t *testing.T) {
	tb := newTestBuilder(t)
	ctxTar := writeTarFile(t, tfile("a.txt", "A"), tfile("b.txt", "B"))
	df := "FROM img\nUSER app\nWORKDIR /home/app\nCOPY --chown=app:staff a.txt /etc\nCOPY b.txt /etc/b-file\nCOPY a.txt .\n"
	d, _, _, err := tb.build(t, df, ctxTar, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(tb.w.chowns, []string{"app:staff", "", ""}) {
		t.Errorf("got chowns %q, want app:staff passed through", tb.w.chowns)
	}
	// /etc exists: the file goes into it; /etc/b-file does not: it is the file.
	if d.Files["/etc/a.txt"].Data != "A" || d.Files["/etc/a.txt"].Owner != "app:staff" || d.Files["/etc/b-file"].Data != "B" {
		t.Errorf("got files %+v", d.Files)
	}
	if d.Files["/etc"].Owner != "" {
		t.Errorf("COPY --chown changed the owner of the existing /etc")
	}
	// WORKDIR with USER: created for the user (as BuildKit does).
	if f := d.Files["/home/app"]; !f.Dir || f.Owner != "app" {
		t.Errorf("got WORKDIR %+v, want a dir owned by app", f)
	}
	if d.Files["/home/app/a.txt"].Data != "A" {
		t.Errorf("COPY a.txt . did not land in the WORKDIR")
	}
}

func TestBuildErrorsBeforeRunning(t *testing.T) {
	tb := newTestBuilder(t)
	_, _, _, err := tb.build(t, "FROM img\nRUN a\nCOPY missing /x\n", writeTarFile(t, tfile("a", "a")), nil)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "Dockerfile line 3") {
		t.Errorf("got %v, want ErrInvalid for line 3", err)
	}
	if len(tb.w.runs) != 0 {
		t.Errorf("a build with an invalid COPY ran %d commands", len(tb.w.runs))
	}
	tb.w.failBoot = true
	_, _, _, err = tb.build(t, "FROM img\nRUN a\n", "", nil)
	if err == nil || !strings.Contains(err.Error(), "boot the build VM") {
		t.Errorf("got %v, want a boot error", err)
	}
}

func TestConcurrentBuilds(t *testing.T) {
	tb := newTestBuilder(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, _, errs[i] = tb.build(t, "FROM img\nRUN a\nRUN b\n", "", nil)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	des, _ := os.ReadDir(tb.cache)
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	if len(names) != 3 {
		t.Errorf("got cache entries %q, want 3 (base and two RUNs), no leftovers", names)
	}
}

func TestEviction(t *testing.T) {
	dir := t.TempDir()
	c := &layerCache{dir: dir, pins: map[string]int{}, log: discardLogger()}
	mk := func(key string, age time.Duration) {
		tmp, err := c.tempDir()
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(tmp, layerFile), make([]byte, 64<<10), 0o644)
		if err := c.commit(tmp, key, "", Result{}); err != nil {
			t.Fatal(err)
		}
		when := time.Now().Add(-age)
		os.Chtimes(filepath.Join(dir, key), when, when)
	}
	mk("old", 3*time.Hour)
	mk("pinned", 2*time.Hour)
	mk("mid", time.Hour)
	mk("new", 0)
	c.pin("pinned")
	// A hit makes "old" the most recently used.
	c.pin("old")
	c.unpin("old")
	per := allocated(filepath.Join(dir, "new", layerFile)) + allocated(filepath.Join(dir, "new", configFile))
	if per < 64<<10 {
		t.Fatalf("allocated %d bytes for a 64 KiB file", per)
	}
	if err := c.evict(2 * per); err != nil {
		t.Fatal(err)
	}
	var got []string
	des, _ := os.ReadDir(dir)
	for _, de := range des {
		got = append(got, de.Name())
	}
	if want := []string{"old", "pinned"}; !reflect.DeepEqual(got, want) {
		t.Errorf("after eviction: got %q, want %q (LRU gone, pinned kept)", got, want)
	}
	c.unpin("pinned")
	c.evict(-1)
	if des, _ := os.ReadDir(dir); len(des) != 0 {
		t.Errorf("evict(-1) left %d entries", len(des))
	}
}

// TestEvictionByShare: a scope that floods the cache with newer layers
// evicts its own, not the older ones of a scope that holds less.
func TestEvictionByShare(t *testing.T) {
	dir := t.TempDir()
	c := &layerCache{dir: dir, pins: map[string]int{}, log: discardLogger()}
	mk := func(key, scope string, age time.Duration) {
		tmp, err := c.tempDir()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, layerFile), bytes.Repeat([]byte{1}, 64<<10), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := c.commit(tmp, key, scope, Result{}); err != nil {
			t.Fatal(err)
		}
		when := time.Now().Add(-age)
		os.Chtimes(filepath.Join(dir, key), when, when)
	}
	mk("alice1", "alice", 5*time.Hour)
	mk("alice2", "alice", 4*time.Hour)
	for i, age := range []time.Duration{3, 2, 1, 0} {
		mk(fmt.Sprintf("bob%d", i+1), "bob", age*time.Hour)
	}
	per := allocated(filepath.Join(dir, "bob4", layerFile)) + allocated(filepath.Join(dir, "bob4", configFile))
	// Room for four: bob, holding four, gives back two of his; LRU alone
	// would have taken alice's two, the oldest.
	if err := c.evict(4 * per); err != nil {
		t.Fatal(err)
	}
	var got []string
	des, _ := os.ReadDir(dir)
	for _, de := range des {
		got = append(got, de.Name())
	}
	if want := []string{"alice1", "alice2", "bob3", "bob4"}; !reflect.DeepEqual(got, want) {
		t.Errorf("after eviction: got %q, want %q (the largest scope's LRU entries gone)", got, want)
	}
	// Even shares: the least recently used goes first again.
	if err := c.evict(3 * per); err != nil {
		t.Fatal(err)
	}
	if des, _ := os.ReadDir(dir); len(des) != 3 || des[0].Name() != "alice2" {
		t.Errorf("after an eviction at even shares: %v, want alice1 gone", des)
	}
}

func TestCommitRace(t *testing.T) {
	c := &layerCache{dir: t.TempDir(), pins: map[string]int{}, log: discardLogger()}
	for i := 0; i < 2; i++ {
		tmp, _ := c.tempDir()
		os.WriteFile(filepath.Join(tmp, layerFile), []byte(fmt.Sprint(i)), 0o644)
		if err := c.commit(tmp, "k", "", Result{}); err != nil {
			t.Fatalf("commit %d: %v", i, err)
		}
	}
	b, _ := os.ReadFile(c.path("k"))
	des, _ := os.ReadDir(c.dir)
	if string(b) != "0" || len(des) != 1 {
		t.Errorf("got layer %q and %d entries, want the first commit's and no leftover", b, len(des))
	}
}

func TestCloneFileSparse(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, _ := os.Create(src)
	f.WriteAt([]byte("head"), 0)
	f.WriteAt([]byte("tail"), 64<<20)
	f.Close()
	dst := filepath.Join(dir, "dst")
	if err := CloneFile(src, dst); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("the clone differs from its source")
	}
	if got := allocated(dst); got > 8<<20 {
		t.Errorf("the clone of a sparse 64 MiB file allocates %d bytes", got)
	}
}

func TestLineWriter(t *testing.T) {
	var got []string
	w := newLineWriter(func(s string) { got = append(got, s) }, 2)
	fmt.Fprint(w, "a\nb")
	fmt.Fprint(w, "c\r50%\r100%\n")
	fmt.Fprint(w, "crlf\r")
	fmt.Fprint(w, "\n")
	fmt.Fprint(w, strings.Repeat("x", maxLineBytes+10)+"\nlast")
	w.Flush()
	want := []string{"a", "bc", "50%", "100%", "crlf", strings.Repeat("x", maxLineBytes) + "…", "last"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if tail := w.Tail(); !reflect.DeepEqual(tail, want[5:]) {
		t.Errorf("got tail %q", tail)
	}
}

// TestRestore: with Config.Restore, a build resumes from a cached layer
// by restoring the snapshot its VM committed (from private copies), and
// boots when the layer has no snapshot or the restore fails.
func TestRestore(t *testing.T) {
	tb := newTestBuilder(t)
	tb.b.cfg.Restore = tb.w.restore
	tb.w.snapshots = true
	df := "FROM base\nRUN one\nRUN two\nRUN three\n"
	if _, _, _, err := tb.build(t, df, "", nil); err != nil {
		t.Fatal(err)
	}
	// The base layer has no snapshot: booted.
	if len(tb.w.boots) != 1 || len(tb.w.restores) != 0 || tb.w.commits != 3 {
		t.Fatalf("first build: %d boots, %d restores, %d commits; want 1, 0, 3", len(tb.w.boots), len(tb.w.restores), tb.w.commits)
	}

	rebuild := func(t *testing.T, last string) []string {
		t.Helper()
		tb.w.reset()
		d, _, lines, err := tb.build(t, strings.Replace(df, "RUN three", "RUN "+last, 1), "", nil)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"from base", "run one", "run two", "run " + last}; !reflect.DeepEqual(d.Log, want) {
			t.Errorf("built log %q, want %q", d.Log, want)
		}
		return lines
	}
	rebuild(t, "3a")
	if len(tb.w.restores) != 1 || len(tb.w.boots) != 0 {
		t.Fatalf("last RUN changed: %d restores, %d boots; want 1 and 0", len(tb.w.restores), len(tb.w.boots))
	}
	if got, want := tb.w.restores[0].Log, []string{"from base", "run one", "run two"}; !reflect.DeepEqual(got, want) {
		t.Errorf("restored a disk with log %q, want %q", got, want)
	}
	if dir := filepath.Base(filepath.Dir(tb.w.restoreDisks[0])); !strings.HasPrefix(dir, tmpPrefix) {
		t.Errorf("restored %s, want a clone, not a cache entry in place", tb.w.restoreDisks[0])
	}

	// The snapshot's entry: the layer after "RUN two".
	var entry string
	es, err := tb.b.cache.entries()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if d, err := readDisk(filepath.Join(tb.cache, e.key, template.SnapshotDisk)); err == nil && len(d.Log) == 3 {
			entry = filepath.Join(tb.cache, e.key)
		}
	}
	if entry == "" {
		t.Fatal("no cache entry with the snapshot after RUN two")
	}

	// A broken snapshot: restore fails, the build boots the layer.
	if err := os.WriteFile(filepath.Join(entry, template.SnapshotState), []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	lines := rebuild(t, "3b")
	if len(tb.w.restores) != 0 || len(tb.w.boots) != 1 {
		t.Errorf("broken snapshot: %d restores, %d boots; want 0 and 1", len(tb.w.restores), len(tb.w.boots))
	}
	if !slicesContain(lines, "could not restore the build VM") {
		t.Errorf("broken snapshot: no progress line about it:\n%s", strings.Join(lines, "\n"))
	}

	// No snapshot (an older entry): boot without trying.
	os.Remove(filepath.Join(entry, template.SnapshotState))
	lines = rebuild(t, "3c")
	if len(tb.w.restores) != 0 || len(tb.w.boots) != 1 || slicesContain(lines, "could not restore") {
		t.Errorf("no snapshot: %d restores, %d boots; want 0 and 1, no restore tried", len(tb.w.restores), len(tb.w.boots))
	}
	// Every file of an entry counts toward the cache's size.
	if es, err = tb.b.cache.entries(); err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		var want int64
		files, _ := os.ReadDir(filepath.Join(tb.cache, e.key))
		for _, f := range files {
			want += allocated(filepath.Join(tb.cache, e.key, f.Name()))
		}
		if e.bytes != want || len(files) < 2 {
			t.Errorf("entry %s: %d bytes counted, its %d files take %d", e.key, e.bytes, len(files), want)
		}
	}
}

// TestCacheScoped: the cache is per scope (the building key). Another
// scope's build of the same Dockerfile reuses nothing — no "cached" line,
// every step run, no snapshot restored, nothing of the first build's in
// its layers — while the first scope's rebuild reuses everything; a build
// differing only in a proxy build arg runs its RUN steps again.
func TestCacheScoped(t *testing.T) {
	tb := newTestBuilder(t)
	tb.b.cfg.Restore = tb.w.restore
	tb.w.snapshots = true
	df := "FROM node@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\nRUN one\nRUN two\n"
	build := func(scope string, args map[string]string) (fakeDisk, Result, string) {
		t.Helper()
		tb.w.reset()
		tb.scope = scope
		d, res, lines, err := tb.build(t, df, "", args)
		if err != nil {
			t.Fatalf("build as %q: %v", scope, err)
		}
		return d, res, strings.Join(lines, "\n")
	}
	_, alice, _ := build("key_alice", nil)

	// Bob: every step runs, from a FROM of his own.
	d, bob, log := build("key_bob", nil)
	if strings.Contains(log, "cached") {
		t.Errorf("another key's build of the same Dockerfile reports cached steps:\n%s", log)
	}
	if got := tb.w.shells(); !reflect.DeepEqual(got, []string{"one", "two"}) || tb.w.froms != 1 || len(tb.w.restores) != 0 {
		t.Errorf("another key's build: ran %q, %d FROM conversions, %d restores; want one, two, 1 and 0", got, tb.w.froms, len(tb.w.restores))
	}
	if want := []string{"from node@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "run one", "run two"}; !reflect.DeepEqual(d.Log, want) {
		t.Errorf("another key's build made %q, want %q", d.Log, want)
	}
	if bob.Digest == alice.Digest {
		t.Errorf("two keys' builds share the final layer %s", bob.Digest)
	}

	// Alice again: everything cached, nothing run.
	_, again, log := build("key_alice", nil)
	if n := strings.Count(log, "  cached"); n != 3 || len(tb.w.runs) != 0 || tb.w.froms != 0 || again.Digest != alice.Digest {
		t.Errorf("the same key's rebuild: %d cached lines, %d runs, %d FROMs, digest %s (was %s); want 3, 0, 0, the same:\n%s",
			n, len(tb.w.runs), tb.w.froms, again.Digest, alice.Digest, log)
	}

	// Alice through a proxy: the FROM is hers, the RUN steps run again.
	_, proxied, log := build("key_alice", map[string]string{"HTTP_PROXY": "http://proxy.example:3128"})
	if got := tb.w.shells(); !reflect.DeepEqual(got, []string{"one", "two"}) || strings.Count(log, "  cached") != 1 || proxied.Digest == alice.Digest {
		t.Errorf("a build differing in HTTP_PROXY: ran %q, log:\n%s\nwant both RUN steps run, only FROM cached", got, log)
	}
	for _, r := range tb.w.runs {
		if r.Env["HTTP_PROXY"] != "http://proxy.example:3128" {
			t.Errorf("RUN %q ran without the proxy: env %v", r.Shell, r.Env)
		}
	}
}

func slicesContain(lines []string, sub string) bool {
	for _, l := range lines {
		if strings.Contains(l, sub) {
			return true
		}
	}
	return false
}

// TestRunNote: a builder whose RUN steps have no network says so once,
// before the first RUN step that runs, and in a failed RUN's error.
func TestRunNote(t *testing.T) {
	w := &fakeWorld{}
	note := "RUN steps have no network here"
	b, err := New(Config{Boot: w.boot, FromImage: w.fromImage, CacheDir: t.TempDir(), TempDir: t.TempDir(), RunNote: note})
	if err != nil {
		t.Fatal(err)
	}
	tb := &testBuild{w: w, b: b}
	_, _, lines, err := tb.build(t, "FROM img\nRUN echo ok\nRUN fetch; exit 6\n", "", nil)
	if !errors.Is(err, ErrRunFailed) {
		t.Fatalf("got %v, want ErrRunFailed", err)
	}
	if !strings.HasSuffix(err.Error(), "\n("+note+")") {
		t.Errorf("error %q does not end with the note", err)
	}
	var said []int
	for i, l := range lines {
		if strings.Contains(l, note) {
			said = append(said, i)
		}
	}
	if len(said) != 1 || said[0] == 0 || lines[said[0]-1] != "step 2/3: RUN echo ok" {
		t.Errorf("progress %q: want the note once, right after the first RUN step's line", lines)
	}
}
