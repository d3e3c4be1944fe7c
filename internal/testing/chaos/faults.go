package chaos

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// The faults the suite injects.
const (
	faultKillServer = "kill-server" // SIGKILL panda up (or panda server)
	faultKillAgent  = "kill-agent"  // SIGKILL panda agent (split mode)
	faultKillBoth   = "kill-both"   // SIGKILL both (split mode)
	faultKillQEMU   = "kill-qemu"   // SIGKILL a sandbox's QEMU
	faultTermServer = "term-server" // SIGTERM panda up (or panda server): a graceful restart
	faultTermAgent  = "term-agent"  // SIGTERM panda agent (split mode)
	faultFailpoint  = "failpoint"   // restart a process with a failpoint that crashes it
)

// faultWeights are the relative weights of the faults in each mode.
var faultWeights = map[bool][]struct {
	kind   string
	weight int
}{
	false: {{faultKillServer, 5}, {faultKillQEMU, 4}, {faultFailpoint, 6}, {faultTermServer, 1}},
	true: {{faultKillServer, 2}, {faultKillAgent, 3}, {faultKillBoth, 1}, {faultKillQEMU, 4}, {faultFailpoint, 6},
		{faultTermServer, 1}, {faultTermAgent, 1}},
}

// failpoints are the crash points of package failpoint the suite enables,
// with the process that runs them in split mode and an operation that
// reaches them ("" for several: see capture).
var failpoints = []struct {
	name, role, op string
}{
	{"capture-stopped", roleAgent, ""}, // pause, snapshot and fork capture
	{"pause-sealed", roleAgent, opPause},
	{"pause-recorded", roleAgent, opPause},
	{"resume-restored", roleAgent, opResume},
	{"fork-captured", roleAgent, opFork},
	{"api-snapshot-taken", roleServer, opSnapshot},
	{"api-resume-restored", roleServer, opResume},
}

// fault is one fault of an iteration.
type fault struct {
	kind  string
	delay time.Duration // after the operations start (kills, terms)
	sb    *sbox         // kill-qemu: whose VMM
	role  string        // failpoint: the process it is enabled in
	point string        // failpoint: its name
	op    string        // failpoint: an operation that reaches it

	// Outcome.
	pid int   // kill-qemu: the process killed (0: it had none)
	err error // term: the process did not exit cleanly
}

func (f *fault) String() string {
	switch f.kind {
	case faultKillQEMU:
		if f.pid == 0 {
			return fmt.Sprintf("%s %s@%v (no VMM)", f.kind, f.sb.id, f.delay.Round(time.Millisecond))
		}
		return fmt.Sprintf("%s %s (pid %d)@%v", f.kind, f.sb.id, f.pid, f.delay.Round(time.Millisecond))
	case faultFailpoint:
		return fmt.Sprintf("%s %s in panda %s", f.kind, f.point, f.role)
	}
	return fmt.Sprintf("%s@%v", f.kind, f.delay.Round(time.Millisecond))
}

// planFault picks this iteration's fault, or none.
func (r *runner) planFault() *fault {
	if r.rng.Float64() >= r.cfg.FaultRate {
		return nil
	}
	weights := faultWeights[r.cfg.Split]
	running := r.running()
	total := 0
	for _, w := range weights {
		if r.faultPossible(w.kind, running) {
			total += w.weight
		}
	}
	if total == 0 {
		return nil
	}
	x := r.rng.IntN(total)
	var kind string
	for _, w := range weights {
		if !r.faultPossible(w.kind, running) {
			continue
		}
		if x < w.weight {
			kind = w.kind
			break
		}
		x -= w.weight
	}
	f := &fault{kind: kind, delay: time.Duration(r.rng.IntN(1500)) * time.Millisecond}
	switch kind {
	case faultKillQEMU:
		f.sb = running[r.rng.IntN(len(running))]
	case faultFailpoint:
		fp := failpoints[r.rng.IntN(len(failpoints))]
		f.point, f.op, f.role = fp.name, fp.op, fp.role
		if !r.cfg.Split {
			f.role = roleServer
		}
		if f.op == "" {
			f.op = []string{opPause, opSnapshot, opFork}[r.rng.IntN(3)]
		}
	}
	return f
}

func (r *runner) faultPossible(kind string, running []*sbox) bool {
	if r.cfg.Soak > 0 {
		// A soak measures one server process: only its sandboxes die.
		return kind == faultKillQEMU && len(running) > 0
	}
	switch kind {
	case faultKillQEMU:
		return len(running) > 0
	case faultFailpoint:
		return !r.cl.anyArmed() // one armed process at a time
	case faultTermServer, faultTermAgent:
		// A graceful stop must exit 0: not a process that may be
		// crashing at its failpoint meanwhile.
		return !r.cl.anyArmed()
	}
	return true
}

// running lists the sandboxes the model holds running, in a stable order.
func (r *runner) running() []*sbox {
	var out []*sbox
	for _, id := range slices.Sorted(maps.Keys(r.m.live)) {
		if sb := r.m.live[id]; sb.state == stateRunning {
			out = append(out, sb)
		}
	}
	return out
}

// inject injects a timed fault (every kind but failpoint) while the
// operations run.
func (r *runner) inject(f *fault) {
	switch f.kind {
	case faultKillServer:
		r.cl.kill(roleServer)
	case faultKillAgent:
		r.cl.kill(roleAgent)
	case faultKillBoth:
		r.cl.kill(roleAgent)
		r.cl.kill(roleServer)
	case faultKillQEMU:
		f.pid = r.cl.killQEMU(f.sb.id)
	case faultTermServer:
		f.err = r.cl.term(roleServer)
	case faultTermAgent:
		f.err = r.cl.term(roleAgent)
	}
}
