// Package scheduler owns placement: which host of the fleet takes a new
// sandbox. It is a pure function of a request and the hosts as the control
// plane last saw them — no I/O, no clock, no randomness — so that equal
// input gives equal output and every rule is testable without a fleet.
//
// # Which hosts can take a sandbox
//
// Only Ready hosts take new sandboxes. A ready host has room for one more
// sandbox when all of these hold, counting the sandboxes already placed on
// it by the same call to Place (the children of one fork):
//
//   - memory: FreeMemoryMiB − ReserveMiB ≥ (placed+1) × estimate, where the
//     estimate is min(Request.MemoryMiB, EstimateMiB). A sandbox's memory is
//     restored from a memory image mapped lazily and shared copy-on-write:
//     it costs the host what it touches and dirties, not its memory_mib, so
//     reserving the full size would refuse hosts that have plenty of room.
//     FreeMemoryMiB (MemAvailable) already counts what the running sandboxes
//     really use. Sandboxes placed by earlier calls since the host's last
//     report are not in it: the caller may subtract what it knows of them,
//     but a new sandbox really costs tens of MiB, and the reserve absorbs a
//     burst of creates between two reports.
//   - vCPUs: VCPUs + (placed+1) × Request.VCPUs ≤ MaxVCPUsPerCPU × CPUs.
//     Sandboxes of AI agents are idle most of the time; the cap stops a pile
//     that would leave each vCPU a sliver of a core.
//   - disk: DiskFreeMiB − MinDiskFreeMiB ≥ (placed+1) × DiskEstimateMiB.
//     Disks are reflinked clones (near free); what grows is what sandboxes
//     write and a fork child's memory diff.
//
// # Which host is best (creates, and forks that leave the parent's host)
//
// Among the ready hosts with room, in this order:
//
//  1. the template is warm there (its memory image is on the host: nothing
//     to fetch before the restore);
//  2. more free memory, compared in whole MemoryBucketMiB steps after the
//     sandboxes already placed by this call (a few hundred MiB of difference
//     in MemAvailable is noise, not a reason to pile onto one host);
//  3. fewer vCPUs per host CPU, then fewer sandboxes per host CPU;
//  4. the smaller host ID.
//
// # The placement a request asks for
//
//   - Placement.Host names a host: every sandbox goes there, or the call
//     fails: ErrUnknownHost, ErrHostNotReady (draining, lost) or
//     ErrNoCapacity.
//   - A fork without a placement keeps each child on ParentHost while it is
//     ready and has room (no memory moves), else puts it on the best other
//     host; the reason says why it left.
//   - Placement.Spread puts the sandboxes round-robin over the ready hosts
//     that have room, in score order — the parent's host first for a fork —
//     skipping a host once it is full.
//   - Otherwise (creates) each sandbox goes to the best host.
//
// Place either places all Count sandboxes or fails: a call never answers
// part of a fork.
package scheduler

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/pandastack/pandastack/internal/contract/errs"
)

// HostState is a host's state as the control plane sees it.
type HostState string

// Host states. Only Ready hosts take new sandboxes.
const (
	Ready    HostState = "ready"
	Draining HostState = "draining"
	Lost     HostState = "lost"
)

// Host is one host as the control plane last saw it.
type Host struct {
	ID            string
	State         HostState
	CPUs          int      // host CPUs; 0 or less counts as 1
	MemoryMiB     int64    // host RAM
	FreeMemoryMiB int64    // MemAvailable, as last reported
	DiskFreeMiB   int64    // free space of its data directory
	Sandboxes     int      // live sandboxes on it (control plane's count)
	VCPUs         int      // sum of the vcpus of its live sandboxes
	WarmTemplates []string // templates whose memory image the host holds (names as the request gives them, e.g. "base", "myimg:3")
}

// Placement is what a request asks for: the zero value lets the scheduler choose.
// Its JSON forms are in placement.go (MarshalJSON, UnmarshalJSON).
type Placement struct {
	Host   string // this host, or an error
	Spread bool   // children over as many hosts as possible
}

// IsZero reports whether p leaves the choice to the scheduler.
func (p Placement) IsZero() bool { return p == Placement{} }

// Request is what to place.
type Request struct {
	// Template names the memory image the sandboxes start from, matched
	// exactly against Host.WarmTemplates ("" matches nothing).
	Template  string
	MemoryMiB int // guest memory; 0 or less: EstimateMiB is the estimate
	VCPUs     int // 0 or less counts as 1
	Count     int // sandboxes to place (fork children); 0 means 1
	// ParentHost is a fork's parent's host; "" for a create. (A resume
	// may pass the host that holds the paused sandbox's memory image.)
	ParentHost string
	Placement  Placement
}

// Choice is where one sandbox goes, and why.
type Choice struct {
	Host   string
	Reason string // short, for users and logs: "template base warm, 11.2 GiB free", "parent's host", "spread 2/3", "asked for"
}

// The constants of room and scoring (see the package doc).
const (
	// ReserveMiB is the free memory every host keeps for itself: no
	// placement may leave less than this of its MemAvailable.
	ReserveMiB = 1024
	// EstimateMiB caps what one new sandbox (a create or a fork child) is
	// expected to take from a host's free memory soon after it starts:
	// min(memory_mib, EstimateMiB). Idle sandboxes measure 27–36 MiB PSS,
	// fork children dirtying 8 MiB about 50 MiB; 256 MiB leaves headroom
	// for what they do next.
	EstimateMiB = 256
	// MaxVCPUsPerCPU caps the vCPUs of a host's live sandboxes at this
	// many times its CPUs. An idle sandbox costs about 0.5 % of a core, so
	// 64 idle vCPUs on a core keep a third of it busy doing nothing; and
	// `panda bench load` starts 100 sandboxes on a 2-CPU host.
	MaxVCPUsPerCPU = 64
	// MinDiskFreeMiB is the free disk below which a host takes nothing
	// (the host itself refuses creates below 256 MiB).
	MinDiskFreeMiB = 1024
	// DiskEstimateMiB is what one new sandbox is expected to write to the
	// host's disk soon after it starts (its rootfs is a reflinked clone).
	DiskEstimateMiB = 64
	// MemoryBucketMiB is the step in which free memory is compared.
	MemoryBucketMiB = 1024
	// MaxCount is the most sandboxes one call places.
	MaxCount = 1024
)

// Place's errors, each of a class of internal/contract/errs. Place's
// errors wrap exactly one of them (errors.Is) and carry the detail in
// their message: which host, its state, what was short.
var (
	ErrUnknownHost  = errs.New(errs.NotFound, "unknown host")
	ErrHostNotReady = errs.New(errs.Conflict, "host not ready")
	ErrNoCapacity   = errs.New(errs.Unavailable, "no capacity")
	// ErrInvalid: the request itself is wrong (Count negative or above
	// MaxCount, a Placement naming a host and asking to spread).
	ErrInvalid = errs.New(errs.Invalid, "invalid placement request")
)

// placeError is an error whose message is written for users and whose
// class is one of the sentinels.
type placeError struct {
	class error
	msg   string
}

func (e *placeError) Error() string { return e.msg }
func (e *placeError) Unwrap() error { return e.class }

func errorf(class error, format string, args ...any) error {
	return &placeError{class: class, msg: fmt.Sprintf(format, args...)}
}

// Bounds that keep the arithmetic in int64 whatever the input.
const (
	maxCPUs  = 1 << 20
	maxCount = 1 << 30 // sandboxes already on a host
	maxMiB   = 1 << 50
)

// host is a Host with its clamped figures and what this call placed on it.
type host struct {
	*Host
	cpus, vcpus, sandboxes int64
	free, disk             int64
	warm                   bool
	placed                 int64
}

// placer holds one call's state.
type placer struct {
	req   Request
	count int64
	est   int64 // memory estimate per sandbox, MiB
	vcpus int64 // vCPUs per sandbox
	hosts []*host
	byID  map[string]*host
}

// Place chooses a host for each of req.Count sandboxes (len(result) ==
// Count, or 1 when Count is 0). Deterministic for equal input. hosts is
// not modified; when two hosts have the same ID the first counts, and a
// host without an ID is ignored.
func Place(req Request, hosts []Host) ([]Choice, error) {
	p, err := newPlacer(req, hosts)
	if err != nil {
		return nil, err
	}
	out := make([]Choice, 0, p.count)
	pl := req.Placement
	switch {
	case pl.Host != "":
		return p.named(pl.Host, out)
	case pl.Spread:
		return p.spread(out)
	}
	for i := int64(0); i < p.count; i++ {
		c, err := p.one(i)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

func newPlacer(req Request, hosts []Host) (*placer, error) {
	if req.Count < 0 || req.Count > MaxCount {
		return nil, errorf(ErrInvalid, "cannot place %d sandboxes at once (at most %d)", req.Count, MaxCount)
	}
	if req.Placement.Host != "" && req.Placement.Spread {
		return nil, errorf(ErrInvalid, "placement names host %q and asks to spread: choose one", req.Placement.Host)
	}
	p := &placer{req: req, count: max(int64(req.Count), 1), byID: make(map[string]*host, len(hosts))}
	p.est = Estimate(req.MemoryMiB)
	p.vcpus = clamp(int64(req.VCPUs), 1, maxCPUs)
	for i := range hosts {
		h := &hosts[i]
		if _, dup := p.byID[h.ID]; dup || h.ID == "" {
			continue
		}
		st := &host{
			Host:      h,
			cpus:      clamp(int64(h.CPUs), 1, maxCPUs),
			vcpus:     clamp(int64(h.VCPUs), 0, maxCPUs*MaxVCPUsPerCPU+1),
			sandboxes: clamp(int64(h.Sandboxes), 0, maxCount),
			free:      clamp(h.FreeMemoryMiB, -1, maxMiB),
			disk:      clamp(h.DiskFreeMiB, -1, maxMiB),
			warm:      req.Template != "" && slices.Contains(h.WarmTemplates, req.Template),
		}
		p.byID[h.ID] = st
		p.hosts = append(p.hosts, st)
	}
	slices.SortFunc(p.hosts, func(a, b *host) int { return strings.Compare(a.ID, b.ID) })
	return p, nil
}

func clamp(v, lo, hi int64) int64 { return min(max(v, lo), hi) }

// Estimate is the host memory counted for a sandbox of memoryMiB of guest
// memory before its host reports what it really uses: min(memoryMiB,
// EstimateMiB), EstimateMiB for 0 or less.
func Estimate(memoryMiB int) int64 {
	if memoryMiB > 0 && memoryMiB < EstimateMiB {
		return int64(memoryMiB)
	}
	return EstimateMiB
}

// shortfall says why h cannot take one more sandbox ("" if it can).
func (p *placer) shortfall(h *host) string {
	if h.State != Ready {
		return stateText(h.State)
	}
	if need := ReserveMiB + (h.placed+1)*p.est; h.free < need {
		return fmt.Sprintf("%s free memory, needs %s", mibText(h.free), mibText(need))
	}
	if capV, used := MaxVCPUsPerCPU*h.cpus, h.vcpus+h.placed*p.vcpus; used+p.vcpus > capV {
		return fmt.Sprintf("%d of its %d vCPUs in use, needs %d more", used, capV, p.vcpus)
	}
	if need := MinDiskFreeMiB + (h.placed+1)*DiskEstimateMiB; h.disk < need {
		return fmt.Sprintf("%s free disk, needs %s", mibText(h.disk), mibText(need))
	}
	return ""
}

func stateText(s HostState) string {
	if s == "" {
		return "in no state"
	}
	return string(s)
}

// take records one more sandbox on h.
func (p *placer) take(h *host) { h.placed++ }

// freeNow is h's free memory after what this call placed on it.
func (p *placer) freeNow(h *host) int64 { return h.free - h.placed*p.est }

// better orders hosts best first (see the package doc).
func (p *placer) better(a, b *host) int {
	if a.warm != b.warm {
		if a.warm {
			return -1
		}
		return 1
	}
	if c := cmp.Compare(p.freeNow(b)/MemoryBucketMiB, p.freeNow(a)/MemoryBucketMiB); c != 0 {
		return c
	}
	// vCPUs per CPU: a.v/a.cpus < b.v/b.cpus, cross-multiplied (both
	// factors are clamped below 2^27, the products fit).
	av, bv := a.vcpus+a.placed*p.vcpus, b.vcpus+b.placed*p.vcpus
	if c := cmp.Compare(av*b.cpus, bv*a.cpus); c != 0 {
		return c
	}
	as, bs := min(a.sandboxes+a.placed, maxCount), min(b.sandboxes+b.placed, maxCount)
	if c := cmp.Compare(as*b.cpus, bs*a.cpus); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

// best is the best host with room other than skip, or nil.
func (p *placer) best(skip *host) *host {
	var b *host
	for _, h := range p.hosts {
		if h == skip || p.shortfall(h) != "" {
			continue
		}
		if b == nil || p.better(h, b) < 0 {
			b = h
		}
	}
	return b
}

// scoreReason is why the best host won: its template and free memory.
func (p *placer) scoreReason(h *host) string {
	free := mibText(p.freeNow(h)) + " free"
	switch {
	case p.req.Template == "":
		return free
	case h.warm:
		return "template " + p.req.Template + " warm, " + free
	}
	for _, o := range p.hosts {
		if o.warm && o.State == Ready {
			return "template " + p.req.Template + " warm only on hosts without room, " + free
		}
	}
	return "template " + p.req.Template + " cold, " + free
}

// one places the i-th sandbox of a create or of a fork without placement.
func (p *placer) one(i int64) (Choice, error) {
	var why string
	if p.req.ParentHost != "" {
		parent := p.byID[p.req.ParentHost]
		switch {
		case parent == nil:
			why = "parent's host " + p.req.ParentHost + " is unknown; "
		default:
			if s := p.shortfall(parent); s != "" {
				why = "parent's host " + parent.ID + " has no room (" + s + "); "
				if parent.State != Ready {
					why = "parent's host " + parent.ID + " is " + s + "; "
				}
			} else {
				p.take(parent)
				return Choice{Host: parent.ID, Reason: "parent's host"}, nil
			}
		}
	}
	h := p.best(nil)
	if h == nil {
		return Choice{}, p.noCapacity(i)
	}
	reason := why + p.scoreReason(h)
	p.take(h)
	return Choice{Host: h.ID, Reason: reason}, nil
}

// named places every sandbox on the host the request names.
func (p *placer) named(id string, out []Choice) ([]Choice, error) {
	h := p.byID[id]
	if h == nil {
		return nil, errorf(ErrUnknownHost, "unknown host %q%s", id, p.readyList())
	}
	if h.State != Ready {
		return nil, errorf(ErrHostNotReady, "host %s is %s: it takes no new sandboxes%s", id, stateText(h.State), p.readyList())
	}
	for i := int64(0); i < p.count; i++ {
		if s := p.shortfall(h); s != "" {
			if p.count == 1 {
				return nil, errorf(ErrNoCapacity, "host %s has no room for a sandbox (%s): %s", id, p.shape(), s)
			}
			return nil, errorf(ErrNoCapacity, "host %s has room for %d of %d sandboxes (%s each): %s", id, i, p.count, p.shape(), s)
		}
		p.take(h)
		out = append(out, Choice{Host: id, Reason: "asked for"})
	}
	return out, nil
}

// spread places the sandboxes round-robin over the ready hosts with room,
// in score order, the parent's host first.
func (p *placer) spread(out []Choice) ([]Choice, error) {
	var order []*host
	for _, h := range p.hosts {
		if p.shortfall(h) == "" {
			order = append(order, h)
		}
	}
	slices.SortFunc(order, func(a, b *host) int {
		pa, pb := a.ID == p.req.ParentHost, b.ID == p.req.ParentHost
		if pa != pb {
			if pa {
				return -1
			}
			return 1
		}
		return p.better(a, b)
	})
	n := int64(len(order))
	next := int64(0)
	for i := int64(0); i < p.count; i++ {
		var chosen int64 = -1
		for k := range n {
			j := (next + k) % n
			if p.shortfall(order[j]) == "" {
				chosen = j
				break
			}
		}
		if chosen < 0 {
			return nil, p.noCapacity(i)
		}
		p.take(order[chosen])
		out = append(out, Choice{Host: order[chosen].ID, Reason: fmt.Sprintf("spread %d/%d", chosen+1, n)})
		next = chosen + 1
	}
	return out, nil
}

// noCapacity is the error when no host has room for the i-th sandbox: what
// was short on each host (at most maxListed of them).
func (p *placer) noCapacity(i int64) error {
	const maxListed = 8
	var what string
	if p.count == 1 {
		what = "a sandbox (" + p.shape() + ")"
	} else {
		what = fmt.Sprintf("sandbox %d of %d (%s each)", i+1, p.count, p.shape())
	}
	if len(p.hosts) == 0 {
		return errorf(ErrNoCapacity, "no host has room for %s: there are no hosts", what)
	}
	var b strings.Builder
	for k, h := range p.hosts {
		if k == maxListed {
			fmt.Fprintf(&b, "; and %d more", len(p.hosts)-maxListed)
			break
		}
		if k > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %s", h.ID, p.shortfall(h))
	}
	return errorf(ErrNoCapacity, "no host has room for %s: %s", what, b.String())
}

// shape is the request's size as users gave it and as the scheduler counts it.
func (p *placer) shape() string {
	v := "vCPU"
	if p.vcpus != 1 {
		v = "vCPUs"
	}
	return fmt.Sprintf("%d %s, counted as %s of memory", p.vcpus, v, mibText(p.est))
}

// readyList names the ready hosts, for an error about a named one.
func (p *placer) readyList() string {
	const maxListed = 8
	var ids []string
	for _, h := range p.hosts {
		if h.State == Ready {
			ids = append(ids, h.ID)
		}
	}
	switch {
	case len(ids) == 0:
		return " (no host is ready)"
	case len(ids) > maxListed:
		return fmt.Sprintf(" (ready hosts: %s and %d more)", strings.Join(ids[:maxListed], ", "), len(ids)-maxListed)
	}
	return " (ready hosts: " + strings.Join(ids, ", ") + ")"
}

// mibText is n MiB for people: "900 MiB", "11.2 GiB".
func mibText(n int64) string {
	if n < 1024 && n > -1024 {
		return fmt.Sprintf("%d MiB", n)
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/1024)
}
