package devcluster

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/internal/hostagent/lazymem"
	"github.com/pandastack/pandastack/internal/testing/testkit"
)

// stateDir holds a state file per running cluster name: what a run that
// is killed leaves for the next run of that name to clean up.
const stateDir = "/run/pandastack"

func statePath(name string) string { return filepath.Join(stateDir, "dev-cluster-"+name+".json") }

// lockName takes the lock of the cluster name for this process's life (or
// until unlock): two clusters of one name would remove each other's
// namespaces. The kernel drops it when the process dies. Unlock removes
// the lock file too; a locker that finds it has locked a file removed
// meanwhile tries again.
func lockName(name string) (unlock func() error, err error) {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(stateDir, "dev-cluster-"+name+".lock")
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, err
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("a dev cluster named %q is running already: stop it first, or give this one another name and subnet", name)
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		var held, now syscall.Stat_t
		if syscall.Fstat(int(f.Fd()), &held) == nil && syscall.Stat(path, &now) == nil && held.Ino == now.Ino && held.Dev == now.Dev {
			return func() error {
				os.Remove(path)
				return f.Close()
			}, nil
		}
		f.Close() // its holder removed it as we locked it
	}
}

// stateFile records a cluster's data directory and the processes it
// started (by PID and start time, so that a PID reused since is never
// killed). Rewritten after every start of a process.
type stateFile struct {
	path    string
	mu      sync.Mutex
	DataDir string      `json:"data_dir"`
	Temp    bool        `json:"temp"`
	Procs   []stateProc `json:"procs"`
}

type stateProc struct {
	Name  string `json:"name"`
	PID   int    `json:"pid"`
	Start uint64 `json:"start"` // startTime
}

func (s *stateFile) save() error {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(s, "", "  ")
	tmp := s.path + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.path)
}

// add records process pid; a failure to save is not fatal (the cluster
// runs; only a later clean-up would miss it).
func (s *stateFile) add(name string, pid int) {
	st, err := startTime(pid)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Procs = append(s.Procs, stateProc{Name: name, PID: pid, Start: st})
	s.save()
}

func (s *stateFile) remove() error {
	if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// RemoveLeftovers removes what a run of cfg.Name that was killed left
// behind (Start does it first): its processes (recorded ones by PID, and
// whatever runs in its namespaces), the agents' VMMs and mounts under its
// data directory and cfg.DataDir, its namespaces, veths and bridge, its
// temporary data directory; it says what it found on cfg.Out. It refuses
// while a cluster of that name runs.
func RemoveLeftovers(cfg Config) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	c := &Cluster{cfg: cfg, out: &lockedWriter{w: cfg.Out}}
	unlock, err := lockName(cfg.Name)
	if err != nil {
		return err
	}
	defer unlock()
	return c.removeLeftovers()
}

// removeLeftovers is RemoveLeftovers, the name's lock held.
func (c *Cluster) removeLeftovers() error {
	var found []string
	var old stateFile
	b, err := os.ReadFile(statePath(c.cfg.Name))
	if err == nil {
		if err := json.Unmarshal(b, &old); err != nil {
			return fmt.Errorf("state of an earlier run, %s: %w (remove it if no such cluster runs)", statePath(c.cfg.Name), err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	// Agents first, then the rest; each by process group, which holds
	// its children.
	slices.SortStableFunc(old.Procs, func(a, b stateProc) int {
		return boolInt(!strings.HasPrefix(a.Name, "agent-")) - boolInt(!strings.HasPrefix(b.Name, "agent-"))
	})
	for _, p := range old.Procs {
		if st, err := startTime(p.PID); err != nil || st != p.Start {
			continue // gone, or the PID is another process's now
		}
		syscall.Kill(-p.PID, syscall.SIGKILL)
		syscall.Kill(p.PID, syscall.SIGKILL)
		// Until whoever inherited it reaps it, a dead postmaster is a
		// zombie, which PostgreSQL takes for a live one holding its lock
		// files; its server processes hold its shared memory. Wait for
		// the group to be gone and reaped.
		waitGroupGone(p.PID, 10*time.Second)
		found = append(found, fmt.Sprintf("%s (pid %d)", p.Name, p.PID))
	}
	pids, removed, err := removeNetwork(c.cfg.Name)
	if err != nil {
		return fmt.Errorf("remove the network of an earlier run: %w", err)
	}
	if len(pids) > 0 {
		found = append(found, fmt.Sprintf("processes %v in its namespaces", pids))
	}
	if len(removed) > 0 {
		found = append(found, strings.Join(removed, ", "))
	}
	dirs := []string{}
	if old.DataDir != "" {
		dirs = append(dirs, old.DataDir)
	}
	if c.cfg.DataDir != "" && c.cfg.DataDir != old.DataDir {
		dirs = append(dirs, c.cfg.DataDir)
	}
	for _, d := range dirs {
		agents, _ := filepath.Glob(filepath.Join(d, "agent-*"))
		for _, a := range agents {
			if pids := testkit.QEMUProcs(a); len(pids) > 0 {
				killPIDs(pids)
				found = append(found, fmt.Sprintf("VMMs %v of %s", pids, a))
			}
			if pids := lazymem.HolderPIDs(a); len(pids) > 0 {
				killPIDs(pids)
				found = append(found, fmt.Sprintf("lazy restore holders %v of %s", pids, a))
			}
			if m := mountsUnder(a); len(m) > 0 {
				if err := unmountUnder(a); err != nil {
					return fmt.Errorf("clean up an earlier run: %w", err)
				}
				found = append(found, "mounts "+strings.Join(m, ", "))
			}
		}
	}
	// Only a directory Start made (panda-dev-*) is removed.
	if old.Temp && strings.HasPrefix(filepath.Base(old.DataDir), "panda-dev-") {
		if _, err := os.Stat(old.DataDir); err == nil {
			if err := os.RemoveAll(old.DataDir); err != nil {
				return fmt.Errorf("remove the data directory of an earlier run: %w", err)
			}
			found = append(found, "its temporary data directory "+old.DataDir)
		}
	}
	if len(found) > 0 {
		c.progress("Cleaned up after an earlier run of cluster %q that did not stop: %s", c.cfg.Name, strings.Join(found, "; "))
	}
	return (&stateFile{path: statePath(c.cfg.Name)}).remove()
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// killPID SIGKILLs one process.
func killPID(pid int) { syscall.Kill(pid, syscall.SIGKILL) }

// unmountUnder unmounts every mount point under dir, deepest first,
// retrying while files of processes just killed are being closed.
func unmountUnder(dir string) error {
	var errs []error
	for _, mp := range mountsUnder(dir) {
		var err error
		for range 50 {
			if err = syscall.Unmount(mp, 0); err == nil || !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(100 * time.Millisecond) // poll: the kernel closes a dead process's files
		}
		if err != nil {
			syscall.Unmount(mp, syscall.MNT_DETACH)
			errs = append(errs, fmt.Errorf("unmount %s: %w (detached)", mp, err))
		}
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points under dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 {
			if mp := mountInfoEscapes.Replace(fields[4]); strings.HasPrefix(mp, dir+"/") {
				out = append(out, mp)
			}
		}
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return out
}

// mountInfoEscapes undoes the octal escapes of /proc/self/mountinfo.
var mountInfoEscapes = strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)

// waitGroupGone polls until no process is in process group pgid, not
// even a zombie, or timeout has passed.
func waitGroupGone(pgid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for groupAlive(pgid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond) // poll: the kernel ends them
	}
	return true
}

// groupAlive reports whether a process (zombies too) is in group pgid.
func groupAlive(pgid int) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:]) // state, ppid, pgrp, ...
		if len(f) > 2 && f[2] == strconv.Itoa(pgid) {
			return true // alive, or a zombie not reaped yet
		}
	}
	return false
}
