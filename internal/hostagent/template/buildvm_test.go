package template

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/hostagent/vmm/qemu"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// buildStore is a store with a real (confined) QEMU driver under TCG and
// the default network hook (an isolated TAP: no way out), and its run
// directory.
func buildStore(t *testing.T) (*Store, string) {
	t.Helper()
	testkit.VM(t)
	testkit.Root(t) // build VMs run confined
	images := Images{Dir: testkit.Images()}
	for _, f := range []string{images.Kernel(), images.Initramfs(), images.RootFS("tiny")} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("guest images missing (run make setup, or set PANDA_TEST_IMAGES): %v", err)
		}
	}
	drv, err := qemu.New(qemu.Config{})
	if err != nil {
		t.Fatal(err)
	}
	run, err := os.MkdirTemp("", "pt") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if pids := testkit.Procs("guest=panda:" + run + "/"); len(pids) != 0 {
			t.Errorf("VMMs %v still run", pids)
		}
		if ents, _ := os.ReadDir(run); len(ents) != 0 {
			t.Errorf("run directory holds %d entries after Close", len(ents))
		}
		os.RemoveAll(run)
	})
	st, err := NewStore(Config{Dir: filepath.Join(t.TempDir(), "templates"), RunDir: run, Images: images, Driver: drv,
		Accel: accel.TCG, TSCkHz: qemu.TSCkHz()})
	if err != nil {
		t.Fatal(err)
	}
	return st, run
}

func bootBuild(t *testing.T, ctx context.Context, st *Store, disk string, opts BuildVMOptions) *BuildVM {
	t.Helper()
	start := time.Now()
	v, err := st.BootBuildVM(ctx, disk, opts, func(m string) { t.Log(m) })
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("build VM booted in %v", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() { v.Close() })
	return v
}

// sh runs a shell command in v and returns its output; its exit code
// must be 0.
func sh(t *testing.T, ctx context.Context, v *BuildVM, cmd string) string {
	t.Helper()
	var out bytes.Buffer
	code, err := v.Run(ctx, guestproto.ExecRequest{Shell: cmd}, &out)
	if err != nil || code != 0 {
		t.Fatalf("%s: exit %d, %v: %s", cmd, code, err, out.String())
	}
	return out.String()
}

func tarOf(t *testing.T, hdrs ...*tar.Header) *bytes.Reader {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hdrs {
		body := h.Linkname
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
			h.Linkname = ""
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(body))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b.Bytes())
}

// dfKiB is the size of the guest's root file system in KiB.
func dfKiB(t *testing.T, ctx context.Context, v *BuildVM) int64 {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(sh(t, ctx, v, "df -k /")), "\n")
	f := strings.Fields(lines[len(lines)-1])
	n, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatalf("df: %q", lines)
	}
	return n
}

// TestBuildVM boots a build VM from a copy of the tiny root filesystem,
// runs commands, unpacks archives (a hostile one refused), commits the
// disk while the VM runs, and boots the commit: everything is there, and
// the file system grew each time it had too little room.
func TestBuildVM(t *testing.T) {
	st, _ := buildStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	fds := testkit.OpenFDs(t)
	disk := filepath.Join(dir, "disk.ext4")
	if err := copySparse(st.cfg.Images.RootFS("tiny"), disk); err != nil {
		t.Fatal(err)
	}
	before, err := readExt4Super(disk)
	if err != nil {
		t.Fatal(err)
	}

	v := bootBuild(t, ctx, st, disk, BuildVMOptions{MemoryMiB: 256, MinFreeMiB: 3072})
	after, err := readExt4Super(disk)
	if err != nil {
		t.Fatal(err)
	}
	if got := after.blocks * after.blockSize; got <= before.blocks*before.blockSize {
		t.Errorf("file system of %d bytes, %d before the boot; want it grown", got, before.blocks*before.blockSize)
	}
	size1 := dfKiB(t, ctx, v)
	if size1 < 3<<20 {
		t.Errorf("guest's / is %d KiB, want at least 3 GiB (grown for 3 GiB free)", size1)
	}

	var out bytes.Buffer
	code, err := v.Run(ctx, guestproto.ExecRequest{Shell: "echo out; echo err >&2; echo built >/built.txt"}, &out)
	if err != nil || code != 0 || !strings.Contains(out.String(), "out\n") || !strings.Contains(out.String(), "err\n") {
		t.Errorf("Run: exit %d, %v, output %q; want 0 and both streams", code, err, out.String())
	}
	if code, err := v.Run(ctx, guestproto.ExecRequest{Shell: "exit 3"}, nil); err != nil || code != 3 {
		t.Errorf("Run(exit 3) = %d, %v; want 3", code, err)
	}
	if _, err := v.Run(ctx, guestproto.ExecRequest{Argv: []string{"/no/such/binary"}}, nil); err == nil {
		t.Errorf("Run of a missing binary: no error")
	}

	// A user of the image's own (the tiny image has root only).
	sh(t, ctx, v, "echo 'builder:x:1000:1000::/home/builder:/bin/sh' >>/etc/passwd && echo 'builder:x:1000:' >>/etc/group")
	mtime := time.Unix(1_600_000_000, 0)
	err = v.Extract(ctx, tarOf(t,
		&tar.Header{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime},
		&tar.Header{Name: "app/run.sh", Typeflag: tar.TypeReg, Mode: 0o750, ModTime: mtime, Linkname: "#!/bin/sh\necho ran\n"},
		&tar.Header{Name: "app/link", Typeflag: tar.TypeSymlink, Linkname: "run.sh", ModTime: mtime},
		&tar.Header{Name: "opt/deep/file", Typeflag: tar.TypeReg, Mode: 0o600, ModTime: mtime, Linkname: "x"},
	), "builder")
	if err != nil {
		t.Fatal(err)
	}
	got := sh(t, ctx, v, "stat -c '%n %a %U %G' /app /app/run.sh /opt/deep/file; stat -c '%n %U' /app/link; readlink /app/link; /app/link; stat -c %Y /app/run.sh")
	want := "/app 755 builder builder\n/app/run.sh 750 builder builder\n/opt/deep/file 600 builder builder\n/app/link builder\nrun.sh\nran\n1600000000\n"
	if got != want {
		t.Errorf("after Extract:\n%s\nwant:\n%s", got, want)
	}
	if err := v.Extract(ctx, tarOf(t, &tar.Header{Name: "root-owned", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"}), ""); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, ctx, v, "stat -c '%U:%G' /root-owned"); got != "root:root\n" {
		t.Errorf("Extract without chown: owner %q, want root:root", got)
	}
	if err := v.Extract(ctx, tarOf(t, &tar.Header{Name: "x", Typeflag: tar.TypeReg, Mode: 0o644}), "nosuch"); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("Extract --chown to an unknown user: %v", err)
	}

	t.Run("hostile", func(t *testing.T) {
		for _, h := range []*tar.Header{
			{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"},
			{Name: "tmp/../../escape", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"},
			{Name: "/abs-escape", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"},
			{Name: "hl", Typeflag: tar.TypeLink, Linkname: "../etc/passwd"},
		} {
			if err := v.Extract(ctx, tarOf(t, h), ""); err == nil || !strings.Contains(err.Error(), "refusing archive entry") {
				t.Errorf("Extract of %q: %v, want it refused", h.Name, err)
			}
		}
		sh(t, ctx, v, "! ls -d /escape /abs-escape /hl 2>/dev/null")
	})

	dst := filepath.Join(dir, "committed.ext4")
	start := time.Now()
	if err := v.Commit(ctx, dst); err != nil {
		t.Fatal(err)
	}
	t.Logf("commit took %v", time.Since(start).Round(time.Millisecond))
	if out, err := exec.Command("e2fsck", "-fn", dst).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn of the commit: %v: %s", err, out)
	}
	sh(t, ctx, v, "echo after-commit >/after.txt") // still running, not in the commit
	if leftovers, _ := filepath.Glob(filepath.Join(dir, ".committed.ext4.commit-*")); len(leftovers) != 0 {
		t.Errorf("commit left %v", leftovers)
	}
	if err := v.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := v.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	// The commit boots, grown again (after the e2fsck resize2fs asks of a
	// file system that was mounted), with everything written before it.
	v2 := bootBuild(t, ctx, st, dst, BuildVMOptions{MemoryMiB: 256, MinFreeMiB: 4096})
	got = sh(t, ctx, v2, "cat /built.txt; stat -c '%n %a %U' /app/run.sh; readlink /app/link; ls /after.txt 2>&1 || true")
	if !strings.HasPrefix(got, "built\n/app/run.sh 750 builder\nrun.sh\n") || strings.Contains(got, "after-commit") || !strings.Contains(got, "No such file") {
		t.Errorf("in the committed disk:\n%s", got)
	}
	if size2 := dfKiB(t, ctx, v2); size2 <= size1 {
		t.Errorf("committed disk's / is %d KiB, %d before; want it grown for 4 GiB free", size2, size1)
	}
	if err := v2.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	// No descriptor left: no TAP, no network namespace, no socket.
	if got := testkit.OpenFDs(t); got != fds {
		t.Errorf("%d descriptors open after Close, %d before", got, fds)
	}
}

// TestGrowExt4: a file system with too little free space is grown, up to
// the maximum; one with enough is left alone.
func TestGrowExt4(t *testing.T) {
	mkfs, err := findTool("mkfs.ext4")
	if err != nil {
		t.Fatalf("%v (make setup installs e2fsprogs)", err)
	}
	ctx := context.Background()
	say := func(f string, a ...any) { t.Logf(f, a...) }
	img := filepath.Join(t.TempDir(), "fs.ext4")
	if err := createSparse(img, 64<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mkfs, "-q", "-F", "-b", "4096", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs: %v: %s", err, out)
	}
	size := func() int64 {
		sb, err := readExt4Super(img)
		if err != nil {
			t.Fatal(err)
		}
		return sb.blocks * sb.blockSize
	}
	if err := growExt4(ctx, img, 32<<20, 1<<30, say); err != nil || size() != 64<<20 {
		t.Errorf("enough free: grow %v, size %d; want 64 MiB unchanged", err, size())
	}
	if err := growExt4(ctx, img, 128<<20, 1<<30, say); err != nil {
		t.Fatal(err)
	}
	sb, _ := readExt4Super(img)
	if free := sb.freeBlocks * sb.blockSize; free < 128<<20 || size() > 256<<20 {
		t.Errorf("grown to %d bytes with %d free; want at least 128 MiB free", size(), free)
	}
	if err := growExt4(ctx, img, 1<<30, 300<<20, say); err != nil || size() != 300<<20 {
		t.Errorf("capped grow: %v, size %d; want 300 MiB", err, size())
	}
	if st, _ := os.Stat(img); st.Size() != 300<<20 {
		t.Errorf("file is %d bytes, want 300 MiB", st.Size())
	}
	if err := growExt4(ctx, img, 1<<30, 300<<20, say); err != nil || size() != 300<<20 {
		t.Errorf("at the maximum: %v, size %d", err, size())
	}
	if out, err := exec.Command("e2fsck", "-fn", img).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn: %v: %s", err, out)
	}
	if err := growExt4(ctx, filepath.Join(t.TempDir(), "nosuch"), 1, 2, say); err == nil {
		t.Errorf("grow of a missing file: no error")
	}
}

// TestBuildVMFailures: a commit that cannot be written leaves the VM
// running; a VM whose VMM died says so (with its console) and closes
// cleanly.
func TestBuildVMFailures(t *testing.T) {
	st, _ := buildStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	disk := filepath.Join(t.TempDir(), "disk.ext4")
	if err := copySparse(st.cfg.Images.RootFS("tiny"), disk); err != nil {
		t.Fatal(err)
	}
	v := bootBuild(t, ctx, st, disk, BuildVMOptions{MemoryMiB: 256, MinFreeMiB: -1})
	if sb, _ := readExt4Super(disk); sb.blocks*sb.blockSize != 2<<30 {
		t.Errorf("MinFreeMiB -1: file system of %d bytes, want the 2 GiB it had", sb.blocks*sb.blockSize)
	}
	if err := v.Commit(ctx, filepath.Join(t.TempDir(), "no", "such", "dir")); err == nil {
		t.Errorf("Commit into a missing directory: no error")
	}
	if got := sh(t, ctx, v, "echo alive"); got != "alive\n" {
		t.Errorf("after a failed commit: %q", got)
	}
	if err := syscall.Kill(v.m.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-v.m.Done()
	_, err := v.Run(ctx, guestproto.ExecRequest{Shell: "true"}, nil)
	if err == nil || !strings.Contains(err.Error(), "vmm exited") || !strings.Contains(err.Error(), "console") {
		t.Errorf("Run in a dead VM: %v, want it to say the VMM exited, with the console", err)
	}
	t.Logf("Run in a dead VM: %v", err)
	v.Close()
	if _, err := os.Stat(v.runDir); !os.IsNotExist(err) {
		t.Errorf("run directory %s after Close: %v", v.runDir, err)
	}
}

// restoreBuild restores a build VM from the snapshot Commit wrote in dir,
// from private copies of its disk and memory in work.
func restoreBuild(t *testing.T, ctx context.Context, st *Store, dir, work string, opts BuildVMOptions) (*BuildVM, error) {
	t.Helper()
	disk, mem := filepath.Join(work, "disk.ext4"), filepath.Join(work, "vm.mem")
	for _, f := range [][2]string{{SnapshotDisk, disk}, {SnapshotMem, mem}} {
		os.Remove(f[1])
		if err := cloneFile(filepath.Join(dir, f[0]), f[1]); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	v, err := st.RestoreBuildVM(ctx, disk, mem, filepath.Join(dir, SnapshotState), opts, func(m string) { t.Log(m) })
	if err != nil {
		return nil, err
	}
	t.Logf("build VM restored in %v", time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() { v.Close() })
	return v, nil
}

// TestBuildVMRestore commits a build VM with a process running, restores
// the snapshot (the file and the process are there, commands run),
// commits and restores again, and restores from broken snapshots: those
// fail with nothing left running, and a boot from the committed disk
// still works.
func TestBuildVMRestore(t *testing.T) {
	st, _ := buildStore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	fds := testkit.OpenFDs(t)
	disk := filepath.Join(dir, "disk.ext4")
	if err := copySparse(st.cfg.Images.RootFS("tiny"), disk); err != nil {
		t.Fatal(err)
	}
	opts := BuildVMOptions{MemoryMiB: 256, MinFreeMiB: 512}
	v := bootBuild(t, ctx, st, disk, opts)
	sh(t, ctx, v, "echo one >/one.txt; setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! >/sleep.pid")
	layer1 := filepath.Join(dir, "l1")
	os.Mkdir(layer1, 0o755)
	start := time.Now()
	if err := v.Commit(ctx, filepath.Join(layer1, "rootfs.ext4")); err != nil {
		t.Fatal(err)
	}
	t.Logf("commit with snapshot took %v", time.Since(start).Round(time.Millisecond))
	for _, f := range []string{"rootfs.ext4", SnapshotDisk, SnapshotMem, SnapshotState} {
		fi, err := os.Stat(filepath.Join(layer1, f))
		if err != nil {
			t.Fatalf("after Commit: %v", err)
		}
		t.Logf("%s: %d bytes, %d allocated", f, fi.Size(), fi.Sys().(*syscall.Stat_t).Blocks*512)
	}
	if ents, _ := os.ReadDir(layer1); len(ents) != 4 {
		t.Errorf("commit directory holds %d entries, want 4", len(ents))
	}
	sh(t, ctx, v, "echo after >/after.txt") // not in the snapshot
	if err := v.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}

	work := t.TempDir()
	v2, err := restoreBuild(t, ctx, st, layer1, work, opts)
	if err != nil {
		t.Fatal(err)
	}
	got := sh(t, ctx, v2, "cat /one.txt; kill -0 $(cat /sleep.pid) && echo sleeping; ls /after.txt 2>&1 || true; hostname")
	if !strings.HasPrefix(got, "one\nsleeping\n") || !strings.Contains(got, "No such file") || !strings.HasSuffix(got, "panda-build\n") {
		t.Errorf("in the restored VM:\n%s", got)
	}
	sh(t, ctx, v2, "echo two >/two.txt")
	layer2 := filepath.Join(dir, "l2")
	os.Mkdir(layer2, 0o755)
	if err := v2.Commit(ctx, filepath.Join(layer2, "rootfs.ext4")); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("e2fsck", "-fn", filepath.Join(layer2, "rootfs.ext4")).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn of the second commit: %v: %s", err, out)
	}
	if err := v2.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}

	work2 := t.TempDir()
	v3, err := restoreBuild(t, ctx, st, layer2, work2, opts)
	if err != nil {
		t.Fatal(err)
	}
	got = sh(t, ctx, v3, "cat /one.txt /two.txt; kill -0 $(cat /sleep.pid) && echo sleeping")
	if got != "one\ntwo\nsleeping\n" {
		t.Errorf("in the VM restored twice:\n%s", got)
	}
	if err := v3.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}

	t.Run("broken", func(t *testing.T) {
		broken := filepath.Join(dir, "broken")
		os.Mkdir(broken, 0o755)
		for _, f := range []string{SnapshotDisk, SnapshotMem} {
			if err := cloneFile(filepath.Join(layer2, f), filepath.Join(broken, f)); err != nil {
				t.Fatal(err)
			}
		}
		// A missing state, then a truncated one.
		if _, err := restoreBuild(t, ctx, st, broken, t.TempDir(), opts); err == nil {
			t.Error("restore without a state: no error")
		}
		b, err := os.ReadFile(filepath.Join(layer2, SnapshotState))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(broken, SnapshotState), b[:len(b)/2], 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := restoreBuild(t, ctx, st, broken, t.TempDir(), opts); err == nil {
			t.Error("restore from a truncated state: no error")
		} else {
			t.Logf("truncated state: %v", err)
		}
		// Another memory size than the snapshot's.
		if _, err := restoreBuild(t, ctx, st, layer2, t.TempDir(), BuildVMOptions{MemoryMiB: 512}); err == nil {
			t.Error("restore with another memory size: no error")
		}
		// The caller's fallback: the committed disk boots.
		disk := filepath.Join(t.TempDir(), "disk.ext4")
		if err := cloneFile(filepath.Join(layer2, "rootfs.ext4"), disk); err != nil {
			t.Fatal(err)
		}
		v := bootBuild(t, ctx, st, disk, opts)
		if got := sh(t, ctx, v, "cat /one.txt /two.txt"); got != "one\ntwo\n" {
			t.Errorf("booted from the commit: %q", got)
		}
		v.Close()
	})
	if got := testkit.OpenFDs(t); got != fds {
		t.Errorf("%d descriptors open after Close, %d before", got, fds)
	}
}
