package dockerfile

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/template"
)

// The fake VM's disk is a JSON file: the guest's files and a log of the
// commands that changed it, so that a layer's content says which steps
// made it.
type fakeDisk struct {
	Files map[string]fakeFile `json:"files"`
	Log   []string            `json:"log"`
}

type fakeFile struct {
	Dir   bool   `json:"dir,omitempty"`
	Mode  int64  `json:"mode"`
	Data  string `json:"data,omitempty"`
	Link  string `json:"link,omitempty"`
	Owner string `json:"owner,omitempty"`
}

// fakeWorld is the fake host: it boots fake VMs and records what they did.
type fakeWorld struct {
	mu       sync.Mutex
	boots    []fakeDisk // the disks booted, as they were at boot
	disks    []string   // their paths
	runs     []guestproto.ExecRequest
	chowns   []string
	commits  int
	froms    int
	digest   string
	failBoot bool
	// snapshots makes Commit write a snapshot; restores are the disks
	// restored (as they were), restoreDisks their paths.
	snapshots    bool
	restores     []fakeDisk
	restoreDisks []string
}

func readDisk(p string) (fakeDisk, error) {
	var d fakeDisk
	b, err := os.ReadFile(p)
	if err != nil {
		return d, err
	}
	err = json.Unmarshal(b, &d)
	return d, err
}

func writeDisk(p string, d fakeDisk) error {
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	return os.WriteFile(p, b, 0o644)
}

func (w *fakeWorld) fromImage(ctx context.Context, ref, out string, progress func(string)) (Result, error) {
	w.mu.Lock()
	w.froms++
	dg := w.digest
	w.mu.Unlock()
	if dg == "" {
		dg = "sha256:base"
	}
	progress("pulling " + ref)
	d := fakeDisk{Files: map[string]fakeFile{"/bin/sh": {Mode: 0o755, Data: "sh"}, "/etc": {Dir: true, Mode: 0o755}}, Log: []string{"from " + ref}}
	if err := writeDisk(out, d); err != nil {
		return Result{}, err
	}
	return Result{Image: templates.ImageConfig{Env: []string{"PATH=/usr/bin:/bin", "LANG=C"}, Cmd: []string{"sh"}}, Digest: dg}, nil
}

func (w *fakeWorld) boot(ctx context.Context, disk string, progress func(string)) (VM, error) {
	if w.failBoot {
		return nil, fmt.Errorf("no VMs here")
	}
	d, err := readDisk(disk)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.boots = append(w.boots, d)
	w.disks = append(w.disks, disk)
	w.mu.Unlock()
	return &fakeVM{w: w, d: d}, nil
}

type fakeVM struct {
	w *fakeWorld
	d fakeDisk
}

var exitRE = regexp.MustCompile(`exit (\d+)`)

func (v *fakeVM) Run(ctx context.Context, req guestproto.ExecRequest, out io.Writer) (int, error) {
	v.w.mu.Lock()
	v.w.runs = append(v.w.runs, req)
	v.w.mu.Unlock()
	switch {
	case len(req.Argv) == 3 && req.Argv[0] == "mkdir":
		if _, ok := v.d.Files[req.Argv[2]]; !ok {
			v.d.Files[req.Argv[2]] = fakeFile{Dir: true, Mode: 0o755}
		}
		return 0, nil
	case len(req.Argv) == 5 && req.Argv[2] == mkdirScript:
		v.d.Files[req.Argv[4]] = fakeFile{Dir: true, Mode: 0o755, Owner: req.Env["USERSPEC"]}
		return 0, nil
	case len(req.Argv) == 5 && strings.HasPrefix(req.Argv[2], "test -d"):
		if f, ok := v.d.Files[req.Argv[4]]; ok && f.Dir {
			return 0, nil
		}
		return 1, nil
	}
	cmd := req.Shell
	if cmd == "" {
		cmd = strings.Join(req.Argv, " ")
	}
	v.d.Log = append(v.d.Log, "run "+cmd)
	if strings.Contains(cmd, "many-lines") {
		for i := 1; i <= 30; i++ {
			fmt.Fprintf(out, "line %d\n", i)
		}
	}
	fmt.Fprintf(out, "ran %s", cmd)
	if m := exitRE.FindStringSubmatch(cmd); m != nil {
		n, _ := strconv.Atoi(m[1])
		return n, nil
	}
	return 0, nil
}

func (v *fakeVM) Extract(ctx context.Context, r io.Reader, chown string) error {
	v.w.mu.Lock()
	v.w.chowns = append(v.w.chowns, chown)
	v.w.mu.Unlock()
	tr := tar.NewReader(r)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if strings.HasPrefix(h.Name, "/") {
			return fmt.Errorf("absolute name %s", h.Name)
		}
		p := "/" + strings.TrimSuffix(h.Name, "/")
		names = append(names, p)
		owner := chown
		if owner == "" && h.Uid != 0 {
			owner = strconv.Itoa(h.Uid)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if _, ok := v.d.Files[p]; !ok {
				v.d.Files[p] = fakeFile{Dir: true, Mode: h.Mode, Owner: owner}
			}
		case tar.TypeSymlink:
			v.d.Files[p] = fakeFile{Link: h.Linkname, Owner: owner}
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				return err
			}
			v.d.Files[p] = fakeFile{Mode: h.Mode, Data: string(b), Owner: owner}
		case tar.TypeLink:
			v.d.Files[p] = v.d.Files["/"+h.Linkname]
		default:
			return fmt.Errorf("unexpected type %c", h.Typeflag)
		}
	}
	v.d.Log = append(v.d.Log, "extract "+strings.Join(names, " "))
	return nil
}

func (v *fakeVM) Commit(ctx context.Context, dst string) error {
	v.w.mu.Lock()
	v.w.commits++
	snap := v.w.snapshots
	v.w.mu.Unlock()
	if err := writeDisk(dst, v.d); err != nil {
		return err
	}
	if !snap {
		return nil
	}
	dir := filepath.Dir(dst)
	if err := writeDisk(filepath.Join(dir, template.SnapshotDisk), v.d); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, template.SnapshotMem), []byte("mem"), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, template.SnapshotState), []byte("state"), 0o644)
}

// restore restores a fake VM from a snapshot whose state reads "state".
func (w *fakeWorld) restore(ctx context.Context, disk, mem, state string, progress func(string)) (VM, error) {
	if b, err := os.ReadFile(state); err != nil || string(b) != "state" {
		return nil, fmt.Errorf("bad state %q: %v", b, err)
	}
	if b, err := os.ReadFile(mem); err != nil || string(b) != "mem" {
		return nil, fmt.Errorf("bad memory %q: %v", b, err)
	}
	d, err := readDisk(disk)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.restores = append(w.restores, d)
	w.restoreDisks = append(w.restoreDisks, disk)
	w.mu.Unlock()
	return &fakeVM{w: w, d: d}, nil
}

func (v *fakeVM) Close() error { return nil }

// tentry is an entry of a test tar.
type tentry struct {
	name string
	typ  byte
	body string
	mode int64
	link string
}

func tfile(name, body string) tentry {
	return tentry{name: name, typ: tar.TypeReg, body: body, mode: 0o644}
}
func tdir(name string) tentry      { return tentry{name: name, typ: tar.TypeDir, mode: 0o755} }
func tlink(name, to string) tentry { return tentry{name: name, typ: tar.TypeSymlink, link: to} }

func tarBytes(t testing.TB, es ...tentry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Size: int64(len(e.body))}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func writeTarFile(t testing.TB, es ...tentry) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "context.tar")
	if err := os.WriteFile(p, tarBytes(t, es...), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// tarNames lists a tar stream's entries as "name mode" ("name -> target"
// for symlinks).
func tarNames(t *testing.T, b []byte) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		s := fmt.Sprintf("%s %o", h.Name, h.Mode)
		if h.Typeflag == tar.TypeSymlink {
			s = h.Name + " -> " + h.Linkname
		}
		if h.Typeflag == tar.TypeReg {
			body, _ := io.ReadAll(tr)
			s += " " + string(body)
		}
		out = append(out, s)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
