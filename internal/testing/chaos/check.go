package chaos

import (
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// Observation is one look at a deployment: what its catalog lists (through
// the API, with every key the suite uses, in every state) and what its data
// directory holds (QEMU processes, sandbox, run and snapshot directories,
// mounts). Observe takes one; tests may build one by hand.
type Observation struct {
	// Sandboxes are the catalog's sandboxes, stopped ones included.
	Sandboxes map[string]SandboxRecord
	// Snapshots are the catalog's snapshots.
	Snapshots map[string]SnapshotRecord
	// QEMU maps each live QEMU process whose command line names a path
	// under the data directory to the sandbox whose run directory it
	// uses ("" if none: a bake, or a process of nobody).
	QEMU map[int]string
	// SandboxDirs are the directories in store/sandboxes, each with
	// whether it holds a complete pause capture (paused/manifest.json).
	SandboxDirs map[string]bool
	// RunDirs are the directories in run.
	RunDirs []string
	// SnapshotDirs, ForkDirs and LostFound are the entries of
	// store/snapshots (*.tmp included), store/forks and
	// store/lost+found.
	SnapshotDirs []string
	ForkDirs     []string
	LostFound    []string
	// Mounts are the mount points under the data directory.
	Mounts []string
	// With networking (NetPrefix set): Namespaces are the network
	// namespaces of the deployment's prefix, and NetNS maps each sandbox
	// directory to the namespace its sandbox.json names.
	NetPrefix  string
	Namespaces []string
	NetNS      map[string]string
	// DataDir is the data directory observed.
	DataDir string
}

// SandboxRecord is a sandbox as the catalog lists it.
type SandboxRecord struct {
	ID         string
	Key        int // index of the API key that lists it
	State      string
	StopReason string
	LastError  string
	ParentID   string
	SnapshotID string
	Metadata   map[string]string
}

// SnapshotRecord is a snapshot as the catalog lists it.
type SnapshotRecord struct {
	ID        string
	Key       int
	SandboxID string
}

// Expectation is what the invariants allow at one moment, from what the
// suite did and what it knows of its outcome.
type Expectation struct {
	// Sandboxes are the sandboxes the suite holds live, each with the
	// outcomes it may have now.
	Sandboxes map[string]Outcomes
	// Gone are sandboxes known stopped: they must stay stopped, for the
	// same reason (or be purged from the catalog).
	Gone map[string]string
	// Snapshots were acknowledged by the API and not deleted: each must be
	// listed and its files must exist.
	Snapshots map[string]bool
	// MaybeSnapshots may exist or not (a delete whose outcome is unknown).
	MaybeSnapshots map[string]bool
	// PendingCreates are the chaos_op labels of creates whose outcome is
	// unknown; PendingForks the parents of forks whose outcome is
	// unknown; PendingSnapshots the sources of snapshots whose outcome is
	// unknown. What they may have made is not a stranger.
	PendingCreates   map[string]bool
	PendingForks     map[string]bool
	PendingSnapshots map[string]bool
}

// Outcomes is the set of settled states a sandbox may be in: "running",
// "paused", or "stopped:REASON" for each stop reason that is allowed.
type Outcomes map[string]bool

// NewOutcomes makes a set of outcomes.
func NewOutcomes(o ...string) Outcomes {
	s := Outcomes{}
	for _, x := range o {
		s[x] = true
	}
	return s
}

func (o Outcomes) String() string {
	var l []string
	for x := range o {
		l = append(l, x)
	}
	sort.Strings(l)
	return strings.Join(l, " or ")
}

// allows reports whether the record's state (and stop reason) is one of o.
func (o Outcomes) allows(rec SandboxRecord) bool {
	return o[outcomeOf(rec)]
}

func outcomeOf(rec SandboxRecord) string {
	if rec.State == stateStopped {
		return stateStopped + ":" + rec.StopReason
	}
	return rec.State
}

// The sandbox states of the API.
const (
	stateRunning  = "running"
	statePaused   = "paused"
	stateStopped  = "stopped"
	stateStarting = "starting"
)

// transitional reports whether state is one a sandbox passes through
// (starting, pausing, resuming, stopping) rather than stays in.
func transitional(state string) bool {
	switch state {
	case stateRunning, statePaused, stateStopped:
		return false
	}
	return true
}

// Metadata labels the suite puts on the sandboxes it creates.
const (
	labelRun = "chaos"    // the run's id
	labelOp  = "chaos_op" // the create operation's number
)

// Check compares an observation with an expectation and returns every
// invariant that does not hold, one sentence each, sorted; none means the
// deployment is as it must be. It is pure: what it needs is in its
// arguments.
//
// The invariants:
//   - the catalog lists every sandbox the suite holds, in one of the
//     outcomes allowed for it, and no sandbox in a transitional state; a
//     sandbox known stopped stays stopped; a sandbox the suite does not know
//     is a stranger unless an operation whose outcome is unknown may have
//     made it;
//   - every running sandbox has exactly one live QEMU process, a sandbox
//     directory and a run directory; a paused one has no QEMU and a
//     complete pause capture; no QEMU, sandbox directory or run directory
//     belongs to no live sandbox;
//   - every snapshot the API acknowledged is listed and has its files; no
//     snapshot directory belongs to no snapshot; no *.tmp snapshot, fork
//     capture or lost+found entry is left;
//   - nothing is mounted under the data directory but its store.
func Check(exp Expectation, obs Observation) []string {
	c := &checker{exp: exp, obs: obs}
	c.catalog()
	byID := c.processes()
	c.directories(byID)
	c.snapshots()
	c.network()
	c.mounts()
	sort.Strings(c.v)
	return c.v
}

// checker gathers the violations Check finds, in any order.
type checker struct {
	exp Expectation
	obs Observation
	v   []string
}

func (c *checker) add(format string, args ...any) { c.v = append(c.v, fmt.Sprintf(format, args...)) }

// catalog checks the catalog's sandboxes against the suite's: each it
// holds is listed in an allowed settled state, each known stopped stays
// stopped for its reason, and any other is one an interrupted operation
// may have made, settled but not paused.
func (c *checker) catalog() {
	exp, obs := c.exp, c.obs
	for id, want := range exp.Sandboxes {
		rec, ok := obs.Sandboxes[id]
		switch {
		case !ok:
			c.add("sandbox %s is lost: the catalog does not list it (want %s)", id, want)
		case transitional(rec.State):
			c.add("sandbox %s is still %s (want %s)", id, rec.State, want)
		case !want.allows(rec):
			c.add("sandbox %s is %s (last_error %q); want %s", id, describe(rec), rec.LastError, want)
		}
	}
	for id, rec := range obs.Sandboxes {
		if _, ok := exp.Sandboxes[id]; ok {
			continue
		}
		if reason, ok := exp.Gone[id]; ok {
			if rec.State != stateStopped || rec.StopReason != reason {
				c.add("sandbox %s was stopped (%s) and is now %s", id, reason, describe(rec))
			}
			continue
		}
		switch {
		case !adoptable(exp, rec):
			c.add("sandbox %s is %s but the suite never made it (parent %q, metadata %v)", id, describe(rec), rec.ParentID, rec.Metadata)
		case transitional(rec.State):
			c.add("sandbox %s (made by an interrupted operation) is still %s", id, rec.State)
		case rec.State == statePaused:
			c.add("sandbox %s (made by an interrupted operation) is paused, which no create or fork does", id)
		}
	}
}

// processes checks that every QEMU process serves one live, running
// sandbox, alone, and returns the processes by sandbox.
func (c *checker) processes() map[string][]int {
	byID := map[string][]int{}
	for pid, id := range c.obs.QEMU {
		if id == "" {
			c.add("QEMU process %d serves no sandbox", pid)
			continue
		}
		byID[id] = append(byID[id], pid)
	}
	for id, pids := range byID {
		slices.Sort(pids)
		rec, ok := c.obs.Sandboxes[id]
		switch {
		case !ok:
			c.add("QEMU process %v serves sandbox %s, which the catalog does not list", pids, id)
		case rec.State == stateStopped || rec.State == statePaused:
			c.add("QEMU process %v serves sandbox %s, which is %s", pids, id, describe(rec))
		case len(pids) > 1:
			c.add("sandbox %s has %d QEMU processes %v, want one", id, len(pids), pids)
		}
	}
	return byID
}

// directories checks that a running sandbox has a QEMU process (byID: by
// sandbox), a sandbox directory and a run directory, and a paused one a
// complete pause capture; and that no sandbox or run directory belongs
// to no live sandbox (nor a run directory to a paused one).
func (c *checker) directories(byID map[string][]int) {
	obs := c.obs
	runDirs := toSet(obs.RunDirs)
	for id, rec := range obs.Sandboxes {
		_, hasDir := obs.SandboxDirs[id]
		switch rec.State {
		case stateRunning:
			if len(byID[id]) == 0 {
				c.add("running sandbox %s has no QEMU process", id)
			}
			if !hasDir {
				c.add("running sandbox %s has no directory in store/sandboxes", id)
			}
			if !runDirs[id] {
				c.add("running sandbox %s has no run directory", id)
			}
		case statePaused:
			if !obs.SandboxDirs[id] {
				c.add("paused sandbox %s has no complete pause capture (store/sandboxes/%s/paused/manifest.json)", id, id)
			}
		}
	}
	for id := range obs.SandboxDirs {
		if rec, ok := obs.Sandboxes[id]; !ok || rec.State == stateStopped {
			c.add("store/sandboxes/%s belongs to no live sandbox", id)
		}
	}
	for id := range runDirs {
		rec, ok := obs.Sandboxes[id]
		if !ok || rec.State == stateStopped || rec.State == statePaused {
			what := "no sandbox"
			if ok {
				what = "sandbox " + id + ", which is " + describe(rec)
			}
			c.add("run/%s belongs to %s", id, what)
		}
	}
}

// snapshots checks that every snapshot acknowledged is listed and has its
// files, that every snapshot listed was acknowledged or may have been
// made, and that no snapshot directory is left over (nor a *.tmp one, a
// fork capture or a lost+found entry).
func (c *checker) snapshots() {
	exp, obs := c.exp, c.obs
	snapDirs := map[string]bool{}
	for _, d := range obs.SnapshotDirs {
		if strings.HasSuffix(d, ".tmp") {
			c.add("store/snapshots/%s is left from an interrupted snapshot", d)
			continue
		}
		snapDirs[d] = true
		if _, ok := obs.Snapshots[d]; !ok && !exp.MaybeSnapshots[d] {
			c.add("store/snapshots/%s belongs to no snapshot in the catalog", d)
		}
	}
	for id := range exp.Snapshots {
		if _, ok := obs.Snapshots[id]; !ok {
			c.add("snapshot %s was acknowledged but the catalog does not list it", id)
		}
	}
	for id, sn := range obs.Snapshots {
		if !snapDirs[id] {
			c.add("snapshot %s (of sandbox %s) is listed but its files are gone", id, sn.SandboxID)
		}
		if !exp.Snapshots[id] && !exp.MaybeSnapshots[id] && !exp.PendingSnapshots[sn.SandboxID] {
			c.add("snapshot %s of sandbox %s was never acknowledged nor interrupted", id, sn.SandboxID)
		}
	}
	for _, d := range obs.ForkDirs {
		c.add("store/forks/%s is left from a fork", d)
	}
	for _, d := range obs.LostFound {
		c.add("store/lost+found/%s: recovery gave up on a sandbox's data", d)
	}
}

// network checks, with networking, that every running sandbox has a
// network namespace of its own and every namespace is a running
// sandbox's (the deployment keeps no pool).
func (c *checker) network() {
	obs := c.obs
	if obs.NetPrefix == "" {
		return
	}
	live := toSet(obs.Namespaces)
	owner := map[string]string{}
	for id, rec := range obs.Sandboxes {
		if rec.State != stateRunning {
			continue
		}
		ns := obs.NetNS[id]
		switch {
		case ns == "":
			c.add("running sandbox %s names no network namespace", id)
		case !live[ns]:
			c.add("running sandbox %s has lost its network namespace %s", id, ns)
		case owner[ns] != "":
			c.add("sandboxes %s and %s share the network namespace %s", owner[ns], id, ns)
		default:
			owner[ns] = id
		}
	}
	for _, ns := range obs.Namespaces {
		if owner[ns] == "" {
			c.add("network namespace %s belongs to no running sandbox", ns)
		}
	}
}

// mounts checks that nothing is mounted under the data directory but its
// store.
func (c *checker) mounts() {
	store := filepath.Join(c.obs.DataDir, "store")
	for _, mp := range c.obs.Mounts {
		if mp != store {
			c.add("%s is mounted", mp)
		}
	}
}

// adoptable reports whether an interrupted operation may have made rec: a
// fork of its parent, or a create labelled with its operation.
func adoptable(exp Expectation, rec SandboxRecord) bool {
	if rec.ParentID != "" {
		return exp.PendingForks[rec.ParentID]
	}
	return exp.PendingCreates[rec.Metadata[labelOp]]
}

func describe(rec SandboxRecord) string {
	if rec.State == stateStopped {
		return fmt.Sprintf("stopped (%s)", rec.StopReason)
	}
	return rec.State
}

func toSet(l []string) map[string]bool {
	m := make(map[string]bool, len(l))
	for _, x := range l {
		m[x] = true
	}
	return m
}
