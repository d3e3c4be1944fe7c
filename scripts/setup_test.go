// Package scripts holds the tests of the shell scripts in this directory.
// They run the scripts as `make` does, in `go test ./...`, so that CI
// exercises what only a fresh machine would otherwise run.
package scripts

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// guestModules is setup.sh's GUEST_MODULES: what the guest needs loaded.
var guestModules = []string{"virtio", "virtio_ring", "virtio_mmio", "virtio_blk", "virtio_console", "virtio_net"}

// imageSteps are the steps of `setup.sh images` with ROOTFS=testRootFS,
// as each announces itself when it is skipped ("==> STEP ...: up to date")
// or run.
var imageSteps = []string{"kernel", "guest agent", "initramfs", "rootfs tiny", "rootfs base"}

// testRootFS are the root filesystems the test builds (setup.sh's ROOTFS):
// not code-interpreter, which is base's recipe with more packages (a
// minute and a half more, for no mechanics base does not cover).
const testRootFS = "tiny base"

// TestSetupImages runs the image steps of `make setup` (setup.sh images:
// kernel, guest agent, initramfs, root filesystems tiny and base; not
// code-interpreter, see testRootFS) into an
// empty directory, as on a machine that has never seen the project, and
// checks every output; runs them again and checks that every step is
// skipped and nothing rewritten; then leaves what an interrupted run leaves
// (temporary directories, *.new files, an output without its stamp) and
// checks that the next run removes it and rebuilds only that output.
// It never touches the real images directory.
func TestSetupImages(t *testing.T) {
	testkit.Root(t) // setup.sh builds root filesystems as root
	// The tools setup.sh and the checks use live in sbin too.
	t.Setenv("PATH", os.Getenv("PATH")+":/usr/local/sbin:/usr/sbin:/sbin")
	images := filepath.Join(t.TempDir(), "images")
	t.Cleanup(func() { checkNoMounts(t, images) })
	agent := buildAgent(t)

	start := time.Now()
	out := runSetup(t, images, "images", agent)
	t.Logf("first run (empty directory): %.1fs", time.Since(start).Seconds())
	for _, s := range imageSteps {
		if !strings.Contains(out, "==> "+stepVerb(s)) {
			t.Errorf("first run did not build %s; output:\n%s", s, out)
		}
	}
	checkImages(t, images, agent)

	before := snapshotFiles(t, images)
	start = time.Now()
	out = runSetup(t, images, "images", agent)
	t.Logf("second run (up to date): %.1fs", time.Since(start).Seconds())
	checkAllSkipped(t, out)
	if after := snapshotFiles(t, images); !maps.Equal(before, after) {
		t.Errorf("second run changed files:\nbefore %v\nafter  %v", before, after)
	}

	// What an interrupted run leaves: its temporary directory (with a
	// half-built tree), a half-written output under its temporary name, a
	// kernel.new of an older version of the script, and an output renamed
	// into place whose stamp was not yet written.
	junk := []string{".tmp-rootfs-base.abc123/root/usr", "initramfs.img.new", "kernel.new/modules"}
	for _, j := range junk {
		p := filepath.Join(images, j)
		if strings.HasSuffix(j, ".new") {
			writeFile(t, p, "partial")
		} else if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(images, "kernel.new/stamp"), "stale")
	if err := os.Remove(filepath.Join(images, "initramfs.img.stamp")); err != nil {
		t.Fatal(err)
	}
	out = runSetup(t, images, "images", agent)
	for _, j := range []string{".tmp-rootfs-base.abc123", "initramfs.img.new", "kernel.new"} {
		if _, err := os.Lstat(filepath.Join(images, j)); err == nil {
			t.Errorf("%s left by an interrupted run is still there after the next run", j)
		}
	}
	if !strings.Contains(out, "==> building initramfs") {
		t.Errorf("an initramfs without its stamp was not rebuilt; output:\n%s", out)
	}
	for _, s := range imageSteps {
		if s != "initramfs" && !strings.Contains(out, "==> "+s) {
			t.Errorf("third run: no line for %s; output:\n%s", s, out)
		}
	}
	checkImages(t, images, agent)
}

// stepVerb is how a step announces that it runs.
func stepVerb(step string) string {
	switch step {
	case "kernel":
		return "extracting guest kernel"
	case "guest agent":
		return "installing the guest agent"
	default:
		return "building " + step
	}
}

// checkAllSkipped checks that out (of setup.sh images) has exactly one
// "up to date" line per step and did no work.
func checkAllSkipped(t *testing.T, out string) {
	t.Helper()
	var lines []string
	for l := range strings.Lines(out) {
		lines = append(lines, strings.TrimRight(l, "\n"))
	}
	if len(lines) != len(imageSteps) {
		t.Errorf("second run printed %d lines, want %d (one per step); output:\n%s", len(lines), len(imageSteps), out)
	}
	for i, s := range imageSteps {
		if i >= len(lines) {
			break
		}
		if !strings.HasPrefix(lines[i], "==> "+s) || !strings.HasSuffix(lines[i], ": up to date") {
			t.Errorf("second run, line %d: %q, want %q skipped as up to date", i+1, lines[i], s)
		}
	}
}

// runSetup runs scripts/setup.sh with IMAGES=images and returns its output
// (stdout and stderr). It fails the test if the script fails.
func runSetup(t *testing.T, images string, args ...string) string {
	t.Helper()
	if strings.HasPrefix(filepath.Clean(images), "/var/lib/pandastack") {
		t.Fatalf("refusing to run setup.sh on %s: tests use their own images directory", images)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "./setup.sh", args...)
	cmd.Env = append(os.Environ(), "IMAGES="+images, "ROOTFS="+testRootFS)
	// Its own process group: a timeout ends mmdebstrap too. SIGTERM lets
	// setup.sh clean up; WaitDelay bounds how long that may take.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = time.Minute
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Run(); err != nil {
		t.Fatalf("setup.sh %s: %v; output:\n%s", strings.Join(args, " "), err, buf.String())
	}
	// mmdebstrap is chatty ("I: ..."); steps are what matters here.
	var steps strings.Builder
	for l := range strings.Lines(buf.String()) {
		if !strings.HasPrefix(l, "I: ") && !strings.HasPrefix(l, "W: ") {
			steps.WriteString(l)
		}
	}
	return steps.String()
}

// buildAgent builds the guest agent as the Makefile does.
func buildAgent(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "panda-guest")
	cmd := exec.CommandContext(t.Context(), "go", "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./cmd/panda-guest")
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the guest agent: %v\n%s", err, b)
	}
	return out
}

// checkImages checks every output of setup.sh images in dir.
func checkImages(t *testing.T, dir, agent string) {
	t.Helper()
	checkKernel(t, dir)
	agentBytes := readFile(t, agent)
	if got := readFile(t, filepath.Join(dir, "panda-guest")); !bytes.Equal(got, agentBytes) {
		t.Errorf("panda-guest in the images directory differs from the agent built (%d bytes, want %d)", len(got), len(agentBytes))
	}
	checkInitramfs(t, dir, agentBytes)
	checkRootfs(t, dir, "tiny", 2048, []string{"/bin/busybox", "/bin/sh", "/etc/passwd", "/work", "/tmp"})
	checkRootfs(t, dir, "base", 4096, []string{"/usr/bin/python3", "/usr/bin/git", "/usr/bin/curl", "/work", "/etc/hosts"})

	// Nothing but the outputs, their stamps and the lock.
	want := []string{".setup.lock", "initramfs.img", "initramfs.img.stamp", "kernel", "panda-guest",
		"rootfs-base.ext4", "rootfs-base.ext4.stamp", "rootfs-tiny.ext4", "rootfs-tiny.ext4.stamp"}
	var got []string
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if !slices.Equal(got, want) {
		t.Errorf("images directory holds %v, want %v", got, want)
	}
}

func checkKernel(t *testing.T, dir string) {
	t.Helper()
	// The stamp names the package and version apt offers now.
	deps := command(t, "apt-cache", "depends", "linux-image-cloud-amd64")
	pkg := ""
	for l := range strings.Lines(deps) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(l), "Depends: linux-image-"); ok {
			pkg = "linux-image-" + p
			break
		}
	}
	ver := ""
	for l := range strings.Lines(command(t, "apt-cache", "policy", pkg)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Candidate: "); ok {
			ver = v
		}
	}
	if got, want := strings.TrimSpace(string(readFile(t, filepath.Join(dir, "kernel/stamp")))), pkg+" "+ver; got != want || pkg == "" || ver == "" {
		t.Errorf("kernel/stamp = %q, want %q", got, want)
	}

	// A bzImage: the setup header's magic "HdrS" at 0x202.
	vmlinuz := readFile(t, filepath.Join(dir, "kernel/vmlinuz"))
	if len(vmlinuz) < 1<<20 || string(vmlinuz[0x202:0x206]) != "HdrS" {
		t.Errorf("kernel/vmlinuz (%d bytes) is not a bzImage", len(vmlinuz))
	}

	// Every guest module is loaded, each after what it depends on.
	var order []string
	for l := range strings.Lines(string(readFile(t, filepath.Join(dir, "kernel/modules/order")))) {
		order = append(order, strings.TrimSpace(l))
	}
	for _, m := range guestModules {
		if !slices.Contains(order, m) {
			t.Errorf("kernel/modules/order %v lacks %s", order, m)
		}
	}
	for i, m := range order {
		ko := filepath.Join(dir, "kernel/modules", m+".ko")
		if b := readFile(t, ko); !bytes.HasPrefix(b, []byte("\x7fELF")) {
			t.Errorf("%s is not an ELF file", ko)
			continue
		}
		for d := range strings.SplitSeq(strings.TrimSpace(command(t, "modinfo", "-F", "depends", ko)), ",") {
			d = strings.ReplaceAll(d, "-", "_")
			if d != "" && !slices.Contains(order[:i], d) {
				t.Errorf("module %s depends on %s, which order %v does not load before it", m, d, order)
			}
		}
	}
}

func checkInitramfs(t *testing.T, dir string, agent []byte) {
	t.Helper()
	if s := strings.TrimSpace(string(readFile(t, filepath.Join(dir, "initramfs.img.stamp")))); len(s) != 64 || !isHex(s) {
		t.Errorf("initramfs.img.stamp = %q, want a SHA-256 in hex", s)
	}
	files, err := readCpio(readFile(t, filepath.Join(dir, "initramfs.img")))
	if err != nil {
		t.Fatalf("initramfs.img: %v", err)
	}
	init := readFile(t, "guest-init.sh")
	busybox := readFile(t, "/bin/busybox")
	want := map[string][]byte{"init": init, "panda-guest": agent, "bin/busybox": busybox}
	for _, m := range guestModules {
		want["lib/modules/"+m+".ko"] = readFile(t, filepath.Join(dir, "kernel/modules", m+".ko"))
	}
	for name, content := range want {
		f, ok := files[name]
		switch {
		case !ok:
			t.Errorf("initramfs.img has no /%s", name)
		case !bytes.Equal(f.data, content):
			t.Errorf("initramfs.img: /%s differs from its source (%d bytes, want %d)", name, len(f.data), len(content))
		case !strings.HasPrefix(name, "lib/modules/") && f.mode&0o111 == 0:
			t.Errorf("initramfs.img: /%s is not executable (mode %o)", name, f.mode)
		}
	}
	for _, d := range []string{"dev", "proc", "sys", "newroot"} {
		if f, ok := files[d]; !ok || f.mode&syscall.S_IFMT != syscall.S_IFDIR {
			t.Errorf("initramfs.img has no directory /%s", d)
		}
	}
}

func checkRootfs(t *testing.T, dir, name string, mib int64, paths []string) {
	t.Helper()
	img := filepath.Join(dir, "rootfs-"+name+".ext4")
	// -f: check even a clean file system; -n: open read-only, answer no.
	if out, err := exec.CommandContext(t.Context(), "e2fsck", "-f", "-n", img).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn %s: %v\n%s", img, err, out)
	}
	if fi, err := os.Stat(img); err != nil {
		t.Error(err)
	} else if fi.Size() != mib<<20 {
		t.Errorf("%s: %d bytes, want %d MiB", img, fi.Size(), mib)
	}
	for _, p := range paths {
		if out := command(t, "debugfs", "-R", "stat "+p, img); !strings.Contains(out, "Inode:") {
			t.Errorf("%s has no %s", img, p)
		}
	}
	stamp := strings.Split(strings.TrimSpace(string(readFile(t, img+".stamp"))), "\n")
	wantRecipe := fmt.Sprintf("%s %dMiB ", name, mib)
	if len(stamp) != 2 || !strings.HasPrefix(stamp[0], wantRecipe) || !strings.HasPrefix(stamp[1], "built ") {
		t.Errorf("%s.stamp = %q, want the recipe (%q...) and the build time", img, stamp, wantRecipe)
	}
}

// fileID is what a rewrite of a file would change.
type fileID struct {
	ino   uint64
	size  int64
	mtime time.Time
}

// snapshotFiles returns the identity of every file under dir.
func snapshotFiles(t *testing.T, dir string) map[string]fileID {
	t.Helper()
	m := map[string]fileID{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		m[p] = fileID{fi.Sys().(*syscall.Stat_t).Ino, fi.Size(), fi.ModTime()}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// checkNoMounts fails the test if anything is mounted under dir (which
// mmdebstrap mounts into while it runs, and must have unmounted), and
// unmounts it so that removing the temp directory stays inside it.
func checkNoMounts(t *testing.T, dir string) {
	for _, m := range testkit.MountsUnder(dir) { // deepest first
		t.Errorf("%s is still mounted after setup.sh", m)
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", m, err)
		}
	}
}

// cpioFile is one entry of a newc cpio archive.
type cpioFile struct {
	mode uint32
	data []byte
}

// readCpio parses a newc ("070701") cpio archive, as the kernel unpacks an
// initramfs, into its entries by name (without a leading "./").
func readCpio(b []byte) (map[string]cpioFile, error) {
	files := map[string]cpioFile{}
	align := func(n int) int { return (n + 3) &^ 3 }
	for off := 0; ; {
		if off+110 > len(b) {
			return nil, fmt.Errorf("truncated header at offset %d (no TRAILER!!!)", off)
		}
		h := b[off : off+110]
		if string(h[:6]) != "070701" {
			return nil, fmt.Errorf("bad magic %q at offset %d", h[:6], off)
		}
		field := func(i int) (int, error) {
			var v uint32
			if _, err := fmt.Sscanf(string(h[6+8*i:14+8*i]), "%08x", &v); err != nil {
				return 0, fmt.Errorf("header field %d at offset %d: %v", i, off, err)
			}
			return int(v), nil
		}
		mode, err := field(1)
		if err != nil {
			return nil, err
		}
		size, err := field(6)
		if err != nil {
			return nil, err
		}
		nameSize, err := field(11)
		if err != nil {
			return nil, err
		}
		if nameSize < 1 || off+110+nameSize > len(b) {
			return nil, fmt.Errorf("bad name size %d at offset %d", nameSize, off)
		}
		name := string(b[off+110 : off+110+nameSize-1])
		data := align(off + 110 + nameSize)
		if data+size > len(b) {
			return nil, fmt.Errorf("%s: truncated data", name)
		}
		if name == "TRAILER!!!" {
			return files, nil
		}
		name = strings.TrimPrefix(strings.TrimPrefix(name, "."), "/")
		if name != "" {
			files[name] = cpioFile{uint32(mode), b[data : data+size]}
		}
		off = align(data + size)
	}
}

// command runs a command that must succeed and returns its stdout.
func command(t *testing.T, name string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}

// earlyExitPipe matches a pipe into a reader that may stop before its
// writer has written everything: under pipefail the writer's SIGPIPE (exit
// 141) then fails the command, depending on timing.
var earlyExitPipe = regexp.MustCompile(`(^|[^|])\|\s*(head\b|tail\s+-n\s*\+?1\b|grep\s+(-\w*[qlm]|--quiet|--max-count)|sed\s+(-n\s+)?['"]?\d*q|awk\b.*\bexit\b)`)

// TestNoEarlyExitPipes keeps SIGPIPE-prone pipes out of the scripts that
// set up a fresh machine: a fresh machine's first make test failed with
// exit 141 from `busybox --help | head -n1` under pipefail.
func TestNoEarlyExitPipes(t *testing.T) {
	files, err := filepath.Glob("*.sh")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../Makefile")
	for _, f := range files {
		for i, l := range strings.Split(string(readFile(t, f)), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "#") {
				continue
			}
			if earlyExitPipe.MatchString(l) {
				t.Errorf("%s:%d: a pipe whose reader can exit early (SIGPIPE under pipefail): %s", f, i+1, strings.TrimSpace(l))
			}
		}
	}
	// The patterns themselves, so that the check cannot silently match nothing.
	for _, bad := range []string{"busybox --help | head -n1", "x | grep -q y", "a |awk '/x/{print $2; exit}'", "find . | sed 1q"} {
		if !earlyExitPipe.MatchString(bad) {
			t.Errorf("the check misses %q", bad)
		}
	}
	for _, ok := range []string{"cat a b | sha256sum", "find . -print0 | cpio -o", "x || head -n1 f"} {
		if earlyExitPipe.MatchString(ok) {
			t.Errorf("the check flags %q", ok)
		}
	}
}
