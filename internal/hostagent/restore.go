package hostagent

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/hostagent/internal/capture"
	"github.com/pandastack/pandastack/internal/hostagent/internal/transfer"
	"github.com/pandastack/pandastack/internal/hostagent/internal/volume"
	"github.com/pandastack/pandastack/internal/hostagent/template"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
)

// image is a saved machine that sandboxes are restored from: a template,
// a snapshot, a fork's capture or a paused sandbox's capture. Dir holds
// vm.mem, vm.state and rootfs.ext4; Spec is the machine shape they were
// saved with (per-machine paths are filled in at restore).
type image struct {
	Dir      string
	Spec     vmm.Spec
	Template string // template key, for the record
	// memFile, if set, replaces Dir/vm.mem (a tenant's copy of a
	// template's memory image).
	memFile string
	// fullCopy gives the sandbox a full private copy of its memory (every
	// page copied into the VMM at start, shared with nobody): the naive
	// baseline that `panda bench fork` compares against. Nothing else
	// uses it.
	fullCopy bool
	// lineage is the durable snapshot a sandbox restored from im derives
	// from (record.Lineage).
	lineage string
	// arrival, if set, is a snapshot still being received (Dir unused):
	// restore takes its files from where the receive has them once its
	// disk is in, and loads the machine once all of it is
	// (ReceiveAndCreate).
	arrival *transfer.Arrival
}

func (im image) mem() string {
	if im.memFile != "" {
		return im.memFile
	}
	return filepath.Join(im.Dir, "vm.mem")
}

func (im image) state() string { return filepath.Join(im.Dir, "vm.state") }

func (im image) rootfs() string { return filepath.Join(im.Dir, "rootfs.ext4") }

func templateImage(t *template.Template, images template.Images) image {
	return image{Dir: t.Dir, Spec: t.Spec(images), Template: t.Key()}
}

// restoreTimeout bounds one restore, from files to the guest's answer.
const restoreTimeout = 90 * time.Second

// The files of a sandbox's running machine, in its directory.
const (
	diskFile  = capture.DiskFile
	memFile   = capture.MemFile
	stateFile = capture.StateFile
)

// restore gives s its own files from im and starts its VMM: the disk is a
// reflink clone, the memory image and device state are hard links, so im
// stays intact (a paused sandbox's capture survives a failed resume) and
// may be deleted later. On failure everything restore made is undone; s's
// state is the caller's to change.
func (a *Agent) restore(ctx context.Context, s *sandbox, im image) (err error) {
	// Wait for a start slot (bounded by ctx only): the restore's own
	// deadline counts from when it may run.
	select {
	case a.starts <- struct{}{}:
		defer func() { <-a.starts }()
	case <-ctx.Done():
		return fmt.Errorf("waiting for a start slot: %w", ctx.Err())
	}
	// Bounded: a VMM that never answers must not leave the sandbox starting.
	ctx, cancel := context.WithTimeout(ctx, restoreTimeout)
	defer cancel()
	defer func() {
		if err != nil {
			a.undoRestore(s)
		}
	}()
	t0 := time.Now()
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return classifyIOError(err)
	}
	if err := os.MkdirAll(s.runDir, 0o700); err != nil {
		return err
	}
	disk, mem, state := filepath.Join(s.dir, diskFile), filepath.Join(s.dir, memFile), filepath.Join(s.dir, stateFile)
	for _, f := range []string{disk, mem, state} {
		os.Remove(f) // a leftover of an interrupted restore
	}
	if im.arrival == nil {
		err = restoreFiles(im, disk, mem, state)
	} else if err = im.arrival.WaitDisk(ctx); err == nil {
		// The memory image and device state are linked while they
		// arrive: the same inodes, written on.
		err = im.arrival.WithDir(func(dir string) error {
			im.Dir = dir
			return restoreFiles(im, disk, mem, state)
		})
	}
	if err != nil {
		return err
	}
	spec := im.Spec
	spec.MemoryFile = mem
	spec.MemoryShared = false
	spec.Incoming = true
	spec.Disk = disk
	spec.RunDir = s.runDir
	spec.ConsoleLog = ""
	spec.Prealloc = im.fullCopy
	if spec.GID, err = a.tenantGID(s.rec.Owner); err != nil {
		return err
	}
	var tap *os.File
	if spec.Net != nil {
		// Saved with a network interface (every template since guests
		// have one): the machine needs a TAP, and the record names its
		// namespace before the VMM starts. The VMM keeps its own copy.
		if tap, err = a.nic(ctx, s); err != nil {
			return err
		}
		defer tap.Close()
	}
	s.mu.Lock()
	s.rec.Spec = spec
	s.rec.Template = im.Template
	s.mu.Unlock()
	if err := s.writeRecord(false); err != nil {
		return classifyIOError(err)
	}
	tFiles := time.Since(t0)
	if tap != nil {
		spec.Net = &vmm.Net{TAP: tap, MAC: spec.Net.MAC} // never modify the image's Net
	}
	m, err := a.driver.Start(ctx, spec)
	if err != nil {
		return err
	}
	s.setMachine(m, nil, nil)
	tStart := time.Since(t0)
	// Connect before loading: the guest then never sees the host side of
	// its serial port go away across the restore.
	conn, err := (&net.Dialer{}).DialContext(ctx, "unix", m.AgentSocket())
	if err != nil {
		return fmt.Errorf("connect to guest agent: %w", err)
	}
	client := s.newClient(conn)
	ready := make(chan struct{})
	s.setMachine(m, client, ready)
	if s.stopping() { // killed before it could see the machine
		return errStopped(s, "restore")
	}
	if im.arrival != nil {
		// The VMM started while the memory image arrived; nothing
		// of it runs before all of it is in.
		if err := im.arrival.Wait(ctx); err != nil {
			return fmt.Errorf("receive the snapshot: %w", err)
		}
	}
	tArrived := time.Since(t0)
	if err := m.LoadState(ctx, state); err != nil {
		return err
	}
	tLoad := time.Since(t0)
	if err := m.Resume(ctx); err != nil {
		return err
	}
	tResume := time.Since(t0)
	if err := a.hello(ctx, s, client); err != nil {
		return err
	}
	if err := a.openVolumes(ctx, s, client); err != nil {
		return err
	}
	close(ready)
	go a.watch(s, m)
	go a.keepGuest(s, m, client)
	a.log.Debug("sandbox restored", "sandbox_id", s.rec.ID, "files_ms", ms(tFiles), "vmm_ms", ms(tStart), "arrived_ms", ms(tArrived),
		"load_ms", ms(tLoad), "resume_ms", ms(tResume), "ready_ms", ms(time.Since(t0)))
	return nil
}

// restoreFiles gives a sandbox its files from im: disk, mem and state
// (paths in its directory). The disk is a reflink clone; the memory image
// and device state are hard links, which keep the same inode, hence the
// same page cache as every other sandbox restored from im, and survive
// im's deletion.
func restoreFiles(im image, disk, mem, state string) error {
	if err := volume.Clone(im.rootfs(), disk); err != nil {
		return classifyIOError(err)
	}
	if err := os.Link(im.mem(), mem); err != nil {
		return classifyIOError(fmt.Errorf("link memory image: %w", err))
	}
	if err := os.Link(im.state(), state); err != nil {
		return classifyIOError(fmt.Errorf("link device state: %w", err))
	}
	return nil
}

// undoRestore kills the VMM a failed restore started and removes the
// files it made (the sandbox's directory and record stay).
func (a *Agent) undoRestore(s *sandbox) {
	s.mu.Lock()
	m, client := s.m, s.client
	s.m, s.client, s.ready = nil, nil, nil // the watcher ignores a VMM that is no longer s.m
	s.mu.Unlock()
	if client != nil {
		client.Close()
	}
	if m != nil {
		m.Kill()
	}
	a.releaseNet(s)
	a.removeLiveFiles(s)
}

// removeLiveFiles removes the files of s's machine (not its record or
// pause capture) and its run directory.
func (a *Agent) removeLiveFiles(s *sandbox) {
	for _, f := range []string{diskFile, memFile, stateFile} {
		os.Remove(filepath.Join(s.dir, f))
	}
	os.RemoveAll(s.runDir)
}

// helloTimeout bounds the guest's answer to HELLO.
const helloTimeout = 30 * time.Second

func (a *Agent) hello(ctx context.Context, s *sandbox, client *guestproto.Client) error {
	ctx, cancel := context.WithTimeout(ctx, helloTimeout)
	defer cancel()
	s.mu.Lock()
	req := guestproto.HelloRequest{Hostname: s.rec.Hostname, MachineID: s.rec.MachineID, SandboxID: s.rec.ID, Env: s.rec.Env}
	s.mu.Unlock()
	reply, err := client.Hello(ctx, req)
	if err != nil {
		return fmt.Errorf("guest agent: %w", err)
	}
	for _, e := range reply.HookErrors {
		a.log.Warn("guest restore hook failed", "sandbox_id", s.rec.ID, "err", e)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// watch waits for the VMM to exit. An exit the agent did not cause stops
// the sandbox and is reported through Config.OnExit.
func (a *Agent) watch(s *sandbox, m vmm.Machine) {
	<-m.Done()
	if s.getState() == StatePausing {
		// A pause is capturing the machine: its outcome decides. A
		// complete capture makes the sandbox paused (the pause stops the
		// VMM anyway, and it is no longer s.m); an incomplete one fails
		// the pause, and the sandbox, running without a VMM, is stopped
		// below. Stopping it now would delete a capture the pause is
		// about to report done.
		select {
		case s.slot <- struct{}{}:
			<-s.slot
		case <-s.gone:
		}
	}
	s.mu.Lock()
	// Killed by us, replaced (pause, a failed resume) or left to the next
	// agent (Detach).
	ours := s.m != m || s.detached || s.state == StateStopping || s.state == StateStopped
	s.mu.Unlock()
	if ours {
		return
	}
	err := m.ExitError()
	a.log.Warn("sandbox vmm exited", "sandbox_id", s.rec.ID, "err", err)
	a.stop(s)
	if a.cfg.OnExit != nil {
		a.cfg.OnExit(s.rec.ID, err)
	}
}
