package template

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/internal/guestnet"
	"github.com/pandastack/pandastack/internal/hostagent/internal/memimage"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
)

// Defaults of BuildVMOptions.
const (
	DefaultBuildMemoryMiB  = 1024
	DefaultBuildVCPUs      = 1
	DefaultBuildMinFreeMiB = 2048
	DefaultBuildMaxDiskMiB = 32 << 10
)

// GuestAgentPath is where /init installs the guest agent in every guest;
// its subcommands (extract, sync) run as execs of it.
const GuestAgentPath = "/run/panda-guest"

// BuildVMOptions shape a build VM. Zero fields take the defaults.
type BuildVMOptions struct {
	// MemoryMiB and VCPUs are the machine's shape (default 1024 MiB and
	// one vCPU; give the host's default shape).
	MemoryMiB int
	VCPUs     int
	// MinFreeMiB is the free space the root file system must have when
	// the VM boots (default 2048): a file system with less is grown
	// first (the file extended sparsely, then resize2fs). Negative: never
	// grow.
	MinFreeMiB int
	// MaxDiskMiB bounds what growing makes of the file (default 32 GiB);
	// a file at or above it is not grown.
	MaxDiskMiB int
}

func (o *BuildVMOptions) setDefaults() error {
	if o.MemoryMiB == 0 {
		o.MemoryMiB = DefaultBuildMemoryMiB
	}
	if o.VCPUs == 0 {
		o.VCPUs = DefaultBuildVCPUs
	}
	if o.MinFreeMiB == 0 {
		o.MinFreeMiB = DefaultBuildMinFreeMiB
	}
	if o.MaxDiskMiB == 0 {
		o.MaxDiskMiB = DefaultBuildMaxDiskMiB
	}
	switch {
	case o.MemoryMiB < templates.MinMemoryMiB || o.MemoryMiB > templates.MaxMemoryMiB:
		return fmt.Errorf("%w: build VM memory %d MiB must be between %d and %d", templates.ErrInvalid, o.MemoryMiB, templates.MinMemoryMiB, templates.MaxMemoryMiB)
	case o.VCPUs < 1 || o.VCPUs > templates.MaxVCPUs:
		return fmt.Errorf("%w: build VM vcpus %d must be between 1 and %d", templates.ErrInvalid, o.VCPUs, templates.MaxVCPUs)
	case o.MaxDiskMiB < 0:
		return fmt.Errorf("%w: build VM max disk %d MiB is negative", templates.ErrInvalid, o.MaxDiskMiB)
	}
	return nil
}

// Files of a build VM snapshot, which Commit writes next to the disk it
// commits (in the same directory) and RestoreBuildVM restores from: the
// disk as it was at the pause (its journal not replayed: the guest's
// memory holds the mounted file system), the guest's RAM and its device
// state. A snapshot is whole once SnapshotState exists: it is written
// last.
const (
	SnapshotDisk  = "vm.disk"
	SnapshotMem   = "vm.mem"
	SnapshotState = "vm.state"
)

// BuildVM is a guest booted from a writable root filesystem file for a
// build step: commands run in it (Run), archives are unpacked into it
// (Extract) and its disk is copied out as it is (Commit), while it keeps
// running.
//
// Its RAM is a file mapped copy-on-write, as a sandbox's: an empty
// sparse file in the run directory for a booted VM, the snapshot's
// memory (the caller's copy) for a restored one, never modified. Commit
// snapshots it as a fork capture does: a clone of the file patched with
// the pages the guest wrote (internal/hostagent/internal/memimage), so a snapshot costs what
// the guest touched since its boot or restore.
//
// Run, Extract and Commit must not be called concurrently with each
// other. Close may be called at any time, from any goroutine: it ends
// a call in progress.
type BuildVM struct {
	disk    string
	mem     string
	log     *slog.Logger // with the disk
	runDir  string
	console string
	m       vmm.Machine
	client  *guestproto.Client
	release func()

	closeOnce sync.Once
	closeErr  error
}

// BootBuildVM boots a guest from disk, a root filesystem image (ext4)
// that the VM then writes in place: give it a private copy. The guest has
// the network interface bakes have (Config.Net), the kernel, initramfs
// and guest agent of Config.Images, and the shape of opts. Before the
// boot, a file system with less than opts.MinFreeMiB free is grown (see
// BuildVMOptions). BootBuildVM returns once the guest agent answers (a
// boot is bounded by Config.BakeTimeout, and tried twice); on error
// nothing is left running. progress (may be nil) receives progress lines.
// The caller must Close the VM.
func (s *Store) BootBuildVM(ctx context.Context, disk string, opts BuildVMOptions, progress func(string)) (*BuildVM, error) {
	say := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		s.log.Info("build vm: "+msg, "disk", disk)
		if progress != nil {
			progress(msg)
		}
	}
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	if opts.MinFreeMiB > 0 {
		if err := growExt4(ctx, disk, int64(opts.MinFreeMiB)<<20, int64(opts.MaxDiskMiB)<<20, say); err != nil {
			return nil, fmt.Errorf("build vm: grow root filesystem: %w", err)
		}
	}
	const attempts = 2 // TCG boots occasionally hang in early timer calibration
	for attempt := 1; ; attempt++ {
		say("booting build VM (attempt %d of %d, %s, %d MiB, %d vCPU)", attempt, attempts, s.cfg.Accel, opts.MemoryMiB, opts.VCPUs)
		start := time.Now()
		v, err := s.bootBuildVM(ctx, disk, opts)
		if err == nil {
			say("build VM up in %.1fs", time.Since(start).Seconds())
			return v, nil
		}
		if attempt == attempts || ctx.Err() != nil {
			return nil, fmt.Errorf("build vm: %w", err)
		}
		say("boot failed, retrying: %v", err)
	}
}

func (s *Store) bootBuildVM(ctx context.Context, disk string, opts BuildVMOptions) (_ *BuildVM, err error) {
	v, err := s.newBuildVM(disk)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			v.Close()
		}
	}()
	// A hole: the guest's RAM is private (see BuildVM); the file is the
	// empty base a snapshot's memory image is patched onto.
	v.mem = filepath.Join(v.runDir, "vm.mem")
	if err := createSparse(v.mem, int64(opts.MemoryMiB)<<20); err != nil {
		return nil, err
	}
	spec, err := s.buildSpec(ctx, v, opts)
	if err != nil {
		return nil, err
	}
	bootCtx, cancel := context.WithTimeout(ctx, s.cfg.BakeTimeout)
	defer cancel()
	m, err := s.cfg.Driver.Start(bootCtx, spec)
	if err != nil {
		return nil, err
	}
	v.m = m
	conn, err := dialUnix(bootCtx, m.AgentSocket())
	if err != nil {
		return nil, err
	}
	v.client = guestproto.NewClient(conn)
	bootCtx, stop := v.watch(bootCtx)
	defer stop()
	if _, err := v.client.Hello(bootCtx, buildHello); err != nil {
		return nil, v.failed("guest agent did not answer", err)
	}
	return v, nil
}

// restoreBuildTimeout bounds RestoreBuildVM, from start to the guest's
// answer.
const restoreBuildTimeout = 30 * time.Second

// buildHello starts every session with a build VM, booted or restored.
var buildHello = guestproto.HelloRequest{Hostname: "panda-build", SandboxID: "build"}

// newBuildVM makes v's run directory; v does nothing else yet.
func (s *Store) newBuildVM(disk string) (*BuildVM, error) {
	runDir, err := os.MkdirTemp(s.cfg.RunDir, "build-")
	if err != nil {
		return nil, err
	}
	return &BuildVM{disk: disk, runDir: runDir, console: filepath.Join(runDir, "console.log"), release: func() {}, log: s.log.With("disk", disk)}, nil
}

// buildSpec opens v's network interface (the bakes' one, with the guests'
// fixed MAC) and returns the spec of v's machine, booting. A restore
// must use the same spec (Incoming aside): the device layout is part of
// the saved state.
func (s *Store) buildSpec(ctx context.Context, v *BuildVM, opts BuildVMOptions) (vmm.Spec, error) {
	nic, release, err := s.cfg.Net(ctx, "build vm")
	if err != nil {
		return vmm.Spec{}, fmt.Errorf("network interface: %w", err)
	}
	v.release = release
	if nic.MAC != "" && nic.MAC != guestnet.GuestMAC {
		return vmm.Spec{}, fmt.Errorf("network interface: MAC %s, want the guests' %s", nic.MAC, guestnet.GuestMAC)
	}
	return vmm.Spec{
		Kernel: s.cfg.Images.Kernel(), Initramfs: s.cfg.Images.Initramfs(), Cmdline: s.cmdline(),
		MemoryMiB: opts.MemoryMiB, VCPUs: opts.VCPUs, Accel: s.cfg.Accel,
		// Private (copy on write): RAM as fast as anonymous memory;
		// Commit's snapshot is the file patched with the pages written.
		MemoryFile: v.mem,
		Disk:       v.disk, RunDir: v.runDir, ConsoleLog: v.console,
		Net: &vmm.Net{TAP: nic.TAP, MAC: guestnet.GuestMAC},
	}, nil
}

// RestoreBuildVM starts a build VM from a snapshot Commit wrote (see
// SnapshotDisk): disk and mem are the caller's private copies of the
// snapshot's disk and memory files, which the VM then writes in place
// (they stay the caller's to remove); state is its device state, only
// read. opts must give the shape the snapshotted VM had; the disk is not
// grown (the guest has it mounted). The guest goes on from the moment of
// the snapshot, its processes running, after the restore hooks of a new
// session (clock, identity). On error nothing is left running and the
// caller may boot instead. The caller must Close the VM.
func (s *Store) RestoreBuildVM(ctx context.Context, disk, mem, state string, opts BuildVMOptions, progress func(string)) (_ *BuildVM, err error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	start := time.Now()
	st, err := os.Stat(mem)
	if err != nil {
		return nil, fmt.Errorf("restore build vm: %w", err)
	}
	if st.Size() != int64(opts.MemoryMiB)<<20 {
		return nil, fmt.Errorf("restore build vm: the snapshot has %d MiB of memory, want %d MiB", st.Size()>>20, opts.MemoryMiB)
	}
	v, err := s.newBuildVM(disk)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			v.Close()
		}
	}()
	v.mem = mem
	spec, err := s.buildSpec(ctx, v, opts)
	if err != nil {
		return nil, fmt.Errorf("restore build vm: %w", err)
	}
	spec.Incoming = true
	// Bounded well below a boot: a restore takes a second or so, and one
	// that hangs (a snapshot the guest cannot go on from) is given up for
	// a boot.
	ctx, cancel := context.WithTimeout(ctx, min(s.cfg.BakeTimeout, restoreBuildTimeout))
	defer cancel()
	m, err := s.cfg.Driver.Start(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("restore build vm: %w", err)
	}
	v.m = m
	// Connect before loading: the guest never sees its port's host side
	// go away.
	conn, err := dialUnix(ctx, m.AgentSocket())
	if err != nil {
		return nil, fmt.Errorf("restore build vm: %w", err)
	}
	v.client = guestproto.NewClient(conn)
	if err := m.LoadState(ctx, state); err != nil {
		return nil, v.failed("restore build vm", err)
	}
	if err := m.Resume(ctx); err != nil {
		return nil, v.failed("restore build vm", err)
	}
	ctx, stop := v.watch(ctx)
	defer stop()
	reply, err := v.client.Hello(ctx, buildHello)
	if err != nil {
		return nil, v.failed("restore build vm: guest agent did not answer", err)
	}
	for _, e := range reply.HookErrors {
		s.log.Warn("build vm: guest restore hook failed", "err", e, "disk", disk)
	}
	msg := fmt.Sprintf("build VM restored in %.1fs", time.Since(start).Seconds())
	s.log.Info("build vm: "+msg, "disk", disk)
	if progress != nil {
		progress(msg)
	}
	return v, nil
}

// watch returns ctx, also cancelled when the VMM exits, and the function
// that releases it.
func (v *BuildVM) watch(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-v.m.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// failed describes err of an operation on the VM: with the VMM's exit and
// the console's last lines when the VMM is gone or the guest misbehaved.
func (v *BuildVM) failed(what string, err error) error {
	select {
	case <-v.m.Done():
		return fmt.Errorf("%s: vmm exited: %v (console: %s)", what, v.m.ExitError(), tail(v.console))
	default:
	}
	var ge *guestproto.Error
	if errors.As(err, &ge) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: %w (console: %s)", what, err, tail(v.console))
}

// Run runs req in the guest (as root unless req.User), its stdout and
// stderr interleaved into out as they come, and returns its exit code
// (128+signal if a signal killed it, as when req.TimeoutMS ran out). err
// is for what kept it from running or finishing: the command could not be
// started (a *guestproto.Error, e.g. not found), ctx ended, out failed,
// the VM died. req.Stdin is ignored: the command reads /dev/null.
func (v *BuildVM) Run(ctx context.Context, req guestproto.ExecRequest, out io.Writer) (exitCode int, err error) {
	return v.exec(ctx, req, nil, out)
}

func (v *BuildVM) exec(ctx context.Context, req guestproto.ExecRequest, stdin io.Reader, out io.Writer) (int, error) {
	if out == nil {
		out = io.Discard
	}
	ctx, stop := v.watch(ctx)
	defer stop()
	w := &lockedWriter{w: out}
	res, err := v.client.Exec(ctx, req, stdin, w, w)
	if err != nil {
		return -1, v.failed("run", err)
	}
	return res.ExitCode, nil
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Extract unpacks the tar stream r at the guest's / (see the guest's
// extract subcommand, api/guest-protocol.md): entries are relative
// paths and may not leave the root; symbolic links in the guest's tree
// resolve inside it. Every entry is owned by chown, a Docker USER spec
// ("name", "uid", "name:group", "uid:gid") resolved in the guest's own
// /etc/passwd and /etc/group, or by 0:0 when chown is "". An archive the
// guest refuses is an error holding the guest's reason.
func (v *BuildVM) Extract(ctx context.Context, r io.Reader, chown string) error {
	if err := guestproto.ValidateUser(chown); err != nil {
		return fmt.Errorf("%w: chown %q: %v", templates.ErrInvalid, chown, err)
	}
	argv := []string{GuestAgentPath, "extract"}
	if chown != "" {
		argv = append(argv, "--chown", chown)
	}
	var out bytes.Buffer
	code, err := v.exec(ctx, guestproto.ExecRequest{Argv: argv}, r, &capped{&out})
	if err != nil {
		return fmt.Errorf("extract: %w", err)
	}
	if code != 0 {
		return fmt.Errorf("extract: exit %d: %s", code, lastLines(out.String(), 10))
	}
	return nil
}

// Commit writes the guest's disk as it is now to dst (replaced whole,
// never torn), as a consistent ext4 file system: the guest's page cache
// and journal are flushed (sync(2) in the guest), the VMM is paused
// (QMP stop, which drains and flushes the disk's I/O), the file is
// cloned (FICLONE, else a sparse copy), the VMM resumes and the clone's
// journal is replayed on the host (e2fsck -E journal_only), so that
// dst is clean without being mounted. The VM keeps running.
//
// While the VM is paused Commit also snapshots it into dst's directory
// (SnapshotDisk, SnapshotMem, SnapshotState; replaced), which
// RestoreBuildVM restores from. A snapshot that fails is logged and left
// out (its files removed): the disk alone is still committed.
func (v *BuildVM) Commit(ctx context.Context, dst string) (err error) {
	var out bytes.Buffer
	code, err := v.exec(ctx, guestproto.ExecRequest{Argv: []string{GuestAgentPath, "sync"}}, nil, &capped{&out})
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, lastLines(out.String(), 10))
	}
	if err != nil {
		return fmt.Errorf("commit: sync the guest: %w", err)
	}
	dir := filepath.Dir(dst)
	suffix := ".commit-" + randHex(4)
	tmp := filepath.Join(dir, "."+filepath.Base(dst)+suffix)
	snap := []string{SnapshotDisk, SnapshotMem, SnapshotState}
	for i, f := range snap {
		snap[i] = filepath.Join(dir, "."+f+suffix)
	}
	defer func() {
		os.Remove(tmp)
		for _, f := range snap {
			os.Remove(f)
		}
	}()
	for _, f := range []string{SnapshotDisk, SnapshotMem, SnapshotState} {
		os.Remove(filepath.Join(dir, f)) // never a stale snapshot beside a new dst
	}
	// Quiesce the guest channel so that the snapshot holds no frame half
	// sent: a restore starts a new session on a new connection.
	snapErr := v.client.Barrier(ctx)
	if snapErr != nil {
		snapErr = fmt.Errorf("quiesce the guest agent: %w", snapErr)
	}
	pauseErr := v.m.Pause(ctx)
	paused := time.Now()
	var cloneErr error
	if pauseErr == nil {
		if snapErr == nil {
			snapErr = v.snapshot(ctx, snap[0], snap[1], snap[2])
		}
		// With a snapshot, its disk is the disk at the pause: dst is
		// copied from it after resuming, for a shorter pause.
		if snapErr != nil {
			cloneErr = cloneFile(v.disk, tmp)
		}
	}
	// Resume even if ctx ended: the VM must keep running.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if pauseErr == nil {
		if err := v.m.Resume(rctx); err != nil {
			return v.failed("commit", err)
		}
		v.log.Info("build vm: commit paused the VM", "pause_ms", time.Since(paused).Milliseconds(), "snapshot", snapErr == nil)
	}
	if err := v.client.Resume(rctx); err != nil {
		return v.failed("commit: resume the guest agent", err)
	}
	if pauseErr != nil {
		return v.failed("commit", pauseErr)
	}
	if cloneErr != nil {
		return fmt.Errorf("commit: copy the disk: %w", cloneErr)
	}
	if snapErr != nil {
		v.log.Warn("build vm: commit without a snapshot", "err", snapErr)
	} else if err := cloneFile(snap[0], tmp); err != nil {
		return fmt.Errorf("commit: copy the disk: %w", err)
	}
	// The clone is the disk of a mounted file system, as a crash would
	// leave it: its journal holds committed changes not yet in place.
	if err := fsck(ctx, tmp, "-y", "-E", "journal_only"); err != nil {
		return fmt.Errorf("commit: replay the journal: %w", err)
	}
	if err := syncPath(tmp); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if snapErr == nil {
		// The state last: it marks a whole snapshot.
		for i, f := range []string{SnapshotDisk, SnapshotMem, SnapshotState} {
			if err := syncPath(snap[i]); err == nil {
				err = os.Rename(snap[i], filepath.Join(dir, f))
			}
			if err != nil {
				v.log.Warn("build vm: commit without a snapshot", "err", err)
				for _, f := range []string{SnapshotDisk, SnapshotMem} {
					os.Remove(filepath.Join(dir, f))
				}
				break
			}
		}
	}
	return syncPath(dir)
}

// snapshot writes the paused VM's device state, memory and disk.
func (v *BuildVM) snapshot(ctx context.Context, disk, mem, state string) error {
	if err := v.m.SaveState(ctx, state); err != nil {
		return err
	}
	r, err := v.m.RAMMapping()
	if err != nil {
		return err
	}
	region := memimage.Region{PID: r.PID, Start: r.Start, Size: r.Size}
	pm, err := memimage.Scan(region)
	if err != nil {
		return err
	}
	if _, err := memimage.Write(mem, v.mem, cloneFile, region, pm.Dirty); err != nil {
		return fmt.Errorf("write the memory: %w", err)
	}
	if err := cloneFile(v.disk, disk); err != nil {
		return fmt.Errorf("copy the disk: %w", err)
	}
	return nil
}

// Close kills the VMM, releases its network interface and removes its
// run directory (console log and a booted VM's memory file included).
// Idempotent; the disk (and a restored VM's memory file) stays.
func (v *BuildVM) Close() error {
	v.closeOnce.Do(func() {
		if v.client != nil {
			v.client.Close()
		}
		if v.m != nil {
			v.closeErr = v.m.Kill()
		}
		v.release() // after the VMM exited
		if err := os.RemoveAll(v.runDir); err != nil && v.closeErr == nil {
			v.closeErr = err
		}
	})
	return v.closeErr
}

// growExt4 grows the ext4 file system in the file disk so that it has at
// least minFree bytes free, the file at most maxSize bytes: the file is
// extended (sparse), then resized offline with resize2fs (after e2fsck
// -fy when resize2fs asks for it). Free space is what the superblock
// records.
func growExt4(ctx context.Context, disk string, minFree, maxSize int64, say func(string, ...any)) error {
	sb, err := readExt4Super(disk)
	if err != nil {
		return err
	}
	free := sb.freeBlocks * sb.blockSize
	size := sb.blocks * sb.blockSize
	if free >= minFree {
		return nil
	}
	st, err := os.Stat(disk)
	if err != nil {
		return err
	}
	// New block groups bring their own metadata (inode tables, bitmaps):
	// 1/16 more covers it.
	short := minFree - free
	want := roundUp(size+short+short/16, 4<<20)
	if want > maxSize {
		want = maxSize
	}
	if want <= size {
		say("root filesystem has %d MiB free, below %d MiB, but is at its maximum size (%d MiB)", free>>20, minFree>>20, maxSize>>20)
		return nil
	}
	say("growing root filesystem from %d MiB to %d MiB (%d MiB free)", size>>20, want>>20, free>>20)
	if want > st.Size() {
		if err := os.Truncate(disk, want); err != nil {
			return err
		}
	}
	err = resize2fs(ctx, disk, want, say)
	if err != nil && want > st.Size() {
		os.Truncate(disk, st.Size())
	}
	return err
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

func resize2fs(ctx context.Context, disk string, size int64, say func(string, ...any)) error {
	resize, err := findTool("resize2fs")
	if err != nil {
		return err
	}
	sizeArg := fmt.Sprintf("%dK", size>>10)
	out, err := exec.CommandContext(ctx, resize, disk, sizeArg).CombinedOutput()
	if err == nil {
		return nil
	}
	if !strings.Contains(string(out), "e2fsck") {
		return fmt.Errorf("resize2fs: %w: %s", err, strings.TrimSpace(string(out)))
	}
	say("checking the root filesystem first (e2fsck), as resize2fs asks")
	if err := fsck(ctx, disk, "-fy"); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, resize, disk, sizeArg).CombinedOutput(); err != nil {
		return fmt.Errorf("resize2fs: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// fsck runs e2fsck with args on disk; exit codes below 4 (nothing wrong,
// errors corrected) are success.
func fsck(ctx context.Context, disk string, args ...string) error {
	tool, err := findTool("e2fsck")
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, tool, append(args, disk)...).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() < 4 {
		return nil
	}
	if err != nil {
		return fmt.Errorf("e2fsck %s: %w: %s", strings.Join(args, " "), err, lastLines(strings.TrimSpace(string(out)), 5))
	}
	return nil
}

// findTool finds one of e2fsprogs' programs, in PATH or in sbin (which a
// user's PATH may lack).
func findTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/" + name, "/sbin/" + name} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found: install e2fsprogs", name)
}

// ext4Super is what growExt4 needs of an ext4 superblock.
type ext4Super struct {
	blockSize, blocks, freeBlocks int64
}

func readExt4Super(path string) (ext4Super, error) {
	f, err := os.Open(path)
	if err != nil {
		return ext4Super{}, err
	}
	defer f.Close()
	b := make([]byte, 1024)
	if _, err := f.ReadAt(b, 1024); err != nil {
		return ext4Super{}, fmt.Errorf("read superblock of %s: %w", path, err)
	}
	le := binary.LittleEndian
	if le.Uint16(b[0x38:]) != 0xEF53 {
		return ext4Super{}, fmt.Errorf("%s is not an ext2/3/4 file system", path)
	}
	sb := ext4Super{
		blockSize:  1024 << le.Uint32(b[0x18:]),
		blocks:     int64(le.Uint32(b[0x4:])),
		freeBlocks: int64(le.Uint32(b[0xC:])),
	}
	if le.Uint32(b[0x60:])&0x80 != 0 { // INCOMPAT_64BIT
		sb.blocks |= int64(le.Uint32(b[0x150:])) << 32
		sb.freeBlocks |= int64(le.Uint32(b[0x158:])) << 32
	}
	return sb, nil
}

// cloneFile makes dst (created, must not exist) a copy of src: a reflink
// (FICLONE) when the file system can, else a sparse copy.
func cloneFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	err = unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		return nil
	}
	os.Remove(dst)
	return copySparse(src, dst)
}
