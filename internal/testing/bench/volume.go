package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// VolumeOptions configures VolumeBench.
type VolumeOptions struct {
	Template  string // "" lets the server choose
	MemoryMiB int    // 0 lets the server choose
	// FileMiB is the size of the file written and read sequentially
	// (default 256), Runs how many times each is measured (default 3).
	FileMiB int
	Runs    int
	// Files is how many small files the metadata test creates, stats and
	// removes (default 10,000).
	Files int
	// N is how many creates and forks are measured, with and without a
	// volume (default 10); ForkCount the children of the branch-mode fork
	// measured ForkRuns times (defaults 8 and 3).
	N         int
	ForkCount int
	ForkRuns  int
	// TTLSeconds bounds the life of every sandbox the benchmark creates
	// (default 900).
	TTLSeconds int
	Log        io.Writer
}

// VolumeResult is the output of `panda bench volume`. Each figure of a
// volume sits next to the same figure of the sandbox's own disk (or of a
// sandbox without a volume), measured in the same run: compare ratios.
type VolumeResult struct {
	APIURL    string `json:"api_url"`
	Template  string `json:"template"`
	MemoryMiB int    `json:"memory_mib"`
	FileMiB   int    `json:"file_mib"`
	Files     int    `json:"files"`
	// Sequential write (then fsync) and read (after dropping the guest's
	// page cache) of a FileMiB file, in the volume and on the root disk.
	VolumeWrite      Throughput `json:"volume_write"`
	RootfsWrite      Throughput `json:"rootfs_write"`
	WriteRatioP50    float64    `json:"write_ratio_p50"`
	VolumeRead       Throughput `json:"volume_read"`
	RootfsRead       Throughput `json:"rootfs_read"`
	ReadRatioP50     float64    `json:"read_ratio_p50"`
	VolumeMetaOpsSec float64    `json:"volume_meta_ops_s"`
	RootfsMetaOpsSec float64    `json:"rootfs_meta_ops_s"`
	MetaRatio        float64    `json:"meta_ratio"`
	// Create → first exec with one volume mounted and without; fork →
	// the child's first exec of a parent with a volume and without.
	CreateWithVolume Dist    `json:"create_with_volume"`
	CreatePlain      Dist    `json:"create_plain"`
	CreateRatioP50   float64 `json:"create_ratio_p50"`
	ForkWithVolume   Dist    `json:"fork_with_volume"`
	ForkPlain        Dist    `json:"fork_plain"`
	ForkRatioP50     float64 `json:"fork_ratio_p50"`
	// The fork call of ForkCount children with volume_mode branch and
	// with the default (share), of the same parent.
	ForkCount       int     `json:"fork_count"`
	ForkBranch      Dist    `json:"fork_branch"`
	ForkShare       Dist    `json:"fork_share"`
	BranchRatioP50  float64 `json:"branch_ratio_p50"`
	BranchFilesHeld int     `json:"branch_files"`
}

// throughputScript writes argv[2] MiB to argv[1] in 1 MiB writes, fsyncs,
// drops the guest's page cache, reads the file back and prints both times
// in seconds.
const throughputScript = `import os, sys, time
p, n = sys.argv[1], int(sys.argv[2])
buf = os.urandom(1 << 20)
t = time.monotonic()
fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
for _ in range(n):
    os.write(fd, buf)
os.fsync(fd)
os.close(fd)
w = time.monotonic() - t
os.sync()
with open('/proc/sys/vm/drop_caches', 'w') as f:
    f.write('3')
t = time.monotonic()
fd = os.open(p, os.O_RDONLY)
got = 0
while True:
    b = os.read(fd, 1 << 20)
    if not b:
        break
    got += len(b)
os.close(fd)
r = time.monotonic() - t
os.unlink(p)
assert got == n << 20, got
print(w, r)
`

// metaScript creates argv[2] small files in the new directory argv[1],
// stats each, removes each, and prints the time of all three in seconds.
const metaScript = `import os, sys, time
d, n = sys.argv[1], int(sys.argv[2])
os.mkdir(d)
t = time.monotonic()
for i in range(n):
    fd = os.open(f'{d}/f{i}', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b'x')
    os.close(fd)
for i in range(n):
    os.stat(f'{d}/f{i}')
for i in range(n):
    os.unlink(f'{d}/f{i}')
e = time.monotonic() - t
os.rmdir(d)
print(e)
`

// VolumeBench measures volumes through the Go SDK against the sandbox's
// own disk and against sandboxes without volumes. Every sandbox it creates
// carries the label panda_bench=<run id> and is killed before it returns;
// the volume it creates (bench-<run id>) and the branches its forks make
// are deleted, also when ctx is cancelled or a step fails.
func VolumeBench(ctx context.Context, c *pandastack.Client, o VolumeOptions) (res VolumeResult, err error) {
	logf := logTo(o.Log)
	if o.FileMiB == 0 {
		o.FileMiB = 256
	}
	if o.Runs == 0 {
		o.Runs = 3
	}
	if o.Files == 0 {
		o.Files = 10000
	}
	if o.N == 0 {
		o.N = 10
	}
	if o.ForkCount == 0 {
		o.ForkCount = 8
	}
	if o.ForkRuns == 0 {
		o.ForkRuns = 3
	}
	if o.TTLSeconds == 0 {
		o.TTLSeconds = 900
	}
	id := runID()
	res = VolumeResult{APIURL: c.APIURL(), Template: o.Template, MemoryMiB: o.MemoryMiB, FileMiB: o.FileMiB,
		Files: o.Files, ForkCount: o.ForkCount}
	label := map[string]string{"panda_bench": id}
	volName := "bench-" + id
	size := 2*o.FileMiB + 256
	if size < 1024 {
		size = 1024
	}
	logf("creating volume %s (%d MiB)", volName, size)
	if _, err := c.CreateVolume(ctx, volName, size); err != nil {
		return res, fmt.Errorf("create volume %s: %w", volName, err)
	}
	mounts := []pandastack.VolumeMount{{Name: volName, Path: "/mnt/vol"}}
	withVol := &apiRun{c: c, label: label, ids: map[string]bool{},
		opts: APIOptions{Template: o.Template, MemoryMiB: o.MemoryMiB, TTLSeconds: o.TTLSeconds, Volumes: mounts}}
	plain := &apiRun{c: c, label: label, ids: map[string]bool{},
		opts: APIOptions{Template: o.Template, MemoryMiB: o.MemoryMiB, TTLSeconds: o.TTLSeconds}}
	branches := map[string]bool{}
	defer func() {
		for _, r := range []*apiRun{withVol, plain} {
			if cerr := r.cleanup(); cerr != nil && err == nil {
				err = cerr
			}
		}
		if cerr := deleteVolumes(c, volName, branches); cerr != nil && err == nil {
			err = cerr
		}
	}()

	for _, r := range []*apiRun{withVol, plain} {
		logf("warming up (the first create bakes the template if needed)")
		sb, _, err := r.create(ctx)
		if err != nil {
			return res, fmt.Errorf("warm-up create: %w", err)
		}
		if err := r.firstExec(ctx, sb); err != nil {
			return res, fmt.Errorf("warm-up exec in %s: %w", sb.ID, err)
		}
		if err := r.kill(ctx, sb); err != nil {
			return res, err
		}
	}

	sb, _, err := withVol.create(ctx)
	if err != nil {
		return res, fmt.Errorf("create: %w", err)
	}
	if err := withVol.firstExec(ctx, sb); err != nil {
		return res, fmt.Errorf("first exec in %s: %w", sb.ID, err)
	}
	res.Template, res.MemoryMiB = sb.Info.Template, sb.Info.MemoryMiB

	logf("sequential write and read of %d MiB, %d times, in the volume and on the root disk", o.FileMiB, o.Runs)
	var vw, vr, rw, rr []float64
	for range o.Runs {
		for _, dir := range []string{"/mnt/vol", "/var/tmp"} {
			out, err := guestPython(ctx, sb, throughputScript, dir+"/bench.bin", strconv.Itoa(o.FileMiB))
			if err != nil {
				return res, fmt.Errorf("throughput in %s: %w", dir, err)
			}
			f := strings.Fields(out)
			if len(f) != 2 {
				return res, fmt.Errorf("throughput in %s: unexpected output %q", dir, out)
			}
			w, werr := strconv.ParseFloat(f[0], 64)
			r, rerr := strconv.ParseFloat(f[1], 64)
			if werr != nil || rerr != nil || w <= 0 || r <= 0 {
				return res, fmt.Errorf("throughput in %s: unexpected output %q", dir, out)
			}
			mb := float64(o.FileMiB<<20) / 1e6
			if dir == "/mnt/vol" {
				vw, vr = append(vw, mb/w), append(vr, mb/r)
			} else {
				rw, rr = append(rw, mb/w), append(rr, mb/r)
			}
		}
	}
	res.VolumeWrite, res.RootfsWrite = summarizeRates(vw), summarizeRates(rw)
	res.VolumeRead, res.RootfsRead = summarizeRates(vr), summarizeRates(rr)
	res.WriteRatioP50 = ratio(res.VolumeWrite.P50, res.RootfsWrite.P50)
	res.ReadRatioP50 = ratio(res.VolumeRead.P50, res.RootfsRead.P50)

	logf("create, stat and remove of %d small files, in the volume and on the root disk", o.Files)
	for _, dir := range []string{"/mnt/vol", "/var/tmp"} {
		out, err := guestPython(ctx, sb, metaScript, dir+"/bench-meta", strconv.Itoa(o.Files))
		if err != nil {
			return res, fmt.Errorf("metadata in %s: %w", dir, err)
		}
		secs, perr := strconv.ParseFloat(strings.TrimSpace(out), 64)
		if perr != nil || secs <= 0 {
			return res, fmt.Errorf("metadata in %s: unexpected output %q", dir, out)
		}
		ops := float64(3*o.Files) / secs
		if dir == "/mnt/vol" {
			res.VolumeMetaOpsSec = round(ops)
		} else {
			res.RootfsMetaOpsSec = round(ops)
		}
	}
	res.MetaRatio = ratio(res.VolumeMetaOpsSec, res.RootfsMetaOpsSec)

	logf("%d creates → first exec, with a volume and without (interleaved)", o.N)
	var cv, cp []time.Duration
	for i := range o.N {
		for _, r := range []*apiRun{withVol, plain} {
			t0 := time.Now()
			s, _, err := r.create(ctx)
			if err != nil {
				return res, fmt.Errorf("create %d: %w", i, err)
			}
			if err := r.firstExec(ctx, s); err != nil {
				return res, fmt.Errorf("first exec in %s: %w", s.ID, err)
			}
			d := time.Since(t0)
			if r == withVol {
				cv = append(cv, d)
			} else {
				cp = append(cp, d)
			}
			if err := r.kill(ctx, s); err != nil {
				return res, err
			}
		}
	}
	res.CreateWithVolume, res.CreatePlain = Summarize(cv), Summarize(cp)
	res.CreateRatioP50 = ratioP50(res.CreateWithVolume, res.CreatePlain)

	logf("%d forks → child's first exec, of a parent with a volume and without", o.N)
	parentPlain, _, err := plain.create(ctx)
	if err != nil {
		return res, fmt.Errorf("create: %w", err)
	}
	if err := plain.firstExec(ctx, parentPlain); err != nil {
		return res, fmt.Errorf("first exec in %s: %w", parentPlain.ID, err)
	}
	var fv, fp []time.Duration
	for i := range o.N {
		for _, p := range []struct {
			r  *apiRun
			sb *pandastack.Sandbox
		}{{withVol, sb}, {plain, parentPlain}} {
			t0 := time.Now()
			kids, err := p.sb.Fork(ctx, 1)
			if err != nil {
				return res, fmt.Errorf("fork %d of %s: %w", i, p.sb.ID, err)
			}
			p.r.track(kids[0].ID)
			if err := p.r.firstExec(ctx, kids[0]); err != nil {
				return res, fmt.Errorf("first exec in child %s: %w", kids[0].ID, err)
			}
			d := time.Since(t0)
			if p.r == withVol {
				fv = append(fv, d)
			} else {
				fp = append(fp, d)
			}
			if err := p.r.kill(ctx, kids[0]); err != nil {
				return res, err
			}
		}
	}
	res.ForkWithVolume, res.ForkPlain = Summarize(fv), Summarize(fp)
	res.ForkRatioP50 = ratioP50(res.ForkWithVolume, res.ForkPlain)

	// The branch fork clones every file of the volume: give it some.
	const held = 200
	logf("fork of %d children with volume_mode branch and share, %d times each (the volume holds %d files)", o.ForkCount, o.ForkRuns, held)
	if out, err := guestPython(ctx, sb, `import os, sys
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
for i in range(int(sys.argv[2])):
    with open(f'{d}/f{i}', 'wb') as f:
        f.write(os.urandom(16384))
print('ok')
`, "/mnt/vol/held", strconv.Itoa(held)); err != nil || strings.TrimSpace(out) != "ok" {
		return res, fmt.Errorf("fill the volume: %v (%q)", err, out)
	}
	res.BranchFilesHeld = held
	var fb, fs []time.Duration
	for i := range o.ForkRuns {
		for _, mode := range []string{pandastack.VolumeBranch, pandastack.VolumeShare} {
			t0 := time.Now()
			fr, err := sb.ForkWithOptions(ctx, pandastack.ForkOptions{Count: o.ForkCount, VolumeMode: mode})
			d := time.Since(t0)
			for _, k := range fr.Children {
				withVol.track(k.ID)
				for _, m := range k.Info.Volumes {
					if m.Name != volName {
						branches[m.Name] = true
					}
				}
			}
			if err != nil {
				return res, fmt.Errorf("fork %d (%s) of %s: %w", i, mode, sb.ID, err)
			}
			if mode == pandastack.VolumeBranch {
				fb = append(fb, d)
			} else {
				fs = append(fs, d)
			}
			for _, k := range fr.Children {
				if err := withVol.kill(ctx, k); err != nil {
					return res, err
				}
			}
			if err := deleteVolumes(c, "", branches); err != nil {
				return res, err
			}
		}
	}
	res.ForkBranch, res.ForkShare = Summarize(fb), Summarize(fs)
	res.BranchRatioP50 = ratioP50(res.ForkBranch, res.ForkShare)
	return res, nil
}

// guestPython runs script with python3 as root in sb and returns its
// standard output; a non-zero exit is an error carrying its stderr.
func guestPython(ctx context.Context, sb *pandastack.Sandbox, script string, args ...string) (string, error) {
	argv := append([]string{"python3", "-c", script}, args...)
	r, err := sb.Exec(ctx, pandastack.Command{Argv: argv, User: "root", Timeout: 10 * time.Minute})
	if err != nil {
		return "", err
	}
	if r.ExitCode != 0 {
		return "", fmt.Errorf("exit %d: %s", r.ExitCode, strings.TrimSpace(r.Stderr))
	}
	return r.Stdout, nil
}

// deleteVolumes deletes the volumes in names (and forgets them) and then
// vol unless it is "", with its own context: it must work after the
// run's was cancelled.
func deleteVolumes(c *pandastack.Client, vol string, names map[string]bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs error
	del := func(n string) {
		if err := c.DeleteVolume(ctx, n, true); err != nil && !errors.Is(err, pandastack.ErrNotFound) {
			errs = errors.Join(errs, fmt.Errorf("delete volume %s: %w", n, err))
		}
	}
	for n := range names {
		del(n)
		delete(names, n)
	}
	if vol != "" {
		del(vol)
	}
	return errs
}
