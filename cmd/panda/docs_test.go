package main

// The documentation's examples run, as Go's example tests run the code's:
// TestDocs extracts every block of README.md and docs/*.md marked as
// runnable and runs it against a real `panda up`, one subtest per block
// (named by file and line); TestDocsMarked holds every block in a
// runnable language to a marker, so that no example escapes by being
// forgotten. The markers are HTML comments on the line before a fenced
// block, which GitHub does not render (docs/README.md says the same for
// writers):
//
//	<!-- run -->             run the block (sh, python, js)
//	<!-- output -->          the output of the run block before it: checked
//	<!-- file: NAME -->      save the block as NAME (in the doc's directory;
//	                         ~/NAME in its home) for a later block to use
//	<!-- not run: REASON --> an example the test world cannot run, and why
//	<!-- not run, whole file: REASON -->   anywhere: no block of the file runs
//
// and, for what a reader need not see (rarely: say why next to it),
//
//	<!-- run sh
//	commands
//	-->
//
// runs commands (sh or python) at that point without showing them.
//
// The world: `panda up` as `make up` starts it (base as the default
// template, baked first; --bake-network) on 127.0.0.1:7788 with
// networking on, inside a network namespace of the test whose only
// internet is the test's own (internal/testing/nettest), so that examples
// that reach the network reach only the test's servers. Every block runs
// in that namespace. The blocks of one file run in order in a directory
// of their own that looks like a clone of the repository (its top-level
// entries are links to this one's, bin/panda is the binary under test),
// with a home of their own; /var/lib/pandastack in a block is the test
// server's data directory. As in a terminal:
//
//   - sh blocks run with bash -euo pipefail: each command must succeed, and
//     an error of the API in the output (curl -s does not fail on one)
//     fails the block unless its output block shows it. The blocks of a
//     file are one session: the variables a block sets and the directory
//     it changes to carry over to the next; standard input is empty. PANDA_DATA_DIR is the
//     server's, so the CLI finds the admin key as on the server's machine;
//     PANDASTACK_API_KEY and _URL are what the blocks export. A block whose
//     lines start with "$ " is a transcript: each such line is a command,
//     the lines after it its output (checked); a command must succeed,
//     unless its shown output is an error of panda's ("panda: ...").
//   - python blocks of a file run in one interpreter (as a doctest's share
//     their globals), started at the file's first python block with the
//     variables the sh blocks exported so far; sdk/python/src is on its
//     path, as `PYTHONPATH=sdk/python/src` gives it.
//   - js blocks run with node as ES modules, with the e2b SDK that make
//     e2b-deps installs (e2e/e2b/node_modules).
//
// An output block is checked line by line: each of its lines must appear
// in the output in that order (other lines may come between), compared
// with runs of blanks as one, numbers as 0, ids and keys (runs of 16 or
// more letters, digits, - and _ with a digit among them) as one token, and
// "..." (or "…") matching anything.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/nettest"
	"github.com/pandastack/pandastack/internal/testing/pandatest"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// docBlock is a fenced block of a document, or a hidden one.
type docBlock struct {
	file string // relative to the repository: README.md, docs/cli.md
	line int    // of the opening fence (of the comment, for a hidden block)
	lang string // the info string's first word: sh, python, js, ...
	text string
	mark string // run, output, file, not run, hidden; "" for none
	arg  string // file: the name; not run: the reason
	want *docBlock
}

func (b *docBlock) name() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

// runnableLangs are the info strings of blocks that must be marked.
var runnableLangs = map[string]string{
	"sh": "sh", "bash": "sh", "shell": "sh", "console": "sh",
	"python": "python", "py": "python",
	"js": "js", "javascript": "js", "mjs": "js",
	"go": "go",
}

var (
	fenceRE     = regexp.MustCompile("^(\\s*)(```+|~~~+)\\s*([^\\s`]*)")
	markRE      = regexp.MustCompile(`^\s*<!--\s*(run|output|file:\s*(\S+)|not run:\s*(.+?))\s*-->\s*$`)
	hiddenRE    = regexp.MustCompile(`^\s*<!--\s*run\s+(sh|python)\s*$`)
	wholeFileRE = regexp.MustCompile(`<!--\s*not run, whole file:\s*(.+?)\s*-->`)
	anyMarkRE   = regexp.MustCompile(`^\s*<!--\s*(run|output|file|not run)\b`)
)

// parseDoc reads the blocks of the document file (a path relative to
// root). Misplaced markers are errors.
func parseDoc(root, file string) (blocks []*docBlock, wholeFile string, errs []string) {
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		return nil, "", []string{err.Error()}
	}
	lines := strings.Split(string(b), "\n")
	if m := wholeFileRE.FindStringSubmatch(string(b)); m != nil {
		wholeFile = m[1]
	}
	var last *docBlock // the last run block, for an output block
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if m := hiddenRE.FindStringSubmatch(line); m != nil {
			end := i + 1
			for end < len(lines) && strings.TrimSpace(lines[end]) != "-->" {
				end++
			}
			if end == len(lines) {
				errs = append(errs, fmt.Sprintf("%s:%d: a hidden block without its closing -->", file, i+1))
				break
			}
			blk := &docBlock{file: file, line: i + 1, lang: m[1], mark: "hidden", text: strings.Join(lines[i+1:end], "\n") + "\n"}
			blocks = append(blocks, blk)
			i = end
			continue
		}
		m := fenceRE.FindStringSubmatch(line)
		if m == nil {
			if wholeFileRE.MatchString(line) {
				continue
			}
			if anyMarkRE.MatchString(line) && !markRE.MatchString(line) {
				errs = append(errs, fmt.Sprintf("%s:%d: a malformed marker: %s", file, i+1, strings.TrimSpace(line)))
			} else if markRE.MatchString(line) && (i+1 >= len(lines) || fenceRE.FindString(lines[i+1]) == "") {
				errs = append(errs, fmt.Sprintf("%s:%d: a marker not on the line before a fence", file, i+1))
			}
			continue
		}
		indent, fence, info := m[1], m[2], m[3]
		end := i + 1
		for end < len(lines) {
			t := strings.TrimLeft(lines[end], " \t")
			if strings.HasPrefix(t, fence) && strings.TrimSpace(strings.TrimLeft(t, fence[:1])) == "" {
				break
			}
			end++
		}
		var body []string
		for _, l := range lines[i+1 : min(end, len(lines))] {
			body = append(body, strings.TrimPrefix(l, indent))
		}
		blk := &docBlock{file: file, line: i + 1, lang: strings.ToLower(info), text: strings.Join(body, "\n") + "\n"}
		if i > 0 {
			if mm := markRE.FindStringSubmatch(lines[i-1]); mm != nil {
				switch {
				case mm[1] == "run" || mm[1] == "output":
					blk.mark = mm[1]
				case mm[2] != "":
					blk.mark, blk.arg = "file", mm[2]
				default:
					blk.mark, blk.arg = "not run", mm[3]
				}
			}
		}
		switch blk.mark {
		case "run":
			if runnableLangs[blk.lang] == "" || runnableLangs[blk.lang] == "go" {
				errs = append(errs, fmt.Sprintf("%s: <!-- run --> on a %q block: sh, python and js blocks run (Go: a file: block built by a sh block)", blk.name(), blk.lang))
			}
			last = blk
		case "output":
			if last == nil || last.want != nil {
				errs = append(errs, fmt.Sprintf("%s: <!-- output --> not after a run block", blk.name()))
			} else {
				last.want = blk
			}
		case "":
			if runnableLangs[blk.lang] != "" && wholeFile == "" {
				errs = append(errs, fmt.Sprintf("%s: a %s block without a marker: <!-- run -->, <!-- file: NAME --> or <!-- not run: REASON --> on the line before it (cmd/panda/docs_test.go)", blk.name(), blk.lang))
			}
		}
		if blk.mark != "output" && blk.mark != "run" {
			last = nil
		}
		blocks = append(blocks, blk)
		i = end
	}
	return blocks, wholeFile, errs
}

// docFiles are the documents whose examples run: README.md and docs/*.md.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		out = append(out, rel)
	}
	return out
}

// repoRoot is the repository this test is in.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("the repository's root: %v", err)
	}
	return root
}

// TestDocsMarked: every sh, python, js and go block of the documentation
// says whether it runs, and every marker is where it belongs. Needs no
// server: it answers in -short runs too.
func TestDocsMarked(t *testing.T) {
	root := repoRoot(t)
	n := map[string]int{}
	for _, f := range docFiles(t, root) {
		blocks, _, errs := parseDoc(root, f)
		for _, e := range errs {
			t.Error(e)
		}
		for _, b := range blocks {
			n[b.mark]++
			if b.mark == "not run" && len(strings.Fields(b.arg)) < 2 {
				t.Errorf("%s: <!-- not run: %s -->: say why it cannot run", b.name(), b.arg)
			}
		}
	}
	if n["run"] == 0 {
		t.Error("no block of the documentation is marked to run")
	}
	t.Logf("blocks: %d run, %d output, %d file, %d hidden, %d not run", n["run"], n["output"], n["file"], n["hidden"], n["not run"])
}

// TestOutputMatches holds the output check to its rules.
func TestOutputMatches(t *testing.T) {
	// An id of letters alone (1 in 700 are) is an id too.
	if a, b := normalizeLine("0 hello from aoeftpubmojrzjicbchm"), normalizeLine("0 hello from k3v9q2m8x7c1b5n4z6a0"); a != b {
		t.Errorf("a sandbox id without digits: %q, want %q", a, b)
	}
	got := "ID                    TEMPLATE  STATE\nk3v9q2m8x7c1b5n4z6a0  tiny      running  in 4m56s\nsomething else\nexit status 3\nhttp://127.0.0.1:7788/p/AQAAAABp-9fkH0AU_m9ha3k2djNnZjl3Z2R6OWNzMzn0XkGyYBwE8Yg6aXUOJ7Dn/\n"
	for _, tc := range []struct {
		want string
		ok   bool
	}{
		{"ID TEMPLATE STATE\n", true},
		{"roaky6v3gf9wgdz9cs39  tiny  running  in 4m59s\n", true},
		{"ID TEMPLATE STATE\nexit status 3\n", true},
		{"exit status 3\nID TEMPLATE STATE\n", false},
		{"exit status 4\n", true}, // numbers are 0
		{"exit code 3\n", false},
		{"k3v9q2m8x7c1b5n4z6a0 ... running ...\n", true},
		{"k3v9q2m8x7c1b5n4z6a0 base running\n", false},
		{"...\nsomething else\n", true},
		{"http://x/p/AQAAAABpK9fkH0AUcm9ha3k2djNnZjl3Z2R6OWNzMzn0XkGyYBwE8Yg6aXUOJ7Dn/\n", false},
		{"http://127.0.0.1:7788/p/AQAAAABpK9fkH0AUcm9ha3k2djNnZjl3Z2R6OWNzMzn0XkGyYBwE8Yg6aXUOJ7Dn/\n", true},
	} {
		if err := outputMatches(got, tc.want); (err == nil) != tc.ok {
			t.Errorf("want %q: %v, want ok %v", tc.want, err, tc.ok)
		}
	}
}

var (
	idRE = regexp.MustCompile(`[A-Za-z0-9_-]{16,}`)
	// sandboxIDRE is an id of a sandbox or snapshot: one may be letters
	// alone (1 in 700 are), which idRE's rule of a digit would miss.
	sandboxIDRE = regexp.MustCompile(`^[a-z0-9]{20}$`)
	numberRE    = regexp.MustCompile(`[0-9]+(\.[0-9]+)?`)
	blanksRE    = regexp.MustCompile(`\s+`)
)

// normalizeLine is a line as outputMatches compares it.
func normalizeLine(s string) string {
	s = strings.TrimSpace(blanksRE.ReplaceAllString(s, " "))
	s = idRE.ReplaceAllStringFunc(s, func(w string) string {
		if strings.ContainsAny(w, "0123456789") || sandboxIDRE.MatchString(w) {
			return "<id>"
		}
		return w
	})
	return numberRE.ReplaceAllString(s, "0")
}

// outputMatches checks got against want, an output block: see the
// package comment at the top of the file.
func outputMatches(got, want string) error {
	var lines []string
	for _, l := range strings.Split(got, "\n") {
		lines = append(lines, normalizeLine(l))
	}
	i := 0
	for _, w := range strings.Split(want, "\n") {
		w = normalizeLine(w)
		if w == "" || w == "..." || w == "…" {
			continue
		}
		pat := regexp.QuoteMeta(w)
		pat = strings.NewReplacer(`\.\.\.`, ".*", "…", ".*").Replace(pat)
		re := regexp.MustCompile("^" + pat + "$")
		for i < len(lines) && !re.MatchString(lines[i]) {
			i++
		}
		if i == len(lines) {
			return fmt.Errorf("the output lacks the line %q (or has it before the lines above it)", w)
		}
		i++
	}
	return nil
}

// docWorld is the server and what every document's blocks share.
type docWorld struct {
	root    string
	netns   string // the server's network namespace (a path)
	dataDir string
	bin     string // a directory holding panda
	env     []string
	c       *pandastack.Client
}

// docSession runs the blocks of one document, in order.
type docSession struct {
	w     *docWorld
	file  string
	dir   string // the clone-like directory the blocks start in
	home  string
	state string // the sh blocks' variables and directory
	py    *pySession
}

// TestDocs runs the documentation's runnable blocks: see the top of this
// file.
func TestDocs(t *testing.T) {
	e2e(t)
	root := repoRoot(t)
	type doc struct {
		file   string
		blocks []*docBlock
	}
	var docs []doc
	for _, f := range docFiles(t, root) {
		blocks, whole, errs := parseDoc(root, f)
		if len(errs) > 0 {
			t.Fatalf("%s: %s (see TestDocsMarked)", f, strings.Join(errs, "; "))
		}
		if whole != "" {
			continue
		}
		if slices.ContainsFunc(blocks, func(b *docBlock) bool { return b.mark == "run" || b.mark == "hidden" }) {
			docs = append(docs, doc{f, blocks})
		}
	}
	e2bModules := filepath.Join(root, "e2e", "e2b", "node_modules", "e2b")
	if _, err := os.Stat(e2bModules); err != nil {
		t.Fatalf("the e2b SDK for the JavaScript examples is missing (run make e2b-deps): %v", err)
	}

	w := newDocWorld(t, root)
	for _, d := range docs {
		d := d
		t.Run(d.file, func(t *testing.T) {
			s := w.session(t, d.file)
			failed := ""
			for _, b := range d.blocks {
				if b.mark != "run" && b.mark != "hidden" && b.mark != "file" {
					continue
				}
				if failed != "" {
					t.Logf("%s: not run: %s failed before it", b.name(), failed)
					continue
				}
				ok := t.Run(fmt.Sprintf("%d", b.line), func(t *testing.T) { s.run(t, b) })
				if !ok {
					failed = b.name()
				}
			}
			w.cleanUp(t)
		})
	}
}

// newDocWorld starts the server of the documentation's examples.
func newDocWorld(t *testing.T, root string) *docWorld {
	t.Helper()
	env := nettest.NewEnv(t)
	dataDir := newDataDir(t)
	prefix := "p" + strings.TrimPrefix(env.Prefix, "nt")
	// As make up runs it: the default template base, baked first, and
	// bakes with the network; on the address the documents name.
	opts := pandatest.Options{DataDir: dataDir, Addr: "127.0.0.1:7788", NetNS: env.Host.Path, Args: []string{
		"--network", "on", "--network-prefix", prefix, "--dns-upstream", nettest.DNSAddr.String(),
		"--bake", "--bake-network"}}
	p := start(t, "up", opts)
	hc, err := p.HTTPClient()
	if err != nil {
		t.Fatal(err)
	}
	c, err := pandastack.NewClient(pandastack.Options{APIURL: p.URL(), APIKey: p.AdminKey(), HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	w := &docWorld{root: root, netns: env.Host.Path, dataDir: dataDir, c: c}

	// bin/panda of the clone-like directories: the binary under test.
	w.bin = t.TempDir()
	bin, err := pandatest.Binary()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bin, filepath.Join(w.bin, "panda")); err != nil {
		t.Fatal(err)
	}
	// The Go toolchain's caches stay the machine's (a block's HOME is its
	// own), and it fetches nothing: the test world has no proxy.
	goEnv, err := exec.Command("go", "env", "GOPATH", "GOMODCACHE", "GOCACHE").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	gv := strings.Split(strings.TrimSpace(string(goEnv)), "\n")
	if len(gv) != 3 {
		t.Fatalf("go env: %q", goEnv)
	}
	path := w.bin
	// python3 where the machine keeps it (a shim that needs the real HOME
	// would not find it in a block's).
	if py, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output(); err == nil {
		path += ":" + filepath.Dir(strings.TrimSpace(string(py)))
	}
	path += ":" + os.Getenv("PATH")
	w.env = []string{
		"PATH=" + path, "LANG=C.UTF-8", "TERM=dumb",
		"PANDA_DATA_DIR=" + dataDir,
		"GOPATH=" + gv[0], "GOMODCACHE=" + gv[1], "GOCACHE=" + gv[2],
		"GOPROXY=off", "GOSUMDB=off", "GOFLAGS=", "GOTOOLCHAIN=local",
	}
	return w
}

// session makes the directories of one document's blocks.
func (w *docWorld) session(t *testing.T, file string) *docSession {
	t.Helper()
	base := t.TempDir()
	s := &docSession{w: w, file: file, dir: filepath.Join(base, "pandastack"), home: filepath.Join(base, "home"), state: filepath.Join(base, "state.sh")}
	for _, d := range []string{s.dir, s.home, filepath.Join(s.dir, "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ents, err := os.ReadDir(w.root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == "bin" || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if err := os.Symlink(filepath.Join(w.root, e.Name()), filepath.Join(s.dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(w.bin, "panda"), filepath.Join(s.dir, "bin", "panda")); err != nil {
		t.Fatal(err)
	}
	// node finds the e2b SDK of e2e/e2b from the blocks' files.
	if err := os.Symlink(filepath.Join(w.root, "e2e", "e2b", "node_modules"), filepath.Join(s.dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s.py != nil {
			s.py.close()
		}
	})
	return s
}

// environ is the environment of a block's processes.
func (s *docSession) environ() []string {
	return append(slices.Clone(s.w.env), "HOME="+s.home, "USER=root", "SHELL=/bin/bash")
}

// subst is a block's text as it runs in the test world.
func (s *docSession) subst(text string) string {
	return strings.ReplaceAll(text, "/var/lib/pandastack", s.w.dataDir)
}

// blockTimeout bounds one block: a hung example fails, not the suite's
// timeout.
const blockTimeout = 4 * time.Minute

func (s *docSession) run(t *testing.T, b *docBlock) {
	ctx, cancel := context.WithTimeout(context.Background(), blockTimeout)
	defer cancel()
	var out string
	var err error
	switch {
	case b.mark == "file":
		name := b.arg
		if rest, ok := strings.CutPrefix(name, "~/"); ok {
			name = filepath.Join(s.home, rest)
		} else {
			name = filepath.Join(s.dir, name)
		}
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, []byte(s.subst(b.text)), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	case runnableLangs[b.lang] == "sh" && transcript(b.text):
		s.runTranscript(ctx, t, b)
		return
	case runnableLangs[b.lang] == "sh":
		out, err = s.sh(ctx, b.text, b.name())
	case runnableLangs[b.lang] == "python":
		out, err = s.python(ctx, t, b)
	case runnableLangs[b.lang] == "js":
		out, err = s.js(ctx, b)
	default:
		t.Fatalf("%s: cannot run a %q block", b.name(), b.lang)
	}
	if err != nil {
		t.Fatalf("%s: %v\n%s", b.name(), err, out)
	}
	// curl -s exits 0 on an error answer: the API's error body is the
	// failure, unless the document shows it.
	if strings.Contains(out, `{"error":{"code":`) && (b.want == nil || !strings.Contains(b.want.text, `"error"`)) {
		t.Fatalf("%s: an API error in its output:\n%s", b.name(), out)
	}
	if b.want != nil {
		if err := outputMatches(out, b.want.text); err != nil {
			t.Errorf("%s: %v; its output (checked against %s):\n%s", b.name(), err, b.want.name(), out)
		}
	}
	t.Logf("%s: output:\n%s", b.name(), out)
}

// command runs argv in the server's network namespace, in the session's
// directory and environment, in a process group of its own (killed with
// what it left running when it ends), and returns its output (stdout and
// stderr interleaved).
func (s *docSession) command(ctx context.Context, stdin io.Reader, argv ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + s.w.netns, "--"}, argv...)...)
	cmd.Dir = s.dir
	cmd.Env = s.environ()
	cmd.Stdin = stdin
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Start()
	if err == nil {
		err = cmd.Wait()
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if ctx.Err() != nil {
		err = fmt.Errorf("did not finish within %s", blockTimeout)
	}
	return out.String(), err
}

// shPrologue and shEpilogue surround every sh block: the state of the
// blocks before it in, its own out.
const shPrologue = `__docs_save() {
	local __v __d __f
	for __v in $(compgen -v); do
		case $__v in
		BASH*|COMP*|DIRSTACK|EPOCH*|EUID|FUNCNAME|GROUPS|HIST*|HOSTNAME|HOSTTYPE|IFS|LINENO|LINES|COLUMNS|MACHTYPE|OLDPWD|OPT*|OSTYPE|PIPESTATUS|PPID|PS[0-9]|PWD|RANDOM|SECONDS|SHELLOPTS|SHLVL|SRANDOM|UID|_|__*) continue ;;
		esac
		__d=$(declare -p "$__v" 2>/dev/null) || continue
		__f=${__d#declare }
		case ${__f%% *} in *r*) continue ;; esac
		printf '%s\n' "$__d"
	done
	printf 'cd %q\n' "$PWD"
}
if [ -f "$DOCS_STATE" ]; then source "$DOCS_STATE"; fi
set -euo pipefail
`

const shEpilogue = `
set +euo pipefail
__docs_save > "$DOCS_STATE.new" && mv "$DOCS_STATE.new" "$DOCS_STATE"
`

// sh runs text as the next command lines of the document's session, from
// a file: its commands' standard input is empty, as in a terminal where
// nobody types (panda shell gets an end of input).
func (s *docSession) sh(ctx context.Context, text, name string) (string, error) {
	script := s.state + ".block.sh"
	if err := os.WriteFile(script, []byte(shPrologue+"# "+name+"\n"+s.subst(text)+shEpilogue), 0o644); err != nil {
		return "", err
	}
	return s.command(ctx, nil, "env", "DOCS_STATE="+s.state, "bash", script)
}

// transcript reports whether a sh block is a terminal's transcript: lines
// starting with "$ " are its commands.
func transcript(text string) bool {
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "$ ") {
			return true
		}
	}
	return false
}

// transcriptCmd is a command of a transcript and the output shown.
type transcriptCmd struct {
	cmd, want string
}

func parseTranscript(text string) []transcriptCmd {
	var cmds []transcriptCmd
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if c, ok := strings.CutPrefix(l, "$ "); ok {
			for strings.HasSuffix(c, "\\") && i+1 < len(lines) {
				i++
				c += "\n" + lines[i]
			}
			cmds = append(cmds, transcriptCmd{cmd: c})
			continue
		}
		if len(cmds) > 0 {
			cmds[len(cmds)-1].want += l + "\n"
		}
	}
	return cmds
}

var statusRE = regexp.MustCompile(`(?m)^@@docs (\d+) status (\d+)@@\n?`)

// runTranscript runs a transcript's commands in the session, each with
// its status and output checked.
func (s *docSession) runTranscript(ctx context.Context, t *testing.T, b *docBlock) {
	cmds := parseTranscript(b.text)
	var script strings.Builder
	for i, c := range cmds {
		fmt.Fprintf(&script, "if %s\nthen __s=0; else __s=$?; fi; echo \"@@docs %d status $__s@@\"\n", c.cmd, i)
	}
	out, err := s.sh(ctx, script.String(), b.name())
	if err != nil {
		t.Fatalf("%s: %v\n%s", b.name(), err, out)
	}
	t.Logf("%s: output:\n%s", b.name(), out)
	rest := out
	for i, c := range cmds {
		loc := statusRE.FindStringSubmatchIndex(rest)
		if loc == nil || rest[loc[2]:loc[3]] != fmt.Sprint(i) {
			t.Fatalf("%s: $ %s: did not finish", b.name(), c.cmd)
		}
		got, status := rest[:loc[0]], rest[loc[4]:loc[5]]
		rest = rest[loc[1]:]
		wantFail := strings.HasPrefix(strings.TrimSpace(c.want), "panda: ")
		switch {
		case wantFail && status == "0":
			t.Errorf("%s: $ %s: succeeded, but the document shows an error:\n%s", b.name(), c.cmd, got)
		case !wantFail && status != "0":
			t.Errorf("%s: $ %s: exit status %s:\n%s", b.name(), c.cmd, status, got)
		}
		if err := outputMatches(got, c.want); err != nil {
			t.Errorf("%s: $ %s: %v; its output:\n%s", b.name(), c.cmd, err, got)
		}
	}
}

// js runs a block with node, as an ES module in the session's directory.
func (s *docSession) js(ctx context.Context, b *docBlock) (string, error) {
	f := filepath.Join(s.dir, fmt.Sprintf(".block-%d.mjs", b.line))
	if err := os.WriteFile(f, []byte(s.subst(b.text)), 0o644); err != nil {
		return "", err
	}
	return s.command(ctx, nil, "node", f)
}

// exported are the variables the session's sh blocks exported so far.
func (s *docSession) exported(ctx context.Context) ([]string, error) {
	out, err := s.command(ctx, strings.NewReader(`if [ -f "$DOCS_STATE" ]; then source "$DOCS_STATE"; fi; env -0`), "env", "DOCS_STATE="+s.state, "bash", "-s")
	if err != nil {
		return nil, fmt.Errorf("read the session's environment: %v: %s", err, out)
	}
	var env []string
	for _, kv := range strings.Split(out, "\x00") {
		if kv != "" && !strings.HasPrefix(kv, "DOCS_STATE=") && !strings.HasPrefix(kv, "_=") && !strings.HasPrefix(kv, "SHLVL=") {
			env = append(env, kv)
		}
	}
	return env, nil
}

// pyDriver runs the python blocks of a document in one interpreter: a
// request per line on stdin, an answer per line on descriptor 3 (so that
// what a block's subprocesses write cannot be taken for one).
const pyDriver = `import contextlib, io, json, os, sys, traceback
answers = os.fdopen(3, "w")
scope = {"__name__": "__main__"}
for line in sys.stdin:
    req = json.loads(line)
    out = io.StringIO()
    error = ""
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            exec(compile(req["code"], req["name"], "exec"), scope)
    except BaseException:
        error = traceback.format_exc()
    answers.write(json.dumps({"out": out.getvalue(), "error": error}) + "\n")
    answers.flush()
`

// pySession is a document's python interpreter.
type pySession struct {
	cmd     *exec.Cmd
	in      io.WriteCloser
	answers *bufio.Reader
	stderr  bytes.Buffer
}

func (s *docSession) python(ctx context.Context, t *testing.T, b *docBlock) (string, error) {
	if s.py == nil {
		env, err := s.exported(ctx)
		if err != nil {
			return "", err
		}
		py := &pySession{}
		cmd := exec.Command("nsenter", "--net="+s.w.netns, "--", "python3", "-u", "-c", pyDriver)
		cmd.Dir = s.dir
		cmd.Env = append(env, "PYTHONPATH="+filepath.Join(s.dir, "sdk", "python", "src"))
		cmd.Stderr = &py.stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		r, w, err := os.Pipe()
		if err != nil {
			return "", err
		}
		cmd.ExtraFiles = []*os.File{w}
		if py.in, err = cmd.StdinPipe(); err != nil {
			return "", err
		}
		if err := cmd.Start(); err != nil {
			return "", err
		}
		w.Close()
		py.cmd, py.answers = cmd, bufio.NewReader(r)
		s.py = py
	}
	req, _ := json.Marshal(map[string]string{"code": s.subst(b.text), "name": b.name()})
	if _, err := s.py.in.Write(append(req, '\n')); err != nil {
		return "", fmt.Errorf("the python session: %v: %s", err, s.py.stderr.String())
	}
	type answer struct {
		Out   string `json:"out"`
		Error string `json:"error"`
	}
	done := make(chan error, 1)
	var a answer
	go func() {
		line, err := s.py.answers.ReadBytes('\n')
		if err == nil {
			err = json.Unmarshal(line, &a)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			return "", fmt.Errorf("the python session ended: %v: %s", err, s.py.stderr.String())
		}
	case <-ctx.Done():
		s.py.close() // the block hangs: the session is lost
		s.py = nil
		<-done
		return a.Out, fmt.Errorf("did not finish within %s", blockTimeout)
	}
	if a.Error != "" {
		return a.Out, errors.New(a.Error)
	}
	return a.Out, nil
}

func (p *pySession) close() {
	p.in.Close()
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.cmd.Wait()
}

// cleanUp kills what a document's blocks left running (sandboxes of the
// admin key), so that the next document starts with the host's memory.
func (w *docWorld) cleanUp(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	list, err := w.c.List(ctx, pandastack.ListOptions{}) // all but stopped ones
	if err != nil {
		t.Errorf("list what the document left: %v", err)
		return
	}
	for _, sb := range list {
		if err := sb.Kill(ctx); err != nil && !errors.Is(err, pandastack.ErrNotFound) {
			t.Errorf("kill %s, left by the document: %v", sb.ID, err)
		}
	}
}

var (
	mdLinkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdNameRE = regexp.MustCompile("(?:^|[\\s(`\"])((?:[\\w.-]+/)*[\\w.-]+\\.md)\\b")
)

// TestDocsReferences: every relative link of the documentation leads to
// a file of the repository, and every file name "NAME.md" it mentions is
// one of the repository's (fork.md cited a DESIGN.md it does not have).
func TestDocsReferences(t *testing.T) {
	root := repoRoot(t)
	var mdFiles []string // every .md of the repository, relative to it
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".") && p != root) {
			return filepath.SkipDir
		}
		if strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			mdFiles = append(mdFiles, rel)
		}
		return nil
	})
	for _, f := range docFiles(t, root) {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Dir(filepath.Join(root, f))
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range mdLinkRE.FindAllStringSubmatch(line, -1) {
				target, _, _ := strings.Cut(m[1], "#")
				if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				if _, err := os.Stat(filepath.Join(dir, target)); err != nil {
					t.Errorf("%s:%d: a link to %s, which does not exist", f, i+1, m[1])
				}
			}
			for _, m := range mdNameRE.FindAllStringSubmatch(line, -1) {
				name := m[1]
				_, err := os.Stat(filepath.Join(dir, name))
				found := err == nil || slices.ContainsFunc(mdFiles, func(p string) bool { return p == name || strings.HasSuffix(p, "/"+name) })
				if !found {
					t.Errorf("%s:%d: mentions %s, which the repository does not have", f, i+1, name)
				}
			}
		}
	}
}

// TestDocsWorldIsMakeUp: the documents' examples run against panda up as
// `make up` starts it (docs/README.md says so): its recipe still has the
// flags TestDocs gives.
func TestDocsWorldIsMakeUp(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	_, recipe, ok := strings.Cut(string(b), "\nup: ")
	recipe, _, _ = strings.Cut(recipe, "\n\n")
	if !ok || !strings.Contains(recipe, "bin/panda up ") {
		t.Fatalf("no up target running bin/panda up in the Makefile")
	}
	for _, flag := range []string{"--bake ", "--bake-network"} {
		if !strings.Contains(recipe+" ", flag) {
			t.Errorf("make up runs without %s, which TestDocs's world has:\n%s", strings.TrimSpace(flag), recipe)
		}
	}
}
