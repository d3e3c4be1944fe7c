package qemu

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Each confined machine has its own cgroup, named vm-UID after the user it
// runs as, under a parent (Config.Cgroup) below the driver's own cgroup in
// every hierarchy it uses:
//
//	cgroup v2: <mount>/<own cgroup>/<Config.Cgroup>/vm-UID
//	cgroup v1: <cpu mount>/<own cpu cgroup>/<Config.Cgroup>/vm-UID, and the
//	           same under the memory and pids hierarchies
//
// Creating that directory (mkdir, atomic) is how a driver claims a UID, so
// drivers of several processes sharing one parent never hand out the same
// UID; removing it (after the process is gone) gives the UID back.

// cgroupControllers are the controllers a machine's limits need.
var cgroupControllers = []string{"cpu", "memory", "pids"}

// cgroupSet is the driver's view of the cgroup file system, found at start.
type cgroupSet struct {
	v2      bool
	parents []cgroupParent // v2: one; v1: cpu, memory, pids
	// controllers to limit; all of cgroupControllers except in tests
	// that use a cgroup v2 hierarchy without controllers.
	limit map[string]bool
}

type cgroupParent struct {
	controller string // v1 only
	dir        string // the parent of the machines' cgroups
	self       string // the driver's own cgroup in this hierarchy (v1)
	// Where the hierarchy is mounted, and the cgroup at the mount's root.
	mount, mountRoot string
}

// cgroupLimits are one machine's limits.
type cgroupLimits struct {
	cpuQuotaUs int64 // per 100 ms period
	memBytes   int64
	pids       int
}

const cpuPeriodUs = 100000

// mountInfo is one line of /proc/self/mountinfo.
type mountInfo struct {
	root, point, fstype string
	superOpts           []string
}

func readMountInfo() ([]mountInfo, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountInfo
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 5 || len(b) < 3 {
			continue
		}
		out = append(out, mountInfo{
			root: unescapeOctal(a[3]), point: unescapeOctal(a[4]), fstype: b[0],
			superOpts: strings.Split(b[2], ","),
		})
	}
	return out, sc.Err()
}

// unescapeOctal undoes the \NNN escapes of /proc/self/mountinfo.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ownCgroups reads /proc/self/cgroup: controller (or "" for v2) → path.
func ownCgroups() (map[string]string, error) { return procCgroups("self") }

// procCgroups reads /proc/PID/cgroup: controller (or "" for v2) → path.
func procCgroups(pid string) (map[string]string, error) {
	b, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out, nil
}

// within joins a mount point and a cgroup path as seen in /proc/self/cgroup,
// for a mount whose root is root (a cgroup mounted from below the top of its
// hierarchy shows paths relative to the hierarchy).
func within(point, root, path string) string {
	if root != "/" && (path == root || strings.HasPrefix(path, root+"/")) {
		path = strings.TrimPrefix(path, root)
	}
	return filepath.Join(point, path)
}

// detectCgroups finds the hierarchies holding cpu, memory and pids: the
// unified (v2) hierarchy if it offers all three, else the v1 hierarchies.
// It creates the parent directory named name in each, and under v2
// delegates the controllers to it.
func detectCgroups(name string) (*cgroupSet, error) {
	mounts, err := readMountInfo()
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	own, err := ownCgroups()
	if err != nil {
		return nil, fmt.Errorf("read own cgroup: %w", err)
	}
	all := map[string]bool{}
	for _, c := range cgroupControllers {
		all[c] = true
	}
	for _, m := range mounts {
		if m.fstype != "cgroup2" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(m.point, "cgroup.controllers"))
		if err != nil || !hasAll(strings.Fields(string(b)), cgroupControllers) {
			continue
		}
		path, ok := own[""]
		if !ok {
			continue
		}
		set, err := setupV2(within(m.point, m.root, path), name, all)
		if err != nil {
			return nil, err
		}
		set.parents[0].mount, set.parents[0].mountRoot = m.point, m.root
		return set, nil
	}
	s := &cgroupSet{limit: all}
	for _, c := range cgroupControllers {
		var found *mountInfo
		for i, m := range mounts {
			if m.fstype == "cgroup" && hasAll(m.superOpts, []string{c}) {
				found = &mounts[i]
				break
			}
		}
		path, ok := own[c]
		if found == nil || !ok {
			return nil, fmt.Errorf("no cgroup hierarchy offers the %s controller (cgroup v2 with cpu, memory and pids, or v1 hierarchies for each, are needed)", c)
		}
		self := within(found.point, found.root, path)
		dir := filepath.Join(self, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create cgroup: %w", err)
		}
		s.parents = append(s.parents, cgroupParent{controller: c, dir: dir, self: self, mount: found.point, mountRoot: found.root})
	}
	return s, nil
}

// setupV2 prepares parent self/name under cgroup v2 with the controllers
// in limit enabled for its children. The no-internal-processes rule forbids
// enabling controllers for the children of a cgroup that holds processes
// (except the root): if self holds only this process, the process moves to
// a leaf self/name.agent first; otherwise the host must delegate a cgroup
// whose processes allow it (systemd: Delegate=yes).
func setupV2(self, name string, limit map[string]bool) (*cgroupSet, error) {
	var ctl []string
	for _, c := range cgroupControllers {
		if limit[c] {
			ctl = append(ctl, "+"+c)
		}
	}
	enable := func(dir string) error {
		if len(ctl) == 0 {
			return nil
		}
		return os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(ctl, " ")), 0)
	}
	if err := enable(self); errors.Is(err, unix.EBUSY) {
		b, _ := os.ReadFile(filepath.Join(self, "cgroup.procs"))
		if strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
			return nil, fmt.Errorf("cgroup %s holds other processes, so it cannot delegate controllers to the VMMs' cgroups; run the host agent in a cgroup of its own (systemd: Delegate=yes)", self)
		}
		leaf := filepath.Join(self, name+".agent")
		if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create cgroup: %w", err)
		}
		if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			return nil, fmt.Errorf("move host agent to cgroup %s: %w", leaf, err)
		}
		if err := enable(self); err != nil {
			return nil, fmt.Errorf("enable cgroup controllers in %s: %w", self, err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("enable cgroup controllers in %s: %w", self, err)
	}
	dir := filepath.Join(self, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	if err := enable(dir); err != nil {
		return nil, fmt.Errorf("enable cgroup controllers in %s: %w", dir, err)
	}
	return &cgroupSet{v2: true, parents: []cgroupParent{{dir: dir, self: self}}, limit: limit}, nil
}

func hasAll(have, want []string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if h == w {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// vmCgroupName is the cgroup of the machine running as uid.
func vmCgroupName(uid uint32) string { return "vm-" + strconv.FormatUint(uint64(uid), 10) }

// errCgroupTaken means another machine (maybe of another process) holds
// the cgroup, hence the UID.
var errCgroupTaken = errors.New("cgroup exists")

// vmCgroup is one machine's cgroup: a directory per hierarchy.
type vmCgroup struct {
	set  *cgroupSet
	dirs []string // parallel to set.parents
}

// create claims uid's cgroup and sets lim. It fails with errCgroupTaken if
// the cgroup exists in the first hierarchy (the claim); in the others a
// leftover directory of a crashed driver is reused.
func (s *cgroupSet) create(uid uint32, lim cgroupLimits) (*vmCgroup, error) {
	c := &vmCgroup{set: s}
	for i, p := range s.parents {
		dir := filepath.Join(p.dir, vmCgroupName(uid))
		err := os.Mkdir(dir, 0o755)
		if errors.Is(err, os.ErrExist) && i == 0 {
			return nil, errCgroupTaken
		}
		if err != nil && !errors.Is(err, os.ErrExist) {
			c.remove()
			return nil, fmt.Errorf("create cgroup: %w", err)
		}
		c.dirs = append(c.dirs, dir)
	}
	if err := c.setLimits(lim); err != nil {
		c.remove()
		return nil, err
	}
	return c, nil
}

func (c *vmCgroup) setLimits(lim cgroupLimits) error {
	type setting struct{ controller, v1file, v2file, value string }
	settings := []setting{
		{"cpu", "cpu.cfs_period_us", "", strconv.Itoa(cpuPeriodUs)},
		{"cpu", "cpu.cfs_quota_us", "cpu.max", strconv.FormatInt(lim.cpuQuotaUs, 10)},
		{"memory", "memory.limit_in_bytes", "memory.max", strconv.FormatInt(lim.memBytes, 10)},
		{"pids", "pids.max", "pids.max", strconv.Itoa(lim.pids)},
	}
	for _, st := range settings {
		if !c.set.limit[st.controller] {
			continue
		}
		for i, p := range c.set.parents {
			file, value := st.v1file, st.value
			if c.set.v2 {
				file = st.v2file
				if st.v2file == "cpu.max" {
					value = fmt.Sprintf("%d %d", lim.cpuQuotaUs, cpuPeriodUs)
				}
			} else if p.controller != st.controller {
				continue
			}
			if file == "" {
				continue
			}
			if err := os.WriteFile(filepath.Join(c.dirs[i], file), []byte(value), 0); err != nil {
				return fmt.Errorf("set cgroup limit %s: %w", file, err)
			}
		}
	}
	return nil
}

// enterV1 opens the files through which the starting thread moves into
// the machine's v1 cgroups (in) and back to the driver's own (out). The
// caller closes them.
func (c *vmCgroup) enterV1() (in, out []*os.File, err error) {
	closeAll := func() {
		for _, f := range append(in, out...) {
			f.Close()
		}
	}
	for i, p := range c.set.parents {
		fi, err := os.OpenFile(filepath.Join(c.dirs[i], "tasks"), os.O_WRONLY, 0)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("open cgroup: %w", err)
		}
		in = append(in, fi)
		fo, err := os.OpenFile(filepath.Join(p.self, "tasks"), os.O_WRONLY, 0)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("open own cgroup: %w", err)
		}
		out = append(out, fo)
	}
	return in, out, nil
}

// pids lists the processes in the machine's cgroups.
func (c *vmCgroup) pids() []int {
	seen := map[int]bool{}
	var out []int
	for _, d := range c.dirs {
		b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
	}
	return out
}

// remove deletes the machine's cgroups; call it once its process is gone.
// A cgroup whose last task has just exited can be busy for a moment while
// the kernel finishes the exit, so EBUSY is retried for up to a second.
func (c *vmCgroup) remove() error {
	var errs []error
	// The first hierarchy holds the claim on the UID: remove it last.
	for i := len(c.dirs) - 1; i >= 0; i-- {
		d := c.dirs[i]
		for delay := 100 * time.Microsecond; ; delay *= 2 {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || delay > 500*time.Millisecond {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
				break
			}
			time.Sleep(delay)
		}
	}
	return errors.Join(errs...)
}

// existing lists the UIDs that have a cgroup under any parent.
func (s *cgroupSet) existing() map[uint32]bool {
	out := map[uint32]bool{}
	for _, p := range s.parents {
		ents, _ := os.ReadDir(p.dir)
		for _, e := range ents {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), "vm-") {
				continue
			}
			if uid, err := strconv.ParseUint(e.Name()[3:], 10, 32); err == nil {
				out[uint32(uid)] = true
			}
		}
	}
	return out
}

// cgroupOf returns the cgroup process pid is in, in the set's hierarchies.
func (s *cgroupSet) cgroupOf(pid int) (*vmCgroup, error) {
	paths, err := procCgroups(strconv.Itoa(pid))
	if err != nil {
		return nil, err
	}
	c := &vmCgroup{set: s}
	for _, p := range s.parents {
		path, ok := paths[p.controller]
		if !ok || p.mount == "" {
			return nil, fmt.Errorf("process %d has no cgroup in the %q hierarchy", pid, p.controller)
		}
		c.dirs = append(c.dirs, within(p.mount, p.mountRoot, path))
	}
	return c, nil
}

// of returns the cgroup of uid (whether or not it exists).
func (s *cgroupSet) of(uid uint32) *vmCgroup {
	c := &vmCgroup{set: s}
	for _, p := range s.parents {
		c.dirs = append(c.dirs, filepath.Join(p.dir, vmCgroupName(uid)))
	}
	return c
}

// named reports whether c is the cgroup of uid in every hierarchy.
func (c *vmCgroup) named(uid uint32) bool {
	for _, d := range c.dirs {
		if filepath.Base(d) != vmCgroupName(uid) {
			return false
		}
	}
	return len(c.dirs) > 0
}
