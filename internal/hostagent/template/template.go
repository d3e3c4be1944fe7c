// Package template bakes and keeps templates: a guest booted once from a
// kernel, an initramfs (with the guest agent) and a root filesystem image,
// paused and saved as vm.mem (guest RAM, byte for byte), vm.state (device
// state) and rootfs.ext4 (the disk as it was at the pause). A template is
// immutable; sandboxes map its vm.mem copy-on-write and reflink its disk.
// Its metadata records the content hashes of its inputs, and a template
// whose inputs changed is stale: Get re-bakes it instead of using it.
// It also boots build VMs (BuildVM): a guest on a writable root
// filesystem file that build steps run commands in and copy out.
package template

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/internal/contract/accel"
	"github.com/pandastack/pandastack/internal/contract/failpoint"
	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/hostagent/internal/guestnet"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/storage/manifest"
)

// Images locates the build outputs of `make setup`.
type Images struct {
	Dir string // kernel/vmlinuz, initramfs.img, panda-guest, rootfs-NAME.ext4
}

func (i Images) Kernel() string            { return filepath.Join(i.Dir, "kernel", "vmlinuz") }
func (i Images) Initramfs() string         { return filepath.Join(i.Dir, "initramfs.img") }
func (i Images) Agent() string             { return filepath.Join(i.Dir, "panda-guest") }
func (i Images) RootFS(name string) string { return filepath.Join(i.Dir, "rootfs-"+name+".ext4") }
func (i Images) hashCachePath() string     { return filepath.Join(i.Dir, ".hashes.json") }
func (i Images) rootfsNames() (names []string) {
	m, _ := filepath.Glob(filepath.Join(i.Dir, "rootfs-*.ext4"))
	for _, p := range m {
		names = append(names, strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "rootfs-"), ".ext4"))
	}
	sort.Strings(names)
	return names
}

// metaFile holds a baked template's Meta.
const metaFile = "template.json"

// Template is a baked template on disk.
type Template struct {
	templates.Meta
	Dir string
}

func (t *Template) MemFile() string   { return filepath.Join(t.Dir, "vm.mem") }
func (t *Template) StateFile() string { return filepath.Join(t.Dir, "vm.state") }
func (t *Template) RootFS() string    { return filepath.Join(t.Dir, "rootfs.ext4") }

// Spec returns the machine spec every restore of t must use; the caller
// fills in the per-machine fields (Disk, RunDir, ConsoleLog) and gives the
// machine its own TAP device: Net (which has t's MAC) is a new Net for
// each call, whose TAP the caller sets.
func (t *Template) Spec(images Images) vmm.Spec {
	spec := vmm.Spec{
		Kernel: images.Kernel(), Initramfs: images.Initramfs(), Cmdline: t.Cmdline,
		MemoryMiB: t.MemoryMiB, VCPUs: t.VCPUs, Accel: t.Accel,
		MemoryFile: t.MemFile(), Incoming: true, Machine: t.Machine,
	}
	if t.MAC != "" {
		spec.Net = &vmm.Net{MAC: t.MAC}
	}
	return spec
}

// Config configures a Store.
type Config struct {
	Dir    string // where templates live; must be on the reflink volume
	RunDir string // parent of short-lived run directories for bakes
	Images Images
	// UserDir holds the root filesystems built from users' images
	// (user.go); "" for none. Templates are found by name there after
	// Images.
	UserDir string
	Driver  vmm.Driver
	Accel   accel.Accel // kvm or tcg
	// BakeTimeout bounds one boot attempt (default 120 s).
	BakeTimeout time.Duration
	// ExtraCmdline is appended to the guest kernel command line.
	ExtraCmdline string
	// TSCkHz is the host's TSC frequency (qemu.TSCkHz). Under TCG the guest
	// reads the host's TSC; telling its kernel the frequency
	// (tsc_early_khz=) avoids a calibration that can hang under emulation.
	// 0 leaves the kernel to calibrate.
	TSCkHz int
	// Net gives the machine of one bake attempt its network interface,
	// which the guest configures as it boots (see package guestnet):
	// nic.TAP a TAP device whose other side is the gateway (or nothing
	// at all), nic.MAC guestnet.GuestMAC or "" (the same). purpose says
	// what it is for ("bake base-1024m-1c"). The store calls release
	// exactly once, after the machine has exited, and never closes TAP
	// itself. nil: guestnet.IsolatedNIC, a network namespace of the
	// bake's own with no way out.
	Net func(ctx context.Context, purpose string) (nic *vmm.Net, release func(), err error)
	// Remote, if not nil, holds templates other hosts baked (the host
	// agent's object store): a template that is missing or stale here is
	// fetched from it when it holds one of the same inputs, and baked only
	// when it does not (remote.go).
	Remote Remote
	Logger *slog.Logger
}

// Store holds templates. Safe for concurrent use; concurrent Gets of one
// template wait for a single bake.
type Store struct {
	cfg    Config
	hashes *hashCache
	// userHashes caches the hashes of user root filesystems, beside them.
	userHashes *hashCache
	log        *slog.Logger

	// userMu serializes the changes of user root filesystems' links and
	// configs (installs, publishing, removals).
	userMu sync.Mutex

	// indexMu serializes the making of chunk indexes (remote.go).
	indexMu sync.Mutex

	mu     sync.Mutex
	baking map[string]*bake
	// verified maps a template directory to the fingerprint its files had
	// when they last passed their checksums.
	verified map[string]string
}

type bake struct {
	done chan struct{}
	t    *Template
	err  error
}

// NewStore returns a store. It starts nothing.
func NewStore(cfg Config) (*Store, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.BakeTimeout == 0 {
		cfg.BakeTimeout = 90 * time.Second
	}
	if cfg.Net == nil {
		cfg.Net = guestnet.IsolatedNIC
	}
	if cfg.Accel != accel.KVM && cfg.Accel != accel.TCG {
		return nil, fmt.Errorf("template store: accel must be kvm or tcg, got %q", cfg.Accel)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("template store: %w", err)
	}
	return &Store{
		cfg:        cfg,
		hashes:     &hashCache{path: cfg.Images.hashCachePath()},
		userHashes: &hashCache{path: userHashCache(cfg.UserDir)},
		log:        cfg.Logger,
		baking:     map[string]*bake{},
		verified:   map[string]string{},
	}, nil
}

// Names lists the templates that can be baked (one per root filesystem):
// the built-in ones and the users'.
func (s *Store) Names() []string { return mergeNames(s.cfg.Images.rootfsNames(), s.userNames()) }

func userHashCache(dir string) string {
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, ".hashes.json")
}

// Get returns the template for p, baking it first if it is missing or
// stale. progress may be nil.
func (s *Store) Get(ctx context.Context, p templates.Params, progress templates.Progress) (*Template, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	t, reason, err := s.Lookup(p)
	if err != nil {
		return nil, err
	}
	if reason == "" {
		if err := s.verify(t); err == nil {
			return t, nil
		} else {
			reason = err.Error()
		}
	}
	return s.bakeOnce(ctx, p, reason, progress, fetchOrBake)
}

// verify checks t's files against their checksums, unless they are
// unchanged (same fingerprint) since they last passed.
func (s *Store) verify(t *Template) error {
	fp, err := manifest.Fingerprint(t.Dir)
	if err == nil {
		s.mu.Lock()
		ok := s.verified[t.Dir] == fp
		s.mu.Unlock()
		if ok {
			return nil
		}
	}
	if err := manifest.Verify(t.Dir); err != nil {
		s.log.Error("template failed its checksums; re-baking it", "template", t.Key(), "err", err)
		return errors.New("its files do not match their checksums")
	}
	s.setVerified(t.Dir)
	return nil
}

// setVerified records that dir's files passed their checksums as they are.
func (s *Store) setVerified(dir string) {
	if fp, err := manifest.Fingerprint(dir); err == nil {
		s.mu.Lock()
		s.verified[dir] = fp
		s.mu.Unlock()
	}
}

// RemoveLeftovers removes what interrupted bakes and builds left in the
// store (temporary and replaced template directories, unused versions of
// user root filesystems) and returns how many. Call it only when no bake
// or build runs, e.g. at start-up.
func (s *Store) RemoveLeftovers() int {
	n := s.removeUserLeftovers()
	for _, pat := range []string{".bake-*", ".old-*"} {
		m, _ := filepath.Glob(filepath.Join(s.cfg.Dir, pat))
		for _, d := range m {
			if os.RemoveAll(d) == nil {
				n++
			}
		}
	}
	return n
}

// Bake re-bakes the template for p even if it is fresh.
func (s *Store) Bake(ctx context.Context, p templates.Params, progress templates.Progress) (*Template, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if s.rootfsPath(p.Name) == "" {
		return nil, s.unknown(p.Name)
	}
	return s.bakeOnce(ctx, p, "bake requested", progress, bakeOnly)
}

func (s *Store) unknown(name string) error {
	names := s.Names()
	if len(names) == 0 {
		return fmt.Errorf("%w: %q: the host has no root filesystems (run make setup)", templates.ErrNotFound, name)
	}
	return fmt.Errorf("%w: %q (available: %s)", templates.ErrNotFound, name, strings.Join(names, ", "))
}

// Lookup returns the baked template for p and why it cannot be used as
// is ("" when it is fresh; t is nil when it was never baked).
func (s *Store) Lookup(p templates.Params) (t *Template, staleReason string, err error) {
	if s.rootfsPath(p.Name) == "" {
		return nil, "", s.unknown(p.Name)
	}
	dir := filepath.Join(s.cfg.Dir, p.Key())
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, "not baked yet", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("read template %s: %w", p.Key(), err)
	}
	t = &Template{Dir: dir}
	if err := json.Unmarshal(b, &t.Meta); err != nil {
		return nil, "corrupt metadata", nil
	}
	inputs, err := s.inputs(p.Name)
	if err != nil {
		return nil, "", err
	}
	for _, k := range []string{"kernel", "initramfs", "agent", "rootfs"} {
		if t.Inputs[k] != inputs[k] {
			return t, k + " changed since the template was baked", nil
		}
	}
	if t.Inputs["startup"] != inputs["startup"] {
		return t, "its start or ready command changed since it was baked", nil
	}
	if t.Inputs["files"] != inputs["files"] {
		return t, "the files its bake writes into the guest changed since it was baked", nil
	}
	if t.Accel != s.cfg.Accel {
		return t, fmt.Sprintf("baked for %s, running %s", t.Accel, s.cfg.Accel), nil
	}
	if t.Cmdline != s.cmdline() {
		return t, "kernel command line changed", nil
	}
	if t.Machine != vmm.MachineCurrent {
		return t, "machine layout changed", nil
	}
	if t.MAC != guestnet.GuestMAC {
		return t, "baked without the guests' network interface", nil
	}
	if err := manifest.Check(dir); err != nil {
		if errors.Is(err, manifest.ErrNoManifest) {
			return t, "baked before templates carried checksums", nil
		}
		return t, "its files are incomplete", nil
	}
	return t, "", nil
}

// List returns the metadata of every baked template.
func (s *Store) List() ([]Template, error) {
	ents, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var out []Template
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(s.cfg.Dir, e.Name(), metaFile))
		if err != nil {
			continue
		}
		t := Template{Dir: filepath.Join(s.cfg.Dir, e.Name())}
		if json.Unmarshal(b, &t.Meta) == nil {
			out = append(out, t)
		}
	}
	return out, nil
}

func (s *Store) inputs(name string) (map[string]string, error) {
	im := s.cfg.Images
	rootfs := s.rootfsPath(name)
	if rootfs == "" {
		return nil, s.unknown(name)
	}
	out := map[string]string{}
	for k, path := range map[string]string{
		"kernel": im.Kernel(), "initramfs": im.Initramfs(), "agent": im.Agent(), "rootfs": rootfs,
	} {
		cache := s.hashes
		if k == "rootfs" && rootfs != im.RootFS(name) {
			cache = s.userHashes
		}
		h, err := cache.hash(path)
		if err != nil {
			return nil, fmt.Errorf("template input %s: %w (run make setup)", k, err)
		}
		out[k] = h
	}
	g, err := s.startupOf(name)
	if err != nil {
		return nil, err
	}
	if h := startupHash(g.Startup); h != "" {
		out["startup"] = h
	}
	if g.FilesHash != "" {
		out["files"] = g.FilesHash
	}
	return out, nil
}

func (s *Store) cmdline() string {
	c := "console=ttyS0 quiet loglevel=3 panic=-1 pci=off reboot=t mitigations=off 8250.nr_uarts=1"
	if s.cfg.Accel == accel.TCG {
		if s.cfg.TSCkHz > 0 {
			c += fmt.Sprintf(" tsc_early_khz=%d", s.cfg.TSCkHz)
		}
		// Under TCG the TSC is the guest's only clocksource, so the
		// clocksource watchdog checks it against jiffies, whose ticks
		// are themselves timed by the TSC: it can find nothing, yet its
		// timer woke the idle guest every 0.5 s, half of its wakeups
		// (docs/benchmarks.md, "panda bench density"). Under KVM the
		// watchdog stays: there kvm-clock can catch a TSC that went bad
		// (and the kernel turns the watchdog off by itself on a CPU with
		// an invariant TSC and TSC_ADJUST).
		c += " tsc=nowatchdog"
	}
	if s.cfg.ExtraCmdline != "" {
		c += " " + s.cfg.ExtraCmdline
	}
	return c
}

// How bakeOnce makes a template.
type makeMode int

const (
	fetchOrBake makeMode = iota // from the Remote if it holds it, else baked
	bakeOnly                    // baked
	fetchOnly                   // from the Remote, or templates.ErrNotFound
)

func (s *Store) bakeOnce(ctx context.Context, p templates.Params, reason string, progress templates.Progress, mode makeMode) (*Template, error) {
	key := p.Key()
	s.mu.Lock()
	if b, ok := s.baking[key]; ok {
		s.mu.Unlock()
		if progress != nil {
			progress("waiting for a bake of " + key + " already in progress")
		}
		select {
		case <-b.done:
			return b.t, b.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	b := &bake{done: make(chan struct{})}
	s.baking[key] = b
	s.mu.Unlock()

	b.t, b.err = s.bake(ctx, p, reason, progress, mode)
	s.mu.Lock()
	delete(s.baking, key)
	s.mu.Unlock()
	close(b.done)
	return b.t, b.err
}

func (s *Store) bake(ctx context.Context, p templates.Params, reason string, progress templates.Progress, mode makeMode) (*Template, error) {
	say := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		s.log.Info("bake: "+msg, "template", p.Key())
		if progress != nil {
			progress(msg)
		}
	}
	start := time.Now()
	if mode == fetchOnly {
		say("replacing template %s (%s)", p.Key(), reason)
	} else {
		say("baking template %s (%s)", p.Key(), reason)
	}
	inputs, err := s.inputs(p.Name)
	if err != nil {
		return nil, err
	}
	run, err := s.startupOf(p.Name)
	if err != nil {
		return nil, err
	}
	if startupHash(run.Startup) != inputs["startup"] || run.FilesHash != inputs["files"] {
		return nil, fmt.Errorf("bake %s: its start and ready commands changed while it was being baked", p.Key())
	}
	tmp, err := os.MkdirTemp(s.cfg.Dir, ".bake-"+p.Key()+"-")
	if err != nil {
		return nil, fmt.Errorf("bake %s: %w", p.Key(), err)
	}
	defer os.RemoveAll(tmp)
	t := &Template{Dir: tmp, Meta: templates.Meta{Params: p, Accel: s.cfg.Accel, Cmdline: s.cmdline(), Machine: vmm.MachineCurrent, Inputs: inputs, MAC: guestnet.GuestMAC}}

	if mode != bakeOnly && s.cfg.Remote != nil {
		fetched, idx, err := s.fetch(ctx, t, say)
		switch {
		case err == nil:
			ft, err := s.install(p, tmp, fetched, func() { say("fetched %s in %.1fs", p.Key(), time.Since(start).Seconds()) })
			if err == nil && idx != nil {
				if err := s.setChunkIndex(ft, idx); err != nil {
					s.log.Warn("keep a template's chunk index", "template", p.Key(), "err", err)
				}
			}
			return ft, err
		case mode == fetchOnly:
			return nil, err
		case !errors.Is(err, templates.ErrNotFound):
			s.log.Warn("fetch template from the object store; baking it instead", "template", p.Key(), "err", err)
		}
	}
	var bootID string
	const attempts = 2 // TCG boots occasionally hang in early timer calibration
	for attempt := 1; ; attempt++ {
		os.Remove(t.RootFS())
		os.Remove(t.MemFile())
		os.Remove(t.StateFile())
		src := s.rootfsPath(p.Name)
		if src == "" {
			return nil, s.unknown(p.Name)
		}
		say("copying root filesystem %s", p.Name)
		if err := copySparse(src, t.RootFS()); err != nil {
			return nil, fmt.Errorf("bake %s: %w", p.Key(), err)
		}
		if err := createSparse(t.MemFile(), int64(p.MemoryMiB)<<20); err != nil {
			return nil, fmt.Errorf("bake %s: %w", p.Key(), err)
		}
		say("booting guest (attempt %d of %d, %s, %d MiB, %d vCPU)", attempt, attempts, s.cfg.Accel, p.MemoryMiB, p.VCPUs)
		bootID, err = s.bootAndSave(ctx, t, tmp, run, say)
		if err == nil {
			break
		}
		var re *templates.ReadyError
		if attempt == attempts || ctx.Err() != nil || errors.As(err, &re) {
			return nil, fmt.Errorf("bake %s: %w", p.Key(), err)
		}
		say("boot failed, retrying: %v", err)
	}
	t.BootID = bootID
	if st, err := os.Stat(t.RootFS()); err == nil {
		t.DiskMiB = int((st.Size() + 1<<20 - 1) >> 20)
	}
	t.BakedAt = time.Now().UTC()
	t.BakeMS = time.Since(start).Milliseconds()
	baked, err := s.install(p, tmp, t.Meta, func() { say("baked %s in %.1fs", p.Key(), time.Since(start).Seconds()) })
	if err == nil && s.cfg.Remote != nil {
		s.cfg.Remote.Baked(baked)
	}
	return baked, err
}

// install writes meta into the template directory tmp (its files made),
// seals it and moves it into place as the template p, replacing the one
// there.
func (s *Store) install(p templates.Params, tmp string, meta templates.Meta, done func()) (*Template, error) {
	t := &Template{Dir: tmp, Meta: meta}
	b, _ := json.MarshalIndent(t.Meta, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, metaFile), b, 0o600); err != nil {
		return nil, fmt.Errorf("bake %s: %w", p.Key(), err)
	}
	// On stable storage with checksums before it is renamed into place: a
	// crash leaves a .bake- directory (removed at the next start) or a
	// whole template, never a torn one.
	if _, err := manifest.Seal(tmp, "vm.mem", "vm.state", "rootfs.ext4", metaFile); err != nil {
		return nil, fmt.Errorf("bake %s: %w", p.Key(), err)
	}
	final := filepath.Join(s.cfg.Dir, p.Key())
	// Sandboxes hold the old vm.mem open and mapped: moving the directory
	// aside keeps their files intact (a restored sandbox never needs the
	// template again once its own files are set up).
	old := ""
	if _, err := os.Stat(final); err == nil {
		old = filepath.Join(s.cfg.Dir, ".old-"+p.Key()+"-"+randHex(4))
		if err := os.Rename(final, old); err != nil {
			return nil, fmt.Errorf("bake %s: replace: %w", p.Key(), err)
		}
	}
	if err := manifest.Rename(tmp, final); err != nil {
		return nil, fmt.Errorf("bake %s: %w", p.Key(), err)
	}
	s.setVerified(final)
	if old != "" {
		os.RemoveAll(old)
	}
	t.Dir = final
	done()
	return t, nil
}

// bootAndSave cold-boots t's guest with RAM written through to vm.mem,
// waits for the agent, starts run's commands (Startup) and waits for them
// to be ready, quiesces the channel, pauses and saves device state.
func (s *Store) bootAndSave(ctx context.Context, t *Template, dir string, run guestRun, say func(string, ...any)) (bootID string, err error) {
	timeout := s.cfg.BakeTimeout
	if run.ReadyCmd != "" {
		timeout += run.ReadyTimeout()
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	runDir, err := os.MkdirTemp(s.cfg.RunDir, "bake-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(runDir)
	nic, release, err := s.cfg.Net(ctx, "bake "+t.Key())
	if err != nil {
		return "", fmt.Errorf("network interface: %w", err)
	}
	defer release() // after the Kill below
	if nic.MAC != "" && nic.MAC != t.MAC {
		return "", fmt.Errorf("network interface: MAC %s, want the guests' %s", nic.MAC, t.MAC)
	}
	spec := t.Spec(s.cfg.Images)
	spec.Incoming = false
	spec.MemoryShared = true
	spec.Disk = t.RootFS()
	spec.RunDir = runDir
	spec.ConsoleLog = filepath.Join(dir, "console.log")
	spec.Net.TAP = nic.TAP
	m, err := s.cfg.Driver.Start(ctx, spec)
	if err != nil {
		return "", err
	}
	defer m.Kill()
	conn, err := dialUnix(ctx, m.AgentSocket())
	if err != nil {
		return "", err
	}
	client := guestproto.NewClient(conn)
	defer client.Close()
	// Fail fast if the VMM dies while we wait for the agent.
	go func() {
		select {
		case <-m.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	reply, err := client.Hello(ctx, guestproto.HelloRequest{Hostname: "panda-template", SandboxID: "template"})
	if err != nil {
		if e := m.ExitError(); e != nil {
			return "", fmt.Errorf("guest agent did not start: vmm exited: %v (console: %s)", e, tail(spec.ConsoleLog))
		}
		return "", fmt.Errorf("guest agent did not answer: %w (console: %s)", err, tail(spec.ConsoleLog))
	}
	failpoint.Hit("bake-booted")
	// Warm the guest: the first exec after a restore pays for loading the
	// shell and its libraries from disk unless they are in the snapshot's
	// page cache already.
	for _, argv := range [][]string{{"true"}, {"/bin/sh", "-c", "true"}} {
		if _, err := client.Exec(ctx, guestproto.ExecRequest{Argv: argv}, nil, nil, nil); err != nil {
			return "", fmt.Errorf("warm-up exec %v: %w", argv, err)
		}
	}
	if !run.IsZero() || len(run.Files) > 0 {
		if err := runStartup(ctx, client, run, say); err != nil {
			return "", err
		}
	}
	if err := client.Barrier(ctx); err != nil {
		return "", fmt.Errorf("quiesce agent: %w", err)
	}
	if err := m.Pause(ctx); err != nil {
		return "", err
	}
	if err := m.SaveState(ctx, t.StateFile()); err != nil {
		return "", err
	}
	return reply.BootID, nil
}

func dialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("connect to guest agent socket: %w", err)
	}
	return c, nil
}

func createSparse(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// tail returns the last lines of a console log for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no console log)"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 8 {
		lines = lines[len(lines)-8:]
	}
	return strings.Join(lines, " | ")
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
