package chaos

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// model is what the suite knows of the deployment: the sandboxes it holds
// and what they contain, the snapshots the API acknowledged, and the
// operations whose outcome it does not know yet. Only the run loop's
// goroutine uses it.
type model struct {
	live  map[string]*sbox
	gone  map[string]string // stopped sandbox → its stop reason
	snaps map[string]*snapshot
	// maybeSnaps were being deleted when a fault hit.
	maybeSnaps map[string]*snapshot
	// What operations whose outcome is unknown may have made: creates
	// by operation number, forks by parent, snapshots by source.
	pendingCreates map[string]contents
	pendingForks   map[string][]contents
	pendingSnaps   map[string][]contents
	// shutdown is the stop reason of every sandbox that ran when its host
	// stopped gracefully this iteration (server_shutdown, host_shutdown);
	// "" if it did not.
	shutdown string
}

func newModel() *model {
	return &model{
		live: map[string]*sbox{}, gone: map[string]string{}, snaps: map[string]*snapshot{}, maybeSnaps: map[string]*snapshot{},
		pendingCreates: map[string]contents{}, pendingForks: map[string][]contents{}, pendingSnaps: map[string][]contents{},
	}
}

// contents is what a sandbox holds that the suite checks: files it wrote
// and marker processes it started.
type contents struct {
	key   int
	files map[string]fileWant
	// markers are the tokens of marker processes (sleep TOKEN): true if
	// it must run, false if it may (its start was interrupted).
	markers  map[string]bool
	shortTTL bool
}

// fileWant is what a file may hold: one of sums (SHA-256, hex), or be
// absent if maybeAbsent (its first write was interrupted).
type fileWant struct {
	sums        map[string]bool
	maybeAbsent bool
}

func (c contents) clone() contents {
	out := contents{key: c.key, files: map[string]fileWant{}, markers: maps.Clone(c.markers), shortTTL: c.shortTTL}
	if out.markers == nil {
		out.markers = map[string]bool{}
	}
	for p, f := range c.files {
		out.files[p] = fileWant{sums: maps.Clone(f.sums), maybeAbsent: f.maybeAbsent}
	}
	return out
}

// merge is what any one of cs may be: a file may hold what it holds in
// any of them (and be absent if it may be in one), a marker must run only
// if it must in all.
func merge(cs []contents) contents {
	out := cs[0].clone()
	for _, c := range cs[1:] {
		for p, f := range c.files {
			w, ok := out.files[p]
			if !ok {
				w = fileWant{sums: map[string]bool{}, maybeAbsent: true}
			}
			for s := range f.sums {
				w.sums[s] = true
			}
			w.maybeAbsent = w.maybeAbsent || f.maybeAbsent
			out.files[p] = w
		}
		for p, w := range out.files {
			if _, ok := c.files[p]; !ok {
				w.maybeAbsent = true
				out.files[p] = w
			}
		}
		for tok, must := range c.markers {
			out.markers[tok] = out.markers[tok] && must
		}
		for tok := range out.markers {
			if _, ok := c.markers[tok]; !ok {
				out.markers[tok] = false
			}
		}
		out.shortTTL = out.shortTTL || c.shortTTL
	}
	return out
}

// sbox is a sandbox the suite holds (live).
type sbox struct {
	id    string
	state string // running or paused, as last settled
	contents
	// This iteration: the outcomes its operations may have left, whether
	// it may have run at all, whether its VMM was killed, whether its
	// contents must be checked once it runs.
	out          Outcomes
	vmmKilled    bool
	checkContent bool
	busy         bool // an operation of this iteration targets it
	killRace     bool // a kill races its operation this iteration
}

// snapshot is a snapshot the API acknowledged, with what a sandbox
// created from it must hold.
type snapshot struct {
	id     string
	source string
	contents
	busy bool
}

// begin starts an iteration: every sandbox is in its settled state, and
// one whose TTL is short may expire from now on while it runs.
func (m *model) begin() {
	m.shutdown = ""
	for _, sb := range m.live {
		sb.out = NewOutcomes(sb.state)
		sb.vmmKilled, sb.busy, sb.killRace = false, false, false
		sb.mayExpire()
	}
	for _, sn := range m.snaps {
		sn.busy = false
	}
}

// mayExpire adds expiry to the outcomes of a sandbox with a short TTL that
// may run: a paused sandbox never expires.
func (sb *sbox) mayExpire() {
	if sb.shortTTL && sb.out[stateRunning] {
		sb.out["stopped:expired"] = true
	}
}

// expectation is what the invariants allow now.
func (m *model) expectation() Expectation {
	exp := Expectation{
		Sandboxes: map[string]Outcomes{}, Gone: maps.Clone(m.gone),
		Snapshots: map[string]bool{}, MaybeSnapshots: map[string]bool{},
		PendingCreates: map[string]bool{}, PendingForks: map[string]bool{}, PendingSnapshots: map[string]bool{},
	}
	for id, sb := range m.live {
		sb.mayExpire()
		o := maps.Clone(sb.out)
		if sb.vmmKilled {
			// Its VMM was alive when killed: whatever else happened, it
			// may have stopped for that (first), and it does not run.
			delete(o, stateRunning)
			o["stopped:vmm_exited"] = true
		}
		if m.shutdown != "" && o[stateRunning] {
			delete(o, stateRunning)
			o["stopped:"+m.shutdown] = true
		}
		exp.Sandboxes[id] = o
	}
	for id := range m.snaps {
		exp.Snapshots[id] = true
	}
	for id := range m.maybeSnaps {
		exp.MaybeSnapshots[id] = true
	}
	for op := range m.pendingCreates {
		exp.PendingCreates[op] = true
	}
	for p := range m.pendingForks {
		exp.PendingForks[p] = true
	}
	for s := range m.pendingSnaps {
		exp.PendingSnapshots[s] = true
	}
	return exp
}

// commit takes what a passing check observed as the new settled state:
// sandboxes stopped are gone, unknown ones that interrupted operations
// made are adopted, and snapshots whose outcome was unknown are known. It
// returns the sandboxes adopted.
func (m *model) commit(obs Observation) (adopted []*sbox) {
	for id, sb := range m.live {
		rec := obs.Sandboxes[id]
		if rec.State == stateStopped {
			delete(m.live, id)
			m.gone[id] = rec.StopReason
			continue
		}
		sb.state = rec.State
	}
	ids := slices.Sorted(maps.Keys(obs.Sandboxes))
	for _, id := range ids {
		rec := obs.Sandboxes[id]
		if _, ok := m.live[id]; ok {
			continue
		}
		if _, ok := m.gone[id]; ok {
			continue
		}
		if rec.State == stateStopped {
			m.gone[id] = rec.StopReason
			continue
		}
		var c contents
		if rec.ParentID != "" {
			c = merge(m.pendingForks[rec.ParentID])
		} else {
			c = m.pendingCreates[rec.Metadata[labelOp]].clone()
		}
		c.key = rec.Key
		sb := &sbox{id: id, state: rec.State, contents: c, checkContent: true}
		m.live[id] = sb
		adopted = append(adopted, sb)
	}
	clear(m.pendingCreates)
	clear(m.pendingForks)
	for id, sn := range m.maybeSnaps {
		if _, ok := obs.Snapshots[id]; ok {
			m.snaps[id] = sn
		}
		delete(m.maybeSnaps, id)
	}
	for _, id := range slices.Sorted(maps.Keys(obs.Snapshots)) {
		rec := obs.Snapshots[id]
		if _, ok := m.snaps[id]; ok {
			continue
		}
		if pend := m.pendingSnaps[rec.SandboxID]; len(pend) > 0 {
			c := merge(pend)
			c.key = rec.Key
			m.snaps[id] = &snapshot{id: id, source: rec.SandboxID, contents: c}
		}
	}
	return adopted
}

// probe is the command that lists a sandbox's marker processes and the
// SHA-256 of its files.
const probe = `ps -o args | grep '^sleep '; sha256sum ` + filePrefix + `* 2>/dev/null; true`

// filePrefix is where the suite writes files in sandboxes: filePrefix+N.
const filePrefix = "/root/chaos."

// checkProbe compares the output of probe in a sandbox with what it must
// hold and returns what differs; it resolves what was uncertain (a marker
// whose start, or a file whose write, was interrupted) from what it found.
func (c *contents) checkProbe(id, out string) []string {
	running := map[string]bool{}
	files := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "sleep":
			running[f[1]] = true
		case len(f) == 2 && strings.HasPrefix(f[1], filePrefix):
			files[f[1]] = f[0]
		}
	}
	var v []string
	for tok, must := range c.markers {
		switch {
		case running[tok]:
			c.markers[tok] = true
		case must:
			v = append(v, fmt.Sprintf("sandbox %s lost its process `sleep %s`", id, tok))
		}
		// A marker whose start was interrupted and that does not run yet
		// stays possible: the guest may still start the command of a
		// request its host gave up on (its stream ended with the
		// session, its goroutine had not reached the start).
	}
	for tok := range running {
		if _, ok := c.markers[tok]; !ok {
			v = append(v, fmt.Sprintf("sandbox %s runs `sleep %s`, which it never started", id, tok))
		}
	}
	for p, w := range c.files {
		sum, ok := files[p]
		switch {
		case ok && w.sums[sum]:
			c.files[p] = fileWant{sums: map[string]bool{sum: true}}
		case ok:
			v = append(v, fmt.Sprintf("sandbox %s: %s has SHA-256 %.12s…, want %s", id, p, sum, sumList(w.sums)))
		case w.maybeAbsent:
			delete(c.files, p)
		default:
			v = append(v, fmt.Sprintf("sandbox %s lost its file %s", id, p))
		}
	}
	for p := range files {
		if _, ok := c.files[p]; !ok {
			v = append(v, fmt.Sprintf("sandbox %s has a file %s it never wrote", id, p))
		}
	}
	sort.Strings(v)
	return v
}

func sumList(sums map[string]bool) string {
	var l []string
	for s := range sums {
		l = append(l, s[:12]+"…")
	}
	sort.Strings(l)
	return strings.Join(l, " or ")
}
