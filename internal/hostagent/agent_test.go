package hostagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/hostagent/lazymem"
	"github.com/pandastack/pandastack/internal/testing/pandatest"
	"github.com/pandastack/pandastack/internal/testing/testkit"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/guestproto/guestprototest"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/hostagent/vmm/qemu"
	"golang.org/x/sys/unix"
)

// The package's tests share one host agent with real QEMU guests, on a
// temporary data directory (an XFS image loop-mounted inside it), opened
// by shared on first use. Every test here boots guests as root: it starts
// with shared(t), or with the gates (testkit.VM, testkit.Root) when it
// opens agents of its own.
var (
	testAgent *Agent // set by shared
	testDir   string
	openOnce  sync.Once
	openErr   error
	exits     = newExitLog()
)

type exitLog struct {
	mu sync.Mutex
	ch map[string]chan error
}

func newExitLog() *exitLog { return &exitLog{ch: map[string]chan error{}} }

func (l *exitLog) wait(id string) chan error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ch[id] == nil {
		l.ch[id] = make(chan error, 1)
	}
	return l.ch[id]
}

func (l *exitLog) record(id string, err error) { l.wait(id) <- err }

func TestMain(m *testing.M) {
	// The test binary is the holder process of the lazy restore tests'
	// mounts (LazyConfig.Holder).
	lazymem.HolderMain()
	os.Exit(runMain(m))
}

// newDriver is the QEMU driver of one agent the tests open (each agent its
// own, as panda's are).
func newDriver(log *slog.Logger) (vmm.Driver, error) {
	return qemu.New(qemu.Config{Logger: log})
}

// driverT is newDriver for a test.
func driverT(t *testing.T, log *slog.Logger) vmm.Driver {
	t.Helper()
	d, err := newDriver(log)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// shared gates a test on guest VMs and root and returns the package's
// shared agent, opened on first use.
func shared(t *testing.T) *Agent {
	t.Helper()
	testkit.VM(t)
	testkit.Root(t)
	openOnce.Do(func() { openErr = openShared() })
	if openErr != nil {
		t.Fatalf("open the shared agent: %v", openErr)
	}
	return testAgent
}

// openShared opens the shared agent on a new temporary directory.
func openShared() error {
	var err error
	// Short: the run directory holds unix sockets (108-byte limit).
	testDir, err = os.MkdirTemp("", "pag")
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	drv, err := newDriver(log)
	if err != nil {
		return fmt.Errorf("qemu driver: %w", err)
	}
	testAgent, err = Open(context.Background(), Config{
		DataDir: testDir, ImagesDir: testkit.Images(), Accel: "tcg", VolumeSize: 8 << 30,
		DefaultTemplate: "tiny", DefaultMemoryMiB: 256,
		OnExit: exits.record,
		Driver: drv,
		Logger: log,
	})
	return err
}

// runMain runs the tests, then closes the shared agent if a test opened
// it and fails the run if it left anything behind.
func runMain(m *testing.M) int {
	code := m.Run()
	if testDir == "" {
		return code
	}
	defer os.RemoveAll(testDir)
	if testAgent == nil {
		return code
	}
	store := testAgent.StoreDir()
	if err := testAgent.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "close agent:", err)
		code = 1
	}
	if left := leftovers(store); left != "" {
		fmt.Fprintln(os.Stderr, "left behind:", left)
		code = 1
	}
	return code
}

// leftovers reports QEMU processes serving testDir, lazy restore's
// holder processes of store and a mount of store.
func leftovers(store string) string {
	var out []string
	for _, pid := range testkit.QEMUProcs(testDir) {
		out = append(out, fmt.Sprintf("qemu %d", pid))
	}
	for _, pid := range pandatest.HolderPIDs(store) {
		out = append(out, fmt.Sprintf("lazy restore holder %d", pid))
	}
	if testkit.Mounted(store) {
		out = append(out, "mount "+store)
	}
	// Mounts inside the store: lazy restore's FUSE mount.
	for _, mp := range testkit.MountsUnder(store) {
		out = append(out, "mount "+mp)
	}
	return strings.Join(out, ", ")
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func create(t *testing.T) Info {
	t.Helper()
	info, err := testAgent.Create(ctxT(t), CreateRequest{})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { testAgent.Kill(context.Background(), info.ID) })
	return info
}

func sh(t *testing.T, id, cmd string) string {
	t.Helper()
	return shOn(t, testAgent, id, cmd)
}

func TestCreateExec(t *testing.T) {
	shared(t)
	info := create(t)
	if info.State != StateRunning || info.MemoryMiB != 256 || info.PID == 0 {
		t.Errorf("got %+v", info)
	}
	if got := sh(t, info.ID, "echo hello; uname -s"); got != "hello\nLinux\n" {
		t.Errorf("got %q, want hello and Linux", got)
	}
	if got := sh(t, info.ID, "hostname"); got != info.ID+"\n" {
		t.Errorf("hostname %q, want %s", got, info.ID)
	}
	if got := sh(t, info.ID, "cat /etc/machine-id"); len(strings.TrimSpace(got)) != 32 {
		t.Errorf("machine-id %q", got)
	}
	// The guest agent quieted the idle kernel's housekeeping (guest.InitSystem).
	if got := sh(t, info.ID, "cat /proc/sys/vm/compaction_proactiveness /proc/sys/vm/stat_interval /proc/sys/kernel/watchdog /sys/kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs"); got != "0\n10\n0\n60000\n" {
		t.Errorf("compaction_proactiveness, stat_interval, watchdog, khugepaged scan_sleep_millisecs: got %q, want 0, 10, 0, 60000", got)
	}
	// Under TCG (the test agent's accel) the clocksource watchdog is off
	// (template cmdline) and the TSC is still the clocksource.
	if got := sh(t, info.ID, "grep -o 'tsc=nowatchdog' /proc/cmdline; cat /sys/devices/system/clocksource/clocksource0/current_clocksource"); got != "tsc=nowatchdog\ntsc\n" {
		t.Errorf("cmdline's tsc=nowatchdog and clocksource: got %q, want tsc=nowatchdog, tsc", got)
	}
	list := testAgent.List()
	found := false
	for _, l := range list {
		found = found || l.ID == info.ID
	}
	if !found {
		t.Errorf("List lacks %s", info.ID)
	}
}

// The template's guest state, including what lives only in RAM, is what a
// sandbox starts with: same kernel boot, and the agent binary the
// initramfs put on a tmpfs at boot is still there.
func TestStateFromBeforeTheSnapshot(t *testing.T) {
	shared(t)
	info := create(t)
	tmpl, reason, err := testAgent.Templates().Lookup(testAgent.TemplateParams("tiny", 256, 1))
	if err != nil || reason != "" {
		t.Fatalf("template: %v %q", err, reason)
	}
	if got := strings.TrimSpace(sh(t, info.ID, "cat /proc/sys/kernel/random/boot_id")); got != tmpl.BootID {
		t.Errorf("boot id %q, want the template's %q", got, tmpl.BootID)
	}
	if got := sh(t, info.ID, "grep ' /run ' /proc/mounts | cut -d' ' -f3; test -x /run/panda-guest && echo agent-on-tmpfs"); got != "tmpfs\nagent-on-tmpfs\n" {
		t.Errorf("got %q", got)
	}
}

func TestSandboxesAreIsolated(t *testing.T) {
	shared(t)
	a, b := create(t), create(t)
	sh(t, a.ID, "echo mine > /root/a.txt; echo ram > /dev/shm/a")
	if got := sh(t, b.ID, "ls /root/a.txt /dev/shm/a 2>&1 || true"); !strings.Contains(got, "No such file") {
		t.Errorf("b sees a's files: %q", got)
	}
	if got := sh(t, a.ID, "cat /root/a.txt /dev/shm/a"); got != "mine\nram\n" {
		t.Errorf("a lost its own files: %q", got)
	}
	// Different random bytes right after restore (the RNG was reseeded).
	ra := sh(t, a.ID, "head -c 32 /dev/urandom | od -An -tx1")
	rb := sh(t, b.ID, "head -c 32 /dev/urandom | od -An -tx1")
	if ra == rb {
		t.Errorf("two sandboxes read the same random bytes: %s", ra)
	}
}

func TestFirstRandomBytesDiffer(t *testing.T) {
	shared(t)
	// The first read after restore is the one the reseed must fix.
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		info, err := testAgent.Create(ctxT(t), CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		r := sh(t, info.ID, "head -c 16 /dev/urandom | od -An -tx1")
		testAgent.Kill(context.Background(), info.ID)
		if seen[r] {
			t.Fatalf("random bytes repeated across sandboxes: %s", r)
		}
		seen[r] = true
	}
}

func TestClockIsSetOnRestore(t *testing.T) {
	shared(t)
	tmpl, _, _ := testAgent.Templates().Lookup(testAgent.TemplateParams("tiny", 256, 1))
	info := create(t)
	out := strings.TrimSpace(sh(t, info.ID, "date +%s"))
	guest, err := strconv.ParseInt(out, 10, 64)
	if err != nil {
		t.Fatalf("date: %q", out)
	}
	skew := time.Duration(time.Now().Unix()-guest) * time.Second
	t.Logf("template age %s, guest clock skew %s", time.Since(tmpl.BakedAt).Round(time.Second), skew)
	if skew > 2*time.Second || skew < -2*time.Second {
		t.Errorf("guest clock is %s off the host", skew)
	}
}

func TestExecTimeoutKillsProcessTree(t *testing.T) {
	shared(t)
	info := create(t)
	var out bytes.Buffer
	res, err := testAgent.Exec(ctxT(t), info.ID, guestproto.ExecRequest{
		Shell: "sleep 1000 & echo $!; wait", TimeoutMS: 500,
	}, nil, &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || res.Signal != "SIGKILL" {
		t.Errorf("got %+v, want a timeout", res)
	}
	child := strings.TrimSpace(out.String())
	if _, err := strconv.Atoi(child); err != nil {
		t.Fatalf("child pid %q", child)
	}
	if got := sh(t, info.ID, "kill -0 "+child+" 2>/dev/null && echo alive || echo gone"); got != "gone\n" {
		t.Errorf("background child of a timed-out command: %s", got)
	}
}

func TestOneGiBFileRoundTrip(t *testing.T) {
	shared(t)
	info := create(t)
	c, err := testAgent.Guest(info.ID)
	if err != nil {
		t.Fatal(err)
	}
	// A 1 GiB file on a 256 MiB guest: it cannot be held in memory. Under
	// TCG the serial channel moves 12-35 MB/s, so this takes a while.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	sum, err := guestprototest.VerifyFileRoundTrip(ctx, c, "/root/big.bin", 1<<30)
	t.Logf("sha256 %x", sum)
	if err != nil {
		t.Fatal(err)
	}
}

func TestKilledVMMIsDetectedAndCleanedUp(t *testing.T) {
	shared(t)
	info, err := testAgent.Create(ctxT(t), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(testAgent.sbDir, info.ID)
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("sandbox dir: %v", err)
	}
	if err := unix.Kill(info.PID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exits.wait(info.ID):
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not notice the VMM died")
	}
	if _, err := testAgent.Get(info.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after crash: %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sandbox files left after crash: %v", err)
	}
	if _, err := os.Stat(filepath.Join(testAgent.cfg.RunDir, info.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run dir left after crash: %v", err)
	}
}

func TestKillRemovesEverything(t *testing.T) {
	shared(t)
	info, err := testAgent.Create(ctxT(t), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if err := testAgent.Kill(ctxT(t), info.ID); err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(info.PID, 0); !errors.Is(err, unix.ESRCH) {
		t.Errorf("vmm %d still exists: %v", info.PID, err)
	}
	if _, err := os.Stat(filepath.Join(testAgent.sbDir, info.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("files left: %v", err)
	}
	if err := testAgent.Kill(ctxT(t), info.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("second kill: %v, want ErrNotFound", err)
	}
}

func TestBadRequests(t *testing.T) {
	shared(t)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name string
		req  CreateRequest
		want error
		text string
	}{
		{"unknown template", CreateRequest{Template: "nosuch"}, ErrNotFound, "available: "},
		{"bad template name", CreateRequest{Template: "Bad/Name"}, ErrInvalid, "template name"},
		{"too little memory", CreateRequest{MemoryMiB: 16}, ErrInvalid, "memory_mib"},
		{"bad id", CreateRequest{ID: "Not-Valid"}, ErrInvalid, "lowercase"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := testAgent.Create(ctx, tc.req)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
				t.Errorf("got %v, want %v mentioning %q", err, tc.want, tc.text)
			}
		})
	}
	if _, err := testAgent.Exec(ctx, "nosuchsandbox", guestproto.ExecRequest{Shell: "true"}, nil, nil, nil); !errors.Is(err, ErrNotFound) {
		t.Errorf("exec in unknown sandbox: %v", err)
	}
}

func TestMissingKernel(t *testing.T) {
	dir := t.TempDir()
	_, err := Open(context.Background(), Config{DataDir: dir, ImagesDir: filepath.Join(dir, "noimages"), Accel: "tcg"})
	if err == nil || !strings.Contains(err.Error(), "kernel") || !strings.Contains(err.Error(), "make setup") {
		t.Fatalf("got %v, want an error about the missing kernel and make setup", err)
	}
}

func TestFullDisk(t *testing.T) {
	testkit.VM(t)
	testkit.Root(t)
	dir, err := os.MkdirTemp("", "pfull")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	a, err := Open(ctxT(t), Config{DataDir: dir, ImagesDir: testkit.Images(), Accel: "tcg", VolumeSize: 1 << 30,
		DefaultTemplate: "tiny", DefaultMemoryMiB: 256, Driver: driverT(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// Bake first, then fill the volume up.
	if _, err := a.Templates().Get(ctxT(t), a.TemplateParams("", 0, 0), nil); err != nil {
		t.Fatal(err)
	}
	free := testkit.FreeBytes(t, a.StoreDir())
	f, err := os.Create(filepath.Join(a.StoreDir(), "filler"))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, free-64<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	_, err = a.Create(ctxT(t), CreateRequest{})
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "MiB free") {
		t.Fatalf("got %v, want ErrNoSpace saying how much is free", err)
	}
	if len(a.List()) != 0 {
		t.Errorf("a failed create left a sandbox: %+v", a.List())
	}
}

func TestConcurrentCreates(t *testing.T) {
	shared(t)
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	ids := make([]string, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			info, err := testAgent.Create(ctxT(t), CreateRequest{})
			errs[i], ids[i] = err, info.ID
		}()
	}
	wg.Wait()
	for i := range ids {
		if errs[i] != nil {
			t.Errorf("create %d: %v", i, errs[i])
			continue
		}
		if got := sh(t, ids[i], "hostname"); got != ids[i]+"\n" {
			t.Errorf("sandbox %s: hostname %q", ids[i], got)
		}
		testAgent.Kill(context.Background(), ids[i])
	}
}

// Sandboxes of one owner map the same memory image; sandboxes of different
// owners never share one (so they share no page cache page).
func TestMemoryIsSharedOnlyWithinAnOwner(t *testing.T) {
	shared(t)
	inode := func(owner string) (uint64, string) {
		info, err := testAgent.Create(ctxT(t), CreateRequest{Owner: owner})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { testAgent.Kill(context.Background(), info.ID) })
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(testAgent.sbDir, info.ID, "vm.mem"), &st); err != nil {
			t.Fatal(err)
		}
		return st.Ino, info.ID
	}
	a1, id := inode("keyalice")
	a2, _ := inode("keyalice")
	b1, _ := inode("keybob")
	none, _ := inode("")
	if a1 != a2 {
		t.Errorf("two sandboxes of one owner map different images (%d, %d)", a1, a2)
	}
	if a1 == b1 || b1 == none || a1 == none {
		t.Errorf("owners share a memory image: alice %d, bob %d, none %d", a1, b1, none)
	}
	if got := sh(t, id, "echo ok"); got != "ok\n" {
		t.Errorf("sandbox on an owner's copy: %q", got)
	}
	if _, err := testAgent.Create(ctxT(t), CreateRequest{Owner: "../etc"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad owner: %v, want ErrInvalid", err)
	}
}
