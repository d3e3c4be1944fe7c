package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// ClusterOptions configures ClusterBench.
type ClusterOptions struct {
	Template  string
	MemoryMiB int
	// DirtyMiB is what each parent writes to memory (/dev/shm) before it is
	// forked: the part of its RAM that differs from its template.
	DirtyMiB int
	// N is the rounds of each measurement.
	N int
	// LazyDirtyMiB is what the parents of the lazy-restore rounds write
	// to memory before they are paused and resumed on another host: enough
	// that its image is paged in lazily there (at least 64 MiB to fetch,
	// docs/lazy-restore.md). 0 skips those rounds.
	LazyDirtyMiB int
	// EnvMiB, if > 0, creates the fork rounds' parents from a snapshot
	// (an environment: EnvMiB of random data, half on its disk, half in
	// its memory) that both hosts hold, rather than from the template:
	// a cross-host fork then moves what the parent dirtied since the
	// snapshot, not the snapshot's data too.
	EnvMiB int
	Log    io.Writer
}

// ClusterResult is what ClusterBench measured, in one run.
type ClusterResult struct {
	Hosts     []string `json:"hosts"`
	Template  string   `json:"template"`
	MemoryMiB int      `json:"memory_mib"`
	DirtyMiB  int      `json:"dirty_mib"`
	// EnvMiB is ClusterOptions.EnvMiB; EnvSnapshot the snapshot made.
	EnvMiB      int    `json:"env_mib,omitempty"`
	EnvSnapshot string `json:"env_snapshot,omitempty"`
	// Fork → the child's first exec answered, on the parent's host and on
	// another host.
	SameHostForkFirstExec  Dist `json:"same_host_fork_first_exec"`
	CrossHostForkFirstExec Dist `json:"cross_host_fork_first_exec"`
	// Fork → the fork's answer (the child running), before its first
	// exec: the rest of the figures above is that exec, the child's first
	// (under TCG it pays the translation of the guest's exec path).
	SameHostForkAnswer  Dist `json:"same_host_fork_answer"`
	CrossHostForkAnswer Dist `json:"cross_host_fork_answer"`
	// What a cross-host fork moved (p50 over the rounds): what the
	// parent's host sent straight to the other host, plus its upload and
	// the other host's fetch where the capture went through the object
	// store (docs/storage.md: only the chunks and pages that differ from
	// the template travel when both hold it), against the parent's dirty memory and its RAM; and the
	// capture's own size, for comparison (what moved before templates
	// were seeds).
	CrossHostMovedMiBP50  float64 `json:"cross_host_moved_mib_p50"`
	CrossHostDirectMiBP50 float64 `json:"cross_host_direct_mib_p50"`
	// CrossHostPulledMiBP50: of the direct bytes, those the child's host
	// fetched from the parent's itself (not relayed by the control plane).
	CrossHostPulledMiBP50    float64 `json:"cross_host_pulled_mib_p50"`
	CrossHostUploadedMiBP50  float64 `json:"cross_host_uploaded_mib_p50"`
	CrossHostFetchedMiBP50   float64 `json:"cross_host_fetched_mib_p50"`
	CrossHostDirtyMiBP50     float64 `json:"cross_host_dirty_mib_p50"`
	MovedPerDirty            float64 `json:"moved_per_dirty"`
	MovedPerRAM              float64 `json:"moved_per_ram"`
	CrossHostCaptureMiBP50   float64 `json:"cross_host_capture_mib_p50"`
	ResumeElsewhereFirstExec Dist    `json:"resume_elsewhere_first_exec"`
	// Lazy restore: a paused sandbox that dirtied LazyDirtyMiB, resumed on
	// another host (→ first exec), and the fraction of its memory image
	// that host had fetched from the object store by the first exec's
	// answer (the sandbox's memory.lazy). LazyNote says why there are no
	// figures (hosts without lazy restore).
	LazyDirtyMiB           int     `json:"lazy_dirty_mib,omitempty"`
	LazyResumeFirstExec    *Dist   `json:"lazy_resume_first_exec,omitempty"`
	LazyImageMiB           float64 `json:"lazy_image_mib,omitempty"`
	LazyFetchedMiBP50      float64 `json:"lazy_fetched_mib_p50,omitempty"`
	LazyFetchedFractionP50 float64 `json:"lazy_fetched_fraction_p50,omitempty"`
	LazyNote               string  `json:"lazy_note,omitempty"`
}

// ClusterBench measures a fleet of at least two hosts sharing an object
// store, through its REST API: same-host against cross-host fork (child's
// first exec), the bytes a cross-host fork moves, and a paused sandbox
// resumed on a host that never saw it (first exec). Every sandbox it makes
// is labelled panda_bench=<run> and killed before it returns.
func ClusterBench(ctx context.Context, c *pandastack.Client, o ClusterOptions) (ClusterResult, error) {
	res := ClusterResult{Template: o.Template, MemoryMiB: o.MemoryMiB, DirtyMiB: o.DirtyMiB}
	hosts, err := c.Hosts(ctx)
	if err != nil {
		return res, err
	}
	for _, h := range hosts {
		if h.State == "ready" {
			res.Hosts = append(res.Hosts, h.ID)
		}
	}
	if len(res.Hosts) < 2 {
		return res, fmt.Errorf("a cluster benchmark needs two ready hosts, the server has %d (panda dev cluster starts three)", len(res.Hosts))
	}
	cr := &clusterRun{c: c, o: o, a: res.Hosts[0], b: res.Hosts[1], run: fmt.Sprintf("cluster-%d", time.Now().UnixNano()), logf: logTo(o.Log)}
	defer cr.killAll(ctx)
	if o.EnvMiB > 0 {
		snap, err := cr.environment(ctx)
		if snap != "" {
			defer c.DeleteSnapshot(context.WithoutCancel(ctx), snap)
		}
		if err != nil {
			return res, err
		}
		res.EnvMiB, res.EnvSnapshot = o.EnvMiB, snap
	}
	var s clusterSamples
	for i := range o.N {
		cr.logf("round %d/%d", i+1, o.N)
		if err := cr.round(ctx, &s); err != nil {
			return res, err
		}
	}
	s.summarize(&res, o.MemoryMiB)
	if len(s.same) == 0 {
		return res, errors.New("nothing measured")
	}
	if o.LazyDirtyMiB > 0 {
		if err := cr.lazyRounds(ctx, &res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// clusterRun is one ClusterBench: hosts a (the parents') and b (the
// other), and every sandbox it made (killed when it ends).
type clusterRun struct {
	c    *pandastack.Client
	o    ClusterOptions
	a, b string // host ids
	run  string // the panda_bench label of its sandboxes
	logf func(format string, args ...any)
	// fromSnapshot, if set, is the environment snapshot parents are
	// created from (ClusterOptions.EnvMiB).
	fromSnapshot string
	made         []*pandastack.Sandbox
}

// killAll kills every sandbox the run made, within a minute, even once
// ctx has ended.
func (cr *clusterRun) killAll(ctx context.Context) {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	for _, sb := range cr.made {
		sb.Kill(kctx)
	}
}

// execTrue runs true in sb once (a sandbox's first exec, when timed).
func execTrue(ctx context.Context, sb *pandastack.Sandbox) error {
	r, err := sb.Exec(ctx, pandastack.Command{Argv: []string{"true"}})
	if err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("true exited %d", r.ExitCode)
	}
	return err
}

// execShell runs cmd with /bin/sh in sb, which must exit 0; what names
// it in the error.
func execShell(ctx context.Context, sb *pandastack.Sandbox, what, cmd string) error {
	r, err := sb.Exec(ctx, pandastack.Command{Argv: []string{"/bin/sh", "-c", cmd}})
	if err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("exit %d: %s", r.ExitCode, r.Stderr)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// parentOn creates a parent on host hostID, from the template or the
// environment snapshot, that has written dirtyMiB to its memory.
func (cr *clusterRun) parentOn(ctx context.Context, hostID string, dirtyMiB int) (*pandastack.Sandbox, error) {
	co := pandastack.CreateOptions{Template: cr.o.Template, MemoryMiB: cr.o.MemoryMiB, Metadata: map[string]string{"panda_bench": cr.run}, Placement: pandastack.OnHost(hostID)}
	if cr.fromSnapshot != "" {
		co.Template, co.MemoryMiB, co.SnapshotID = "", 0, cr.fromSnapshot
	}
	sb, err := cr.c.Create(ctx, co)
	if err != nil {
		return nil, err
	}
	cr.made = append(cr.made, sb)
	if dirtyMiB > 0 {
		if err := execShell(ctx, sb, "dirtying memory", fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/dirty bs=1048576 count=%d 2>/dev/null", dirtyMiB)); err != nil {
			return nil, err
		}
	}
	return sb, nil
}

// environment makes the snapshot parents are created from (o.EnvMiB of
// random data, half on its disk, half in its memory) and has host b make
// a sandbox from it too, so that both hold it; from then on parentOn
// creates from it. It returns the snapshot's id once it exists, with an
// error too: the caller deletes it.
func (cr *clusterRun) environment(ctx context.Context) (string, error) {
	cr.logf("environment snapshot of %d MiB", cr.o.EnvMiB)
	env, err := cr.parentOn(ctx, cr.a, 0)
	if err != nil {
		return "", fmt.Errorf("environment: %w", err)
	}
	half := cr.o.EnvMiB / 2
	if err := execShell(ctx, env, "environment", fmt.Sprintf("dd if=/dev/urandom of=/root/env.bin bs=1048576 count=%d 2>/dev/null && dd if=/dev/urandom of=/dev/shm/env bs=1048576 count=%d 2>/dev/null && sync", half, cr.o.EnvMiB-half)); err != nil {
		return "", err
	}
	snap, err := env.Snapshot(ctx, cr.run+"-env")
	if err != nil {
		return "", fmt.Errorf("environment: snapshot: %w", err)
	}
	env.Kill(ctx)
	cr.fromSnapshot = snap.ID
	onB, err := cr.parentOn(ctx, cr.b, 0)
	if err != nil {
		return snap.ID, fmt.Errorf("environment on %s: %w", cr.b, err)
	}
	onB.Kill(ctx)
	return snap.ID, nil
}

// clusterSamples are ClusterBench's fork and resume rounds' samples;
// the sizes are MiB.
type clusterSamples struct {
	same, cross, resume, sameAnswer, crossAnswer    []time.Duration
	capture, dirty, direct, pulled, up, down, moved []float64
}

// round forks a parent on host a that dirtied o.DirtyMiB once onto a and
// once onto b (each until the child's first exec), then pauses it and
// resumes it on b (until its first exec there).
func (cr *clusterRun) round(ctx context.Context, s *clusterSamples) error {
	a, b := cr.a, cr.b
	parent, err := cr.parentOn(ctx, a, cr.o.DirtyMiB)
	if err != nil {
		return fmt.Errorf("parent: %w", err)
	}
	for _, tc := range []struct {
		to          string
		out, answer *[]time.Duration
	}{{a, &s.same, &s.sameAnswer}, {b, &s.cross, &s.crossAnswer}} {
		t0 := time.Now()
		fr, err := parent.ForkWithOptions(ctx, pandastack.ForkOptions{Count: 1, Placement: pandastack.OnHost(tc.to)})
		cr.made = append(cr.made, fr.Children...)
		if err != nil {
			return fmt.Errorf("fork to %s: %w", tc.to, err)
		}
		*tc.answer = append(*tc.answer, time.Since(t0))
		if err := execTrue(ctx, fr.Children[0]); err != nil {
			return fmt.Errorf("child on %s: %w", tc.to, err)
		}
		*tc.out = append(*tc.out, time.Since(t0))
		if tc.to == b {
			s.addCrossHost(fr)
		}
		fr.Children[0].Kill(ctx)
	}
	// Pause on a, resume on b (which never saw it).
	if err := parent.Pause(ctx); err != nil {
		return fmt.Errorf("pause: %w", err)
	}
	t0 := time.Now()
	if err := parent.ResumeOn(ctx, pandastack.OnHost(b)); err != nil {
		return fmt.Errorf("resume on %s: %w", b, err)
	}
	if parent.Info.HostID != b {
		return fmt.Errorf("resumed on %s, asked for %s", parent.Info.HostID, b)
	}
	if err := execTrue(ctx, parent); err != nil {
		return fmt.Errorf("resumed sandbox: %w", err)
	}
	s.resume = append(s.resume, time.Since(t0))
	parent.Kill(ctx)
	return nil
}

// addCrossHost records what the cross-host fork fr moved, in MiB.
func (s *clusterSamples) addCrossHost(fr pandastack.ForkResult) {
	s.capture = append(s.capture, float64(fr.CrossHostCaptureBytes)/(1<<20))
	s.direct = append(s.direct, float64(fr.CrossHostDirectBytes)/(1<<20))
	s.pulled = append(s.pulled, float64(fr.CrossHostPulledBytes)/(1<<20))
	s.up = append(s.up, float64(fr.CrossHostUploadedBytes)/(1<<20))
	s.down = append(s.down, float64(fr.CrossHostFetchedBytes)/(1<<20))
	s.moved = append(s.moved, float64(fr.CrossHostDirectBytes+fr.CrossHostUploadedBytes+fr.CrossHostFetchedBytes)/(1<<20))
	s.dirty = append(s.dirty, float64(fr.DirtyBytes)/(1<<20))
}

// summarize sets res's fork and resume figures from the samples, the
// moved bytes also per MiB dirtied and per MiB of guest RAM (memoryMiB).
func (s *clusterSamples) summarize(res *ClusterResult, memoryMiB int) {
	res.SameHostForkFirstExec = Summarize(s.same)
	res.CrossHostForkFirstExec = Summarize(s.cross)
	res.SameHostForkAnswer, res.CrossHostForkAnswer = Summarize(s.sameAnswer), Summarize(s.crossAnswer)
	res.ResumeElsewhereFirstExec = Summarize(s.resume)
	res.CrossHostCaptureMiBP50 = median(s.capture)
	res.CrossHostDirtyMiBP50 = median(s.dirty)
	res.CrossHostDirectMiBP50 = median(s.direct)
	res.CrossHostPulledMiBP50 = median(s.pulled)
	res.CrossHostUploadedMiBP50, res.CrossHostFetchedMiBP50, res.CrossHostMovedMiBP50 = median(s.up), median(s.down), median(s.moved)
	if res.CrossHostDirtyMiBP50 > 0 {
		res.MovedPerDirty = round2(res.CrossHostMovedMiBP50 / res.CrossHostDirtyMiBP50)
	}
	if memoryMiB > 0 {
		res.MovedPerRAM = round2(res.CrossHostMovedMiBP50 / float64(memoryMiB))
	}
}

// lazyRounds measures, o.N times, a paused sandbox that dirtied
// o.LazyDirtyMiB resumed on host b (until its first exec), and how much
// of its memory image b had fetched by then. If b restored it without
// lazy paging it says so in res.LazyNote and measures nothing.
func (cr *clusterRun) lazyRounds(ctx context.Context, res *ClusterResult) error {
	b := cr.b
	res.LazyDirtyMiB = cr.o.LazyDirtyMiB
	var lazy []time.Duration
	var fetched, perMille []float64
	for i := range cr.o.N {
		cr.logf("lazy restore round %d/%d", i+1, cr.o.N)
		sb, err := cr.parentOn(ctx, cr.a, cr.o.LazyDirtyMiB)
		if err != nil {
			return fmt.Errorf("lazy restore: parent: %w", err)
		}
		if err := sb.Pause(ctx); err != nil {
			return fmt.Errorf("lazy restore: pause: %w", err)
		}
		t0 := time.Now()
		if err := sb.ResumeOn(ctx, pandastack.OnHost(b)); err != nil {
			return fmt.Errorf("lazy restore: resume on %s: %w", b, err)
		}
		if err := execTrue(ctx, sb); err != nil {
			return fmt.Errorf("lazy restore: resumed sandbox: %w", err)
		}
		d := time.Since(t0)
		if err := sb.Refresh(ctx); err != nil {
			return fmt.Errorf("lazy restore: %w", err)
		}
		sb.Kill(ctx)
		m := sb.Info.Memory
		if m == nil || m.Lazy == nil || m.Lazy.ImageMiB <= 0 {
			res.LazyNote = fmt.Sprintf("host %s restored the sandbox without lazy paging: run its agent with --lazy-restore (panda dev cluster --lazy-restore)", b)
			break
		}
		lazy = append(lazy, d)
		res.LazyImageMiB = m.Lazy.ImageMiB
		fetched = append(fetched, m.Lazy.FetchedMiB)
		perMille = append(perMille, 1000*m.Lazy.FetchedMiB/m.Lazy.ImageMiB)
	}
	if len(lazy) > 0 {
		d := Summarize(lazy)
		res.LazyResumeFirstExec = &d
		res.LazyFetchedMiBP50 = median(fetched)
		// Per mille first: median rounds to a tenth.
		res.LazyFetchedFractionP50 = median(perMille) / 1000
	}
	return nil
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return Percentile(s, 50)
}
