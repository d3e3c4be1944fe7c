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
	a, b := res.Hosts[0], res.Hosts[1]
	run := fmt.Sprintf("cluster-%d", time.Now().UnixNano())
	var made []*pandastack.Sandbox
	defer func() {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		for _, sb := range made {
			sb.Kill(kctx)
		}
	}()
	logf := func(format string, args ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", args...)
		}
	}
	firstExec := func(sb *pandastack.Sandbox) error {
		r, err := sb.Exec(ctx, pandastack.Command{Argv: []string{"true"}})
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", r.ExitCode)
		}
		return err
	}
	sh := func(sb *pandastack.Sandbox, what, cmd string) error {
		r, err := sb.Exec(ctx, pandastack.Command{Argv: []string{"/bin/sh", "-c", cmd}})
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("exit %d: %s", r.ExitCode, r.Stderr)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
	fromSnapshot := ""
	parentOn := func(hostID string, dirtyMiB int) (*pandastack.Sandbox, error) {
		co := pandastack.CreateOptions{Template: o.Template, MemoryMiB: o.MemoryMiB, Metadata: map[string]string{"panda_bench": run}, Placement: pandastack.OnHost(hostID)}
		if fromSnapshot != "" {
			co.Template, co.MemoryMiB, co.SnapshotID = "", 0, fromSnapshot
		}
		sb, err := c.Create(ctx, co)
		if err != nil {
			return nil, err
		}
		made = append(made, sb)
		if dirtyMiB > 0 {
			if err := sh(sb, "dirtying memory", fmt.Sprintf("dd if=/dev/urandom of=/dev/shm/dirty bs=1048576 count=%d 2>/dev/null", dirtyMiB)); err != nil {
				return nil, err
			}
		}
		return sb, nil
	}
	if o.EnvMiB > 0 {
		// The environment: a snapshot both hosts hold (b once it made a
		// sandbox from it).
		logf("environment snapshot of %d MiB", o.EnvMiB)
		env, err := parentOn(a, 0)
		if err != nil {
			return res, fmt.Errorf("environment: %w", err)
		}
		half := o.EnvMiB / 2
		if err := sh(env, "environment", fmt.Sprintf("dd if=/dev/urandom of=/root/env.bin bs=1048576 count=%d 2>/dev/null && dd if=/dev/urandom of=/dev/shm/env bs=1048576 count=%d 2>/dev/null && sync", half, o.EnvMiB-half)); err != nil {
			return res, err
		}
		snap, err := env.Snapshot(ctx, run+"-env")
		if err != nil {
			return res, fmt.Errorf("environment: snapshot: %w", err)
		}
		defer c.DeleteSnapshot(context.WithoutCancel(ctx), snap.ID)
		env.Kill(ctx)
		fromSnapshot = snap.ID
		onB, err := parentOn(b, 0)
		if err != nil {
			return res, fmt.Errorf("environment on %s: %w", b, err)
		}
		onB.Kill(ctx)
		res.EnvMiB, res.EnvSnapshot = o.EnvMiB, snap.ID
	}
	var same, cross, resume, sameAnswer, crossAnswer []time.Duration
	var capture, dirty, direct, pulled, up, down, moved []float64
	for i := range o.N {
		logf("round %d/%d", i+1, o.N)
		parent, err := parentOn(a, o.DirtyMiB)
		if err != nil {
			return res, fmt.Errorf("parent: %w", err)
		}
		for _, tc := range []struct {
			to          string
			out, answer *[]time.Duration
		}{{a, &same, &sameAnswer}, {b, &cross, &crossAnswer}} {
			t0 := time.Now()
			fr, err := parent.ForkWithOptions(ctx, pandastack.ForkOptions{Count: 1, Placement: pandastack.OnHost(tc.to)})
			made = append(made, fr.Children...)
			if err != nil {
				return res, fmt.Errorf("fork to %s: %w", tc.to, err)
			}
			*tc.answer = append(*tc.answer, time.Since(t0))
			if err := firstExec(fr.Children[0]); err != nil {
				return res, fmt.Errorf("child on %s: %w", tc.to, err)
			}
			*tc.out = append(*tc.out, time.Since(t0))
			if tc.to == b {
				capture = append(capture, float64(fr.CrossHostCaptureBytes)/(1<<20))
				direct = append(direct, float64(fr.CrossHostDirectBytes)/(1<<20))
				pulled = append(pulled, float64(fr.CrossHostPulledBytes)/(1<<20))
				up = append(up, float64(fr.CrossHostUploadedBytes)/(1<<20))
				down = append(down, float64(fr.CrossHostFetchedBytes)/(1<<20))
				moved = append(moved, float64(fr.CrossHostDirectBytes+fr.CrossHostUploadedBytes+fr.CrossHostFetchedBytes)/(1<<20))
				dirty = append(dirty, float64(fr.DirtyBytes)/(1<<20))
			}
			fr.Children[0].Kill(ctx)
		}
		// Pause on a, resume on b (which never saw it).
		if err := parent.Pause(ctx); err != nil {
			return res, fmt.Errorf("pause: %w", err)
		}
		t0 := time.Now()
		if err := parent.ResumeOn(ctx, pandastack.OnHost(b)); err != nil {
			return res, fmt.Errorf("resume on %s: %w", b, err)
		}
		if parent.Info.HostID != b {
			return res, fmt.Errorf("resumed on %s, asked for %s", parent.Info.HostID, b)
		}
		if err := firstExec(parent); err != nil {
			return res, fmt.Errorf("resumed sandbox: %w", err)
		}
		resume = append(resume, time.Since(t0))
		parent.Kill(ctx)
	}
	res.SameHostForkFirstExec = Summarize(same)
	res.CrossHostForkFirstExec = Summarize(cross)
	res.SameHostForkAnswer, res.CrossHostForkAnswer = Summarize(sameAnswer), Summarize(crossAnswer)
	res.ResumeElsewhereFirstExec = Summarize(resume)
	res.CrossHostCaptureMiBP50 = median(capture)
	res.CrossHostDirtyMiBP50 = median(dirty)
	res.CrossHostDirectMiBP50 = median(direct)
	res.CrossHostPulledMiBP50 = median(pulled)
	res.CrossHostUploadedMiBP50, res.CrossHostFetchedMiBP50, res.CrossHostMovedMiBP50 = median(up), median(down), median(moved)
	if res.CrossHostDirtyMiBP50 > 0 {
		res.MovedPerDirty = round2(res.CrossHostMovedMiBP50 / res.CrossHostDirtyMiBP50)
	}
	if o.MemoryMiB > 0 {
		res.MovedPerRAM = round2(res.CrossHostMovedMiBP50 / float64(o.MemoryMiB))
	}
	if len(same) == 0 {
		return res, errors.New("nothing measured")
	}
	if o.LazyDirtyMiB > 0 {
		res.LazyDirtyMiB = o.LazyDirtyMiB
		var lazy []time.Duration
		var fetched, perMille []float64
		for i := range o.N {
			logf("lazy restore round %d/%d", i+1, o.N)
			sb, err := parentOn(a, o.LazyDirtyMiB)
			if err != nil {
				return res, fmt.Errorf("lazy restore: parent: %w", err)
			}
			if err := sb.Pause(ctx); err != nil {
				return res, fmt.Errorf("lazy restore: pause: %w", err)
			}
			t0 := time.Now()
			if err := sb.ResumeOn(ctx, pandastack.OnHost(b)); err != nil {
				return res, fmt.Errorf("lazy restore: resume on %s: %w", b, err)
			}
			if err := firstExec(sb); err != nil {
				return res, fmt.Errorf("lazy restore: resumed sandbox: %w", err)
			}
			d := time.Since(t0)
			if err := sb.Refresh(ctx); err != nil {
				return res, fmt.Errorf("lazy restore: %w", err)
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
	}
	return res, nil
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return Percentile(s, 50)
}
