package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/internal/guestnet"
	"github.com/pandastack/pandastack/internal/hostagent/internal/memimage"
	"github.com/pandastack/pandastack/internal/hostagent/template"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// These tests run real QEMU guests confined, as root. A tiny 256 MiB
// template is baked once (by a confined driver: a cold boot with shared
// RAM and a console log) into a temporary directory.

var (
	bakeOnce sync.Once
	baked    *template.Template
	bakeErr  error
	bakeDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if bakeDir != "" {
		os.RemoveAll(bakeDir)
	}
	os.Exit(code)
}

// needRoot gates a test that confines VMMs (their own users, cgroups,
// namespaces) or reads what confinement made.
func needRoot(t testing.TB) {
	t.Helper()
	testkit.Root(t)
}

// needVM gates a test that boots confined guests.
func needVM(t testing.TB) {
	t.Helper()
	testkit.VM(t)
	testkit.Root(t)
}

// tiny returns the baked template, baking it on first use.
func tiny(t testing.TB) *template.Template {
	t.Helper()
	needVM(t)
	bakeOnce.Do(func() {
		bakeDir, bakeErr = os.MkdirTemp("", "pvq")
		if bakeErr != nil {
			return
		}
		var d *Driver
		d, bakeErr = New(Config{})
		if bakeErr != nil {
			return
		}
		var st *template.Store
		st, bakeErr = template.NewStore(template.Config{
			Dir: filepath.Join(bakeDir, "templates"), RunDir: bakeDir,
			Images: template.Images{Dir: testkit.Images()}, Driver: d, Accel: accel.TCG, TSCkHz: TSCkHz(),
		})
		if bakeErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		baked, bakeErr = st.Get(ctx, templates.Params{Name: "tiny", MemoryMiB: 256, VCPUs: 1}, nil)
	})
	if bakeErr != nil {
		t.Fatalf("bake tiny template confined: %v", bakeErr)
	}
	return baked
}

// testConfig is a driver configuration of the test's own: its own UID
// range, cgroup and host directory, so that tests of other packages
// running at the same time never share them.
func testConfig(t testing.TB, uids int) Config {
	t.Helper()
	needRoot(t)
	pid := os.Getpid()
	return Config{
		UIDBase:  1_600_000_000 + uint32(pid%100000)*16,
		UIDCount: uids,
		Cgroup:   fmt.Sprintf("pandatest%d-%s", pid, strings.ToLower(strings.NewReplacer("/", "-").Replace(t.Name()))),
		HostDir:  t.TempDir(),
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

// newDriver returns a driver for cfg and removes its parent cgroups when
// the test ends (after the machines' cleanups, registered later).
func newDriver(t testing.TB, cfg Config) *Driver {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d.cgroups == nil || cfg.Cgroup == "" || cfg.Cgroup == DefaultCgroup {
		return d
	}
	parents := slices.Clone(d.cgroups.parents) // a test may swap d.cgroups
	t.Cleanup(func() {
		for _, p := range parents {
			if err := os.Remove(p.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
				t.Errorf("remove test cgroup: %v", err)
			}
		}
	})
	return d
}

// shortDir is a temporary directory short enough for unix socket paths.
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "pvm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// vm is a running test machine.
type vm struct {
	m      *Machine
	spec   vmm.Spec
	client *guestproto.Client
}

// files are what a restore needs: a memory image, device state, a disk.
type files struct{ mem, state, disk string }

func templateFiles(t testing.TB) files {
	tp := tiny(t)
	return files{tp.MemFile(), tp.StateFile(), tp.RootFS()}
}

// restore starts a machine on d from f (memory hard-linked, disk copied),
// loads its state, resumes it and says HELLO. The machine is killed when
// the test ends.
func restore(t testing.TB, d *Driver, f files, gid uint32) *vm {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v := startIncoming(t, d, f, gid)
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", v.m.AgentSocket())
	if err != nil {
		t.Fatal(err)
	}
	v.client = guestproto.NewClient(conn)
	t.Cleanup(func() { v.client.Close() })
	if err := v.m.LoadState(ctx, f.state); err != nil {
		t.Fatal(err)
	}
	if err := v.m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := v.client.Hello(ctx, guestproto.HelloRequest{Hostname: "confined"}); err != nil {
		t.Fatalf("hello: %v", err)
	}
	return v
}

// startIncoming starts a machine waiting for its state, without loading it.
func startIncoming(t testing.TB, d *Driver, f files, gid uint32) *vm {
	t.Helper()
	dir := shortDir(t)
	spec := tiny(t).Spec(template.Images{Dir: testkit.Images()})
	spec.RunDir = filepath.Join(dir, "run")
	spec.Disk = filepath.Join(dir, "disk")
	spec.MemoryFile = filepath.Join(dir, "mem")
	spec.GID = gid
	if err := os.Mkdir(spec.RunDir, 0o755); err != nil {
		t.Fatal(err)
	}
	testkit.CopySparse(t, f.disk, spec.Disk)
	if err := os.Link(f.mem, spec.MemoryFile); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spec = withNIC(t, spec)
	m, err := d.Start(ctx, spec)
	// The VMM has its own copy: the TAP and its namespace live as long
	// as the VMM.
	spec.Net.TAP.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Kill() })
	return &vm{m: m.(*Machine), spec: spec}
}

// withNIC returns spec with a network interface of its own: a TAP device
// in an isolated namespace (guestnet.Isolated), closed when the test ends
// if the test has not closed it.
func withNIC(t testing.TB, spec vmm.Spec) vmm.Spec {
	t.Helper()
	if spec.Net == nil {
		t.Fatal("the template has no network interface")
	}
	nic, err := guestnet.Isolated()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nic.TAP.Close() })
	spec.Net = &vmm.Net{TAP: nic.TAP, MAC: spec.Net.MAC}
	return spec
}

func (v *vm) sh(t testing.TB, cmd string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	r, err := v.client.Exec(ctx, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", cmd}}, nil, &out, &errb)
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("guest %q: exit %d, %v: %s", cmd, r.ExitCode, err, errb.String())
	}
	return out.String()
}

// procStatus reads the fields of /proc/PID/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok {
			out[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	return out
}

func TestConfinedMachine(t *testing.T) {
	needVM(t)
	d := newDriver(t, Config{})
	const gid = 1_600_999_001
	v := restore(t, d, templateFiles(t), gid)
	pid := v.m.PID()
	uid := v.m.UID()

	t.Run("guest", func(t *testing.T) {
		if got := strings.TrimSpace(v.sh(t, "echo $((6*7))")); got != "42" {
			t.Errorf("guest computed %q, want 42", got)
		}
	})
	t.Run("credentials", func(t *testing.T) {
		if uid < DefaultUIDBase || uid >= DefaultUIDBase+DefaultUIDCount {
			t.Fatalf("UID() = %d, want one in [%d, %d)", uid, DefaultUIDBase, DefaultUIDBase+DefaultUIDCount)
		}
		st := procStatus(t, pid)
		u := strconv.Itoa(uid)
		if want := strings.Join([]string{u, u, u, u}, " "); st["Uid"] != want {
			t.Errorf("Uid: %q, want %q", st["Uid"], want)
		}
		g := strconv.Itoa(gid)
		if want := strings.Join([]string{g, g, g, g}, " "); st["Gid"] != want {
			t.Errorf("Gid: %q, want %q", st["Gid"], want)
		}
		if st["Groups"] != "" {
			t.Errorf("supplementary groups %q, want none", st["Groups"])
		}
		if st["CapEff"] != "0000000000000000" || st["CapPrm"] != "0000000000000000" {
			t.Errorf("capabilities: effective %s permitted %s, want none", st["CapEff"], st["CapPrm"])
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			t.Fatal(err) // an empty answer must mean an empty environment
		}
		if len(env) != 0 {
			t.Errorf("environment %q, want empty", env)
		}
	})
	t.Run("files", func(t *testing.T) {
		for _, c := range []struct {
			path     string
			uid, gid int
			mode     os.FileMode
		}{
			{v.spec.Disk, uid, gid, 0o600},
			{v.spec.RunDir, 0, 0, 0o700 | os.ModeDir},
			{v.spec.MemoryFile, 0, gid, 0o660},
		} {
			st, err := os.Stat(c.path)
			if err != nil {
				t.Fatal(err)
			}
			sys := st.Sys().(*syscall.Stat_t)
			if int(sys.Uid) != c.uid || int(sys.Gid) != c.gid || st.Mode() != c.mode {
				t.Errorf("%s: %d:%d %v, want %d:%d %v", filepath.Base(c.path), sys.Uid, sys.Gid, st.Mode(), c.uid, c.gid, c.mode)
			}
		}
	})
	t.Run("namespaces", func(t *testing.T) {
		for _, ns := range []string{"mnt", "net", "ipc", "pid"} {
			mine, _ := os.Readlink("/proc/self/ns/" + ns)
			its, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
			if err != nil || its == mine {
				t.Errorf("vmm %s namespace %q (%v), the test's %q: want a different one", ns, its, err, mine)
			}
		}
		// PID 1 of its own PID namespace, known to the host by pid.
		if got, want := procStatus(t, pid)["NSpid"], strconv.Itoa(pid)+" 1"; got != want {
			t.Errorf("NSpid: %q, want %q", got, want)
		}
	})
	t.Run("empty network namespace", func(t *testing.T) {
		links, routes := netnsContents(t, pid)
		if len(links) != 1 || links[0].Attrs().Name != "lo" || links[0].Attrs().Flags&net.FlagUp != 0 {
			var got []string
			for _, l := range links {
				got = append(got, l.Attrs().Name+" "+l.Attrs().Flags.String())
			}
			t.Errorf("vmm network namespace has links %q, want only lo, down", got)
		}
		if len(routes) != 0 {
			t.Errorf("vmm network namespace has routes %v, want none", routes)
		}
	})
	t.Run("escape to the host's network", func(t *testing.T) {
		// What a process that took QEMU over could reach: a service on
		// the host's loopback and an abstract unix socket (named per
		// network namespace), both of the test's namespace. The test
		// reaches both; from the VMM's namespace neither answers.
		tcp, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer tcp.Close()
		abstract, err := net.Listen("unix", fmt.Sprintf("@pandastack-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
		if err != nil {
			t.Fatal(err)
		}
		defer abstract.Close()
		targets := []struct{ network, addr string }{
			{"tcp4", tcp.Addr().String()},
			{"unix", abstract.Addr().String()},
		}
		dial := func(network, addr string) error {
			c, err := net.DialTimeout(network, addr, 5*time.Second)
			if err == nil {
				c.Close()
			}
			return err
		}
		for _, tg := range targets {
			if err := dial(tg.network, tg.addr); err != nil {
				t.Fatalf("the test cannot reach its own %s %s: %v", tg.network, tg.addr, err)
			}
		}
		err = inNamespaceOf(pid, "net", unix.CLONE_NEWNET, func() error {
			for _, tg := range targets {
				if err := dial(tg.network, tg.addr); err == nil {
					t.Errorf("from the vmm's network namespace, %s %s answered: want no way there", tg.network, tg.addr)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("escape to the host's ipc", func(t *testing.T) {
		// A System V shared memory segment of the test's: invisible in
		// the VMM's IPC namespace.
		key := int((uint32(os.Getpid())*2654435761^uint32(time.Now().UnixNano()))&0x7fffffff | 1)
		id, err := unix.SysvShmGet(key, 4096, unix.IPC_CREAT|unix.IPC_EXCL|0o600)
		if err != nil {
			t.Fatalf("shmget: %v", err)
		}
		defer unix.SysvShmCtl(id, unix.IPC_RMID, nil)
		if _, err := unix.SysvShmGet(key, 0, 0); err != nil {
			t.Fatalf("the test cannot find its own segment: %v", err)
		}
		err = inNamespaceOf(pid, "ipc", unix.CLONE_NEWIPC, func() error {
			if _, err := unix.SysvShmGet(key, 0, 0); !errors.Is(err, unix.ENOENT) {
				t.Errorf("from the vmm's ipc namespace, the host's segment: %v, want ENOENT", err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	t.Run("root", func(t *testing.T) {
		root := fmt.Sprintf("/proc/%d/root", pid)
		want := []string{"dev", "etc", "vm"}
		for _, r := range d.root {
			want = append(want, strings.TrimPrefix(r.name, "/"))
		}
		for dir, w := range map[string][]string{
			"/":    want,
			"/etc": {"ld.so.cache"},
			"/dev": {"null", "random", "urandom", "zero"},
			"/vm":  {"disk", "mem"},
		} {
			ents, err := os.ReadDir(filepath.Join(root, dir))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range ents {
				got = append(got, e.Name())
			}
			slices.Sort(got)
			slices.Sort(w)
			if !slices.Equal(got, w) {
				t.Errorf("jail %s holds %q, want %q", dir, got, w)
			}
		}
		for _, p := range []string{"/etc/shadow", "/root", "/proc", "/sys", "/tmp", v.spec.Disk, testkit.Images()} {
			if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("jail has %s (%v)", p, err)
			}
		}
		// The sockets are the host's, in the run directory, handed to
		// QEMU as descriptors.
		for fd, path := range map[int]string{agentFD: agentSocket(v.spec.RunDir), qmpFD: qmpSocket(v.spec.RunDir)} {
			var st, its unix.Stat_t
			if err := unix.Stat(path, &st); err != nil || st.Uid != 0 || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
				t.Errorf("%s: %+v, %v; want a socket of root's", path, st, err)
			}
			if err := unix.Stat(fmt.Sprintf("/proc/%d/fd/%d", pid, fd), &its); err != nil || its.Mode&unix.S_IFMT != unix.S_IFSOCK {
				t.Errorf("vmm fd %d: %v; want the listening socket of %s", fd, err, path)
			}
		}
		// Read-only where it must be: the jail root and /usr.
		for _, p := range []string{"/", "/usr"} {
			var st unix.Statfs_t
			if err := unix.Statfs(filepath.Join(root, p), &st); err != nil || st.Flags&unix.ST_RDONLY == 0 {
				t.Errorf("jail %s is not read-only (flags %#x, %v)", p, st.Flags, err)
			}
		}
	})
	t.Run("mounts", func(t *testing.T) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.Fields(line)
			got = append(got, f[4])
		}
		want := []string{"/", "/etc/ld.so.cache", "/vm/disk", "/vm/mem"}
		for _, r := range d.root {
			if r.symlink == "" {
				want = append(want, r.name)
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("vmm mount namespace holds %q, want exactly %q", got, want)
		}
	})
	t.Run("cgroup", func(t *testing.T) {
		cg := v.m.box.cg
		if cg == nil || len(cg.dirs) == 0 {
			t.Fatal("machine has no cgroup")
		}
		for _, dir := range cg.dirs {
			if filepath.Base(dir) != "vm-"+strconv.Itoa(uid) {
				t.Errorf("cgroup %s is not named after UID %d", dir, uid)
			}
			procs, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			if strings.TrimSpace(string(procs)) != strconv.Itoa(pid) {
				t.Errorf("%s holds %q, want only the vmm %d", dir, procs, pid)
			}
		}
		read := func(file string) string {
			for _, dir := range cg.dirs {
				if b, err := os.ReadFile(filepath.Join(dir, file)); err == nil {
					return strings.TrimSpace(string(b))
				}
			}
			t.Errorf("no cgroup file %s", file)
			return ""
		}
		mem := strconv.Itoa((256 + DefaultMemoryOverheadMiB) << 20)
		if d.cgroups.v2 {
			for file, want := range map[string]string{"cpu.max": "100000 100000", "memory.max": mem, "pids.max": "256"} {
				if got := read(file); got != want {
					t.Errorf("%s = %q, want %q", file, got, want)
				}
			}
		} else {
			for file, want := range map[string]string{"cpu.cfs_quota_us": "100000", "cpu.cfs_period_us": "100000", "memory.limit_in_bytes": mem, "pids.max": "256"} {
				if got := read(file); got != want {
					t.Errorf("%s = %q, want %q", file, got, want)
				}
			}
		}
	})
	t.Run("rlimits", func(t *testing.T) {
		st, err := os.Stat(v.spec.Disk) // tiny's disk (2 GiB) is larger than its RAM
		if err != nil {
			t.Fatal(err)
		}
		diskSize := st.Size()
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
		if err != nil {
			t.Fatal(err)
		}
		for name, want := range map[string]string{
			"Max core file size": "0 0",
			"Max open files":     "1024 1024",
			"Max processes":      "256 256",
			"Max locked memory":  "0 0",
			"Max file size":      fmt.Sprintf("%d %d", diskSize, diskSize),
		} {
			got := ""
			for _, line := range strings.Split(string(b), "\n") {
				if rest, ok := strings.CutPrefix(line, name+" "); ok {
					if f := strings.Fields(rest); len(f) >= 2 {
						got = f[0] + " " + f[1]
					}
				}
			}
			if got != want {
				t.Errorf("%s: soft and hard %q, want %q", name, got, want)
			}
		}
	})
	t.Run("no huge pages", func(t *testing.T) {
		// The driver turned THP off for itself; its VMMs inherit it.
		if st := procStatus(t, pid); st["THP_enabled"] != "0" {
			t.Errorf("THP_enabled: %q, want 0", st["THP_enabled"])
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "AnonHugePages:" && f[1] != "0" {
				t.Errorf("the vmm has %s kB in anonymous huge pages", f[1])
			}
		}
	})
	t.Run("no announce", func(t *testing.T) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if !bytes.Contains(cmdline, []byte("-global\x00migration.announce-rounds=0")) {
			t.Errorf("command line lacks announce-rounds=0: %q", cmdline)
		}
	})
	t.Run("ksm off", func(t *testing.T) {
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		for _, want := range []string{"mem-merge=off", ",merge=off", "-sandbox\x00on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"} {
			if !bytes.Contains(cmdline, []byte(want)) {
				t.Errorf("command line lacks %q", want)
			}
		}
		// QEMU applies merge=off with madvise(MADV_UNMERGEABLE), which
		// leaves no trace unless KSM merged; smaps shows no VM_MERGEABLE
		// ("mg") on guest RAM.
		r, err := v.m.RAMMapping()
		if err != nil {
			t.Fatal(err)
		}
		if flags := vmFlags(t, pid, r.Start); strings.Contains(flags, " mg") {
			t.Errorf("guest RAM is mergeable: %q", flags)
		}
	})
}

// inNamespaceOf runs fn on an OS thread that has entered the namespace
// kind ("net", "ipc": one a thread may enter alone) of process pid; the
// thread is discarded afterwards.
func inNamespaceOf(pid int, kind string, nstype int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Not unlocked: the runtime ends the thread with the goroutine.
		runtime.LockOSThread()
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/%s", pid, kind), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, nstype); err != nil {
			errc <- fmt.Errorf("enter the %s namespace of %d: %w", kind, pid, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// netnsContents lists the links and routes of pid's network namespace.
func netnsContents(t *testing.T, pid int) ([]netlink.Link, []netlink.Route) {
	t.Helper()
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	return links, routes
}

// vmFlags returns the VmFlags of the mapping that starts at start.
func vmFlags(t *testing.T, pid int, start uint64) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		t.Fatal(err)
	}
	in := false
	prefix := strconv.FormatUint(start, 16) + "-"
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			in = strings.HasPrefix(line, prefix)
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			return strings.TrimPrefix(line, "VmFlags:") + " "
		}
	}
	t.Fatalf("no mapping at %#x in smaps", start)
	return ""
}

// TestSaveLoadRoundTrip captures a confined machine as the host agent's
// fork does (device state through add-fd, dirty pages of the RAM mapping)
// and restores a second confined machine from it: it must continue with
// what the first wrote in RAM.
func TestSaveLoadRoundTrip(t *testing.T) {
	needVM(t)
	d := newDriver(t, Config{})
	f := templateFiles(t)
	a := restore(t, d, f, 0)
	marker := fmt.Sprintf("marker-%d", time.Now().UnixNano())
	a.sh(t, "echo "+marker+" > /dev/shm/m")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.client.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	capDir := shortDir(t)
	c := files{mem: filepath.Join(capDir, "mem"), state: filepath.Join(capDir, "state"), disk: filepath.Join(capDir, "disk")}
	if err := a.m.SaveState(ctx, c.state); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(c.state); err != nil || st.Size() < 1024 || st.Mode() != 0o600 {
		t.Fatalf("saved state: %v, %v", st, err)
	}
	r, err := a.m.RAMMapping()
	if err != nil {
		t.Fatal(err)
	}
	if r.Size != 256<<20 || r.PID != a.m.PID() {
		t.Fatalf("RAMMapping: %+v", r)
	}
	region := memimage.Region{PID: r.PID, Start: r.Start, Size: r.Size}
	pm, err := memimage.Scan(region)
	if err != nil {
		t.Fatal(err)
	}
	if pm.DirtyBytes == 0 {
		t.Fatal("no dirty pages found in guest RAM: RAMMapping is not the guest's RAM")
	}
	copyFile := func(src, dst string) error {
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(dst)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	}
	if _, err := memimage.Write(c.mem, a.spec.MemoryFile, copyFile, region, pm.Dirty); err != nil {
		t.Fatal(err)
	}
	testkit.CopySparse(t, a.spec.Disk, c.disk)
	// The first machine keeps running, with what it had.
	if err := a.m.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.client.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	b := restore(t, d, c, 0)
	if got := strings.TrimSpace(b.sh(t, "cat /dev/shm/m")); got != marker {
		t.Errorf("restored machine read %q from RAM, want %q", got, marker)
	}
	if got := strings.TrimSpace(a.sh(t, "cat /dev/shm/m")); got != marker {
		t.Errorf("first machine read %q after the save, want %q", got, marker)
	}
	if a.m.UID() == b.m.UID() {
		t.Errorf("two live machines share UID %d", a.m.UID())
	}
}

// gone reports what a machine left: its process, its cgroups, its mounts.
func assertGone(t *testing.T, d *Driver, m *Machine, dirs []string) {
	t.Helper()
	select {
	case <-m.Done():
	default:
		t.Fatal("Done not closed")
	}
	if err := unix.Kill(m.PID(), 0); !errors.Is(err, unix.ESRCH) {
		t.Errorf("vmm process %d still exists (kill 0: %v)", m.PID(), err)
	}
	for _, dir := range dirs {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s left behind (%v)", dir, err)
		}
	}
	if d.uids.inUse(uint32(m.UID())) {
		t.Errorf("UID %d still in use", m.UID())
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err) // an empty table would hide a mount left behind
	}
	for _, s := range []string{d.jailDir, m.spec.RunDir, filepath.Dir(m.spec.Disk), "panda-vm"} {
		if bytes.Contains(mi, []byte(s)) {
			t.Errorf("a mount of %s is in the test's mount table", s)
		}
	}
	for _, f := range []string{agentSocket(m.spec.RunDir), qmpSocket(m.spec.RunDir)} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind", f)
		}
	}
}

func TestKillLeavesNothing(t *testing.T) {
	needVM(t)
	d := newDriver(t, testConfig(t, 4))
	f := templateFiles(t)
	v := startIncoming(t, d, f, 0)
	dirs := slices.Clone(v.m.box.cg.dirs)
	// Nothing on the host while it runs either.
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err) // an empty table would hide a mount left behind
	}
	if bytes.Contains(mi, []byte(d.jailDir)) || bytes.Contains(mi, []byte("panda-vm")) {
		t.Errorf("the jail of a running vmm is in the host's mount table:\n%s", mi)
	}
	if err := v.m.Kill(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, d, v.m, dirs)

	// A VMM that dies on its own is cleaned up the same way.
	w := startIncoming(t, d, f, 0)
	dirs = slices.Clone(w.m.box.cg.dirs)
	if err := unix.Kill(w.m.PID(), unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-w.m.Done()
	if w.m.ExitError() == nil {
		t.Error("ExitError is nil after the vmm was killed from outside")
	}
	os.Remove(agentSocket(w.spec.RunDir)) // Kill would; nobody called it
	os.Remove(qmpSocket(w.spec.RunDir))
	assertGone(t, d, w.m, dirs)
}

func TestUIDReusedOnlyAfterRelease(t *testing.T) {
	needVM(t)
	cfg := testConfig(t, 2)
	d := newDriver(t, cfg)
	f := templateFiles(t)
	a := startIncoming(t, d, f, 0)
	b := startIncoming(t, d, f, 0)
	if a.m.UID() == b.m.UID() {
		t.Fatalf("two machines got UID %d", a.m.UID())
	}
	for _, u := range []int{a.m.UID(), b.m.UID()} {
		if u < int(cfg.UIDBase) || u >= int(cfg.UIDBase)+cfg.UIDCount {
			t.Errorf("UID %d outside the configured range", u)
		}
	}
	// Both UIDs taken: a third machine must fail, not share one.
	dir := shortDir(t)
	spec := withNIC(t, a.spec)
	spec.RunDir = dir
	spec.Disk = filepath.Join(dir, "disk")
	testkit.CopySparse(t, f.disk, spec.Disk)
	if m, err := d.Start(context.Background(), spec); !errors.Is(err, vmm.ErrExhausted) {
		if err == nil {
			m.Kill()
		}
		t.Fatalf("third start with 2 UIDs: %v, want ErrExhausted", err)
	}
	released := a.m.UID()
	a.m.Kill()
	c := startIncoming(t, d, f, 0)
	if c.m.UID() != released {
		t.Errorf("after release got UID %d, want the released %d", c.m.UID(), released)
	}
}

func TestAdopt(t *testing.T) {
	needVM(t)
	cfg := testConfig(t, 3)
	d1 := newDriver(t, cfg)
	v := restore(t, d1, templateFiles(t), 0)
	dirs := slices.Clone(v.m.box.cg.dirs)

	// A restarted host agent: its QMP connection is gone (QEMU serves one
	// at a time), and a new driver adopts the running VMM.
	v.m.qmp.Close()
	d2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := d2.Adopt(ctx, v.spec)
	if err != nil {
		t.Fatal(err)
	}
	am := m.(*Machine)
	if am.UID() != v.m.UID() || !d2.uids.inUse(uint32(am.UID())) {
		t.Errorf("adopted UID %d (in use: %v), want %d marked in use", am.UID(), d2.uids.inUse(uint32(am.UID())), v.m.UID())
	}
	if am.box == nil || am.box.cg == nil || !slices.Equal(am.box.cg.dirs, dirs) {
		t.Errorf("adopted machine does not own cgroup %q", dirs)
	}
	left, err := d2.CleanupStale()
	if err != nil || len(left.Orphans) != 0 || len(left.Removed) != 0 {
		t.Errorf("CleanupStale after adoption: %+v, %v; want nothing", left, err)
	}
	// It works through the new driver: save state and find its RAM.
	if err := am.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := am.SaveState(ctx, filepath.Join(shortDir(t), "state")); err != nil {
		t.Fatal(err)
	}
	if _, err := am.RAMMapping(); err != nil {
		t.Error(err)
	}

	// Adopt refuses a process that is not the VMM of the run directory.
	other := shortDir(t)
	os.WriteFile(PIDFile(other), []byte(strconv.Itoa(v.m.PID())), 0o644)
	spec := v.spec
	spec.RunDir = other
	if m, err := d2.Adopt(ctx, spec); !errors.Is(err, vmm.ErrExited) {
		if err == nil {
			m.Kill()
		}
		t.Errorf("adopting another machine's vmm: %v, want ErrExited", err)
	}

	am.Kill()
	<-v.m.Done()
	assertGone(t, d2, am, dirs)
}

func TestCleanupStale(t *testing.T) {
	needVM(t)
	cfg := testConfig(t, 4)
	d := newDriver(t, cfg)
	live := startIncoming(t, d, templateFiles(t), 0)

	// A cgroup left by a crashed agent, with no process, and one holding
	// a process that nobody adopted.
	stale := d.cgroups.of(cfg.UIDBase + 2)
	orphan := d.cgroups.of(cfg.UIDBase + 3)
	for _, c := range []*vmCgroup{stale, orphan} {
		for _, dir := range c.dirs {
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(func() { stale.remove(); orphan.remove() })
	sleep := exec.Command("sleep", "600")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sleep.Process.Kill(); sleep.Wait() })
	for _, dir := range orphan.dirs {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(sleep.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
	}

	// The driver that owns live sees only the process it does not own.
	left, err := d.CleanupStale()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(left.Removed)
	want := slices.Clone(stale.dirs)
	slices.Sort(want)
	if !slices.Equal(left.Removed, want) {
		t.Errorf("removed %q, want %q", left.Removed, want)
	}
	if wantO := []Orphan{{PID: sleep.Process.Pid}}; !slices.Equal(left.Orphans, wantO) {
		t.Errorf("orphans %+v, want %+v", left.Orphans, wantO)
	}
	// A restarted agent that adopted nothing sees live as an orphan VMM,
	// with its run directory.
	d2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	left, err = d2.CleanupStale()
	if err != nil || len(left.Removed) != 0 {
		t.Errorf("second cleanup removed %q, %v", left.Removed, err)
	}
	wantO := []Orphan{{PID: sleep.Process.Pid}, {PID: live.m.PID(), RunDir: live.spec.RunDir}}
	sortO := func(o []Orphan) { slices.SortFunc(o, func(a, b Orphan) int { return a.PID - b.PID }) }
	sortO(left.Orphans)
	sortO(wantO)
	if !slices.Equal(left.Orphans, wantO) {
		t.Errorf("orphans seen by a new driver %+v, want %+v", left.Orphans, wantO)
	}
	for _, dir := range append(slices.Clone(live.m.box.cg.dirs), orphan.dirs...) {
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("CleanupStale removed %s: %v", dir, err)
		}
	}
	// Stale cgroups hold their UID until cleaned: the orphan's is skipped.
	next := startIncoming(t, d, templateFiles(t), 0)
	if next.m.UID() != int(cfg.UIDBase+1) && next.m.UID() != int(cfg.UIDBase+2) {
		t.Errorf("start after cleanup got UID %d, want %d or %d", next.m.UID(), cfg.UIDBase+1, cfg.UIDBase+2)
	}

	sleep.Process.Kill()
	sleep.Wait()
	left, err = d.CleanupStale()
	if err != nil || !slices.Contains(left.Removed, orphan.dirs[0]) || len(left.Orphans) != 0 {
		t.Errorf("after the orphan exited: %+v, %v; want its cgroup removed", left, err)
	}
}

// TestColdBoot boots a template's way (kernel, shared RAM, console log):
// the bake in tiny() did so confined; check the console log it left.
func TestColdBootConsoleLog(t *testing.T) {
	tp := tiny(t)
	log := filepath.Join(tp.Dir, "console.log")
	st, err := os.Stat(log)
	if err != nil {
		t.Fatalf("the confined bake kept no console log: %v", err)
	}
	sys := st.Sys().(*syscall.Stat_t)
	if sys.Uid < DefaultUIDBase || sys.Uid >= DefaultUIDBase+DefaultUIDCount || st.Mode() != 0o600 {
		t.Errorf("console log %d:%d %v, want a vmm user's, 0600", sys.Uid, sys.Gid, st.Mode())
	}
	if st.Size() == 0 {
		t.Error("confined cold boot wrote nothing to the console log")
	}
}

// TestProbeKVMConfined runs the KVM canary confined: its verdict must be
// the one QEMU gets unconfined on this host, so the jail never costs a
// host its KVM. Where KVM boots guests both say so; on a nested PVM host
// the kernel hangs in both ("within"), which it can only do after QEMU
// opened the jail's /dev/kvm; on a host where QEMU cannot even start a
// KVM vCPU (it fails to set an MSR) both exit at once, and the confined
// one must not have failed to open the module.
func TestProbeKVMConfined(t *testing.T) {
	needVM(t)
	if _, err := os.Stat("/dev/kvm"); err != nil {
		t.Skip("no /dev/kvm")
	}
	kernel := template.Images{Dir: testkit.Images()}.Kernel()
	cfg := testConfig(t, 1)
	var logs bytes.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	d := newDriver(t, cfg)
	ok, reason := d.ProbeKVM(context.Background(), kernel, 3*time.Second)
	free := testConfig(t, 1)
	free.NoConfine = true
	okFree, reasonFree := newDriver(t, free).ProbeKVM(context.Background(), kernel, 3*time.Second)
	hung, hungFree := strings.Contains(reason, "within"), strings.Contains(reasonFree, "within")
	if ok != okFree || hung != hungFree {
		t.Errorf("ProbeKVM confined: %v %q; unconfined: %v %q: the jail changes the verdict", ok, reason, okFree, reasonFree)
	}
	if strings.Contains(reason, "could not open /dev/kvm") {
		t.Errorf("ProbeKVM confined: %q: no /dev/kvm in the jail", reason)
	}
	// What QEMU wrote goes to the debug log, never into the reason, which
	// panda up logs at start (an assertion of QEMU's flooded the terminal).
	if strings.Contains(reason, "qemu-system") || strings.Contains(reason, "Assertion") {
		t.Errorf("ProbeKVM reason %q holds QEMU's error output", reason)
	}
	if strings.Contains(reason, "qemu exited") && !strings.Contains(logs.String(), "level=DEBUG msg=\"kvm probe: qemu exited\" stderr=") {
		t.Errorf("QEMU exited (%q), but its error output was not logged at debug level:\n%s", reason, logs.String())
	}
	t.Logf("confined: %v %q; unconfined: %v %q", ok, reason, okFree, reasonFree)
	if got := d.cgroups.existing(); len(got) != 0 {
		t.Errorf("probe left cgroups %v", got)
	}
}

// TestCgroupV2 starts a machine in a cgroup v2 hierarchy when there is
// one (on a v1 host, the hybrid "unified" mount without controllers: the
// limits cannot be tested there, CLONE_INTO_CGROUP can).
func TestCgroupV2(t *testing.T) {
	needVM(t)
	cfg := testConfig(t, 1)
	d := newDriver(t, cfg)
	if !d.cgroups.v2 {
		mounts, _ := readMountInfo()
		own, _ := ownCgroups()
		var set *cgroupSet
		for _, m := range mounts {
			if m.fstype == "cgroup2" && own[""] != "" {
				var err error
				set, err = setupV2(within(m.point, m.root, own[""]), cfg.Cgroup, map[string]bool{})
				if err != nil {
					t.Fatal(err)
				}
				break
			}
		}
		if set == nil {
			t.Skip("no cgroup v2 hierarchy")
		}
		t.Cleanup(func() { os.Remove(set.parents[0].dir) })
		d.cgroups = set
	}
	v := startIncoming(t, d, templateFiles(t), 0)
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", v.m.PID()))
	dir := v.m.box.cg.dirs[0]
	if !strings.Contains(string(b), "0::") || !strings.HasSuffix(dir, "/vm-"+strconv.Itoa(v.m.UID())) ||
		!strings.Contains(string(b), "/"+cfg.Cgroup+"/vm-"+strconv.Itoa(v.m.UID())+"\n") {
		t.Errorf("vmm cgroups:\n%s\nwant it in %s", b, dir)
	}
	// CLONE_INTO_CGROUP and the namespaces' clone flags, in one clone3.
	for _, ns := range []string{"net", "ipc", "pid"} {
		mine, _ := os.Readlink("/proc/self/ns/" + ns)
		if its, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", v.m.PID(), ns)); err != nil || its == mine {
			t.Errorf("vmm %s namespace %q (%v), the test's %q: want a different one", ns, its, err, mine)
		}
	}
	v.m.Kill()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup %s left: %v", dir, err)
	}
}

func TestCgroupLimitFiles(t *testing.T) {
	needRoot(t)
	lim := cgroupLimits{cpuQuotaUs: 200000, memBytes: 768 << 20, pids: 99}
	all := map[string]bool{"cpu": true, "memory": true, "pids": true}
	for _, c := range []struct {
		name string
		v2   bool
		want map[string]string // controller/file → content
	}{
		{"v2", true, map[string]string{"/cpu.max": "200000 100000", "/memory.max": "805306368", "/pids.max": "99"}},
		{"v1", false, map[string]string{"cpu/cpu.cfs_quota_us": "200000", "cpu/cpu.cfs_period_us": "100000",
			"memory/memory.limit_in_bytes": "805306368", "pids/pids.max": "99"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			set := &cgroupSet{v2: c.v2, limit: all}
			if c.v2 {
				set.parents = []cgroupParent{{dir: root}}
			} else {
				for _, ctl := range cgroupControllers {
					os.Mkdir(filepath.Join(root, ctl), 0o755)
					set.parents = append(set.parents, cgroupParent{controller: ctl, dir: filepath.Join(root, ctl)})
				}
			}
			cg, err := set.create(7, lim)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := set.create(7, lim); !errors.Is(err, errCgroupTaken) {
				t.Errorf("second create of one UID: %v, want errCgroupTaken", err)
			}
			for file, want := range c.want {
				ctl, name, _ := strings.Cut(file, "/")
				b, err := os.ReadFile(filepath.Join(root, ctl, "vm-7", name))
				if err != nil || string(b) != want {
					t.Errorf("%s: %q, %v; want %q", file, b, err, want)
				}
			}
			if len(cg.dirs) != len(set.parents) {
				t.Errorf("dirs %q", cg.dirs)
			}
		})
	}
}

// TestSetupV2Files checks the delegation setupV2 writes (on a plain
// directory: this host has no cgroup v2 controllers to delegate).
func TestSetupV2Files(t *testing.T) {
	needRoot(t)
	self := t.TempDir()
	set, err := setupV2(self, "vms", map[string]bool{"cpu": true, "memory": true, "pids": true})
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{self, filepath.Join(self, "vms")} {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
		if err != nil || string(b) != "+cpu +memory +pids" {
			t.Errorf("%s/cgroup.subtree_control: %q, %v; want the three controllers enabled", dir, b, err)
		}
	}
	if !set.v2 || len(set.parents) != 1 || set.parents[0].dir != filepath.Join(self, "vms") {
		t.Errorf("set %+v", set)
	}
}

func TestIsVMMOf(t *testing.T) {
	d := &Driver{}
	spec := vmm.Spec{RunDir: "/x/run,1", MemoryMiB: 256, VCPUs: 1, Accel: accel.TCG, Incoming: true}
	args, err := d.args(spec, jailPaths(spec))
	if err != nil {
		t.Fatal(err)
	}
	cmdline := []byte("/usr/bin/qemu\x00" + strings.Join(args, "\x00") + "\x00")
	legacy := []byte("qemu\x00-qmp\x00unix:/x/run,,1/qmp.sock,server=on,wait=off\x00")
	for _, c := range []struct {
		cmdline []byte
		runDir  string
		want    bool
	}{
		{cmdline, "/x/run,1", true},
		{cmdline, "/x/run", false},
		{cmdline, "/x/run,1/", false},
		{legacy, "/x/run,1", true},
		{legacy, "/x/run", false},
	} {
		if got := isVMMOf(c.cmdline, c.runDir); got != c.want {
			t.Errorf("isVMMOf(%q, %q) = %v, want %v", c.cmdline, c.runDir, got, c.want)
		}
	}
	if got := runDirOf(cmdline); got != "/x/run,1" {
		t.Errorf("runDirOf = %q, want /x/run,1", got)
	}
}

// TestUnconfined: the debugging switch still runs machines, as root, in
// the host's namespace, with save/load through file descriptors.
func TestUnconfined(t *testing.T) {
	needVM(t)
	d := newDriver(t, Config{NoConfine: true})
	v := restore(t, d, templateFiles(t), 0)
	if v.m.UID() != 0 || v.m.box != nil {
		t.Errorf("unconfined machine: UID %d, box %v", v.m.UID(), v.m.box)
	}
	mine, _ := os.Readlink("/proc/self/ns/mnt")
	its, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", v.m.PID()))
	if its != mine {
		t.Errorf("unconfined vmm in mount namespace %s, want the host's %s", its, mine)
	}
	ctx := context.Background()
	if err := v.m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := v.m.SaveState(ctx, filepath.Join(shortDir(t), "state")); err != nil {
		t.Fatal(err)
	}
	if _, err := v.m.RAMMapping(); err != nil {
		t.Error(err)
	}
}

// BenchmarkStartLatency measures what confinement adds to the spawn (UID,
// cgroup, files, jail, rlimits and the exec), to Start (spawn to QMP
// ready) and to a whole restore (Start, load, resume, HELLO, a first exec
// of true), confined and unconfined alternately, b.N restores of each:
//
//	go test ./internal/hostagent/vmm/qemu -run '^$' -bench StartLatency -benchtime 30x
func BenchmarkStartLatency(b *testing.B) {
	t := b
	needVM(t)
	n := b.N
	f := templateFiles(t)
	spawns := map[string]*spawnLog{"confined": {}, "unconfined": {}}
	cfg := testConfig(t, 4)
	cfg.Logger = slog.New(spawns["confined"])
	drivers := map[string]*Driver{
		"confined":   newDriver(t, cfg),
		"unconfined": newDriver(t, Config{NoConfine: true, Logger: slog.New(spawns["unconfined"])}),
	}
	specs := map[string]vmm.Spec{}
	for name := range drivers {
		dir := shortDir(t)
		spec := tiny(t).Spec(template.Images{Dir: testkit.Images()})
		spec.RunDir = filepath.Join(dir, "run")
		spec.Disk = filepath.Join(dir, "disk")
		spec.MemoryFile = filepath.Join(dir, "mem")
		os.Mkdir(spec.RunDir, 0o755)
		if err := os.Link(f.mem, spec.MemoryFile); err != nil {
			b.Fatal(err)
		}
		specs[name] = spec
	}
	type sample struct{ start, exec time.Duration }
	times := map[string][]sample{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for i := 0; i < n; i++ {
		for _, name := range []string{"confined", "unconfined"} {
			spec := specs[name]
			os.Remove(spec.Disk)
			testkit.CopySparse(t, f.disk, spec.Disk)
			spec = withNIC(t, spec)
			t0 := time.Now()
			m, err := drivers[name].Start(ctx, spec)
			spec.Net.TAP.Close()
			if err != nil {
				b.Fatal(err)
			}
			s := sample{start: time.Since(t0)}
			err = func() error {
				defer m.Kill()
				conn, err := (&net.Dialer{}).DialContext(ctx, "unix", m.AgentSocket())
				if err != nil {
					return err
				}
				c := guestproto.NewClient(conn)
				defer c.Close()
				if err := m.LoadState(ctx, f.state); err != nil {
					return err
				}
				if err := m.Resume(ctx); err != nil {
					return err
				}
				if _, err := c.Hello(ctx, guestproto.HelloRequest{}); err != nil {
					return err
				}
				if r, err := c.Exec(ctx, guestproto.ExecRequest{Argv: []string{"true"}}, nil, nil, nil); err != nil || r.ExitCode != 0 {
					return fmt.Errorf("exec: %v %v", r, err)
				}
				s.exec = time.Since(t0)
				return nil
			}()
			if err != nil {
				b.Fatalf("%s restore: %v", name, err)
			}
			times[name] = append(times[name], s)
		}
	}
	b.StopTimer()
	for _, name := range []string{"confined", "unconfined"} {
		for _, what := range []string{"spawn", "start", "first exec"} {
			var ts []time.Duration
			for i, s := range times[name] {
				switch what {
				case "spawn":
					ts = append(ts, spawns[name].get(i))
				case "start":
					ts = append(ts, s.start)
				default:
					ts = append(ts, s.exec)
				}
			}
			t.Logf("%-10s %-10s %s", name, what, latencies(ts))
			b.ReportMetric(ms(quantile(ts, 0.5)), name+"-"+strings.ReplaceAll(what, " ", "-")+"-p50-ms")
		}
	}
}

// quantile is the q-quantile of ts, which must be sorted.
func quantile(ts []time.Duration, q float64) time.Duration {
	return ts[min(len(ts)-1, int(q*float64(len(ts))))]
}

// latencies sorts ts and sums them up in ms: the median, the 90th
// percentile and the maximum; the 99th percentile only over 100 samples
// or more (below that it would be the maximum under another name).
func latencies(ts []time.Duration) string {
	slices.Sort(ts)
	s := fmt.Sprintf("n=%d  p50 %6.1f ms  p90 %6.1f ms", len(ts), ms(quantile(ts, 0.5)), ms(quantile(ts, 0.9)))
	if len(ts) >= 100 {
		s += fmt.Sprintf("  p99 %6.1f ms", ms(quantile(ts, 0.99)))
	}
	return s + fmt.Sprintf("  max %6.1f ms", ms(ts[len(ts)-1]))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// spawnLog is a slog handler that keeps the spawn_ms of every started VMM.
type spawnLog struct {
	mu sync.Mutex
	ds []time.Duration
}

func (l *spawnLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *spawnLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *spawnLog) WithGroup(string) slog.Handler            { return l }
func (l *spawnLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "spawn_ms" {
			l.mu.Lock()
			l.ds = append(l.ds, time.Duration(a.Value.Float64()*float64(time.Millisecond)))
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

func (l *spawnLog) get(i int) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ds[i]
}

// TestMachineLayouts: the PIT is in the legacy layout only, and a layout
// this driver does not know is refused before anything starts.
func TestMachineLayouts(t *testing.T) {
	needRoot(t)
	d := newDriver(t, Config{})
	spec := vmm.Spec{MemoryMiB: 256, Accel: accel.TCG}
	for layout, want := range map[string]string{vmm.MachineLegacy: "pit=on,", vmm.MachineNoPIT: "pit=off,"} {
		spec.Machine = layout
		args, err := d.args(spec, hostPaths(spec))
		if err != nil {
			t.Fatalf("layout %q: %v", layout, err)
		}
		i := slices.Index(args, "-machine")
		if i < 0 || !strings.Contains(args[i+1], want) {
			t.Errorf("layout %q: -machine %q, want %s", layout, args[i+1], want)
		}
	}
	spec.Machine = "from-the-future"
	if _, err := d.args(spec, hostPaths(spec)); err == nil || !strings.Contains(err.Error(), "unknown machine layout") {
		t.Errorf("unknown layout: %v", err)
	}
}

// TestQMPReconnect: a command whose ctx ends before its reply closes the
// QMP connection (qmp.TestCancelClosesConnection); the machine dials
// again for the next command, so a capture cancelled while the vCPUs were
// stopped can still continue them. A released machine dials nothing: the
// VMM is another process's to drive.
func TestQMPReconnect(t *testing.T) {
	needVM(t)
	d := newDriver(t, Config{})
	v := restore(t, d, templateFiles(t), 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := v.m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	old := v.m.qmp
	old.Close() // what a cancelled command leaves
	if err := v.m.Resume(ctx); err != nil {
		t.Fatalf("resume after the control connection closed: %v", err)
	}
	if v.m.qmp == old {
		t.Error("the machine kept its closed connection")
	}
	if got := strings.TrimSpace(v.sh(t, "echo running")); got != "running" {
		t.Errorf("guest after resume answered %q", got)
	}
	v.m.Release()
	if err := v.m.Pause(ctx); err == nil {
		t.Error("a released machine still obeys commands")
	}
}
