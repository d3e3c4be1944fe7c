package chaos

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"time"

	pandastack "github.com/pandastack/pandastack/sdk/go"
)

// Volumes in the suite: each key has one volume, which every sandbox it
// creates mounts at volPath (forks share it). opVolWrite writes a new file
// there from inside a sandbox; a write whose exec returned (the file was
// closed, which the host made durable before answering) is acknowledged,
// and every check after it — after every fault, kill -9 of the server,
// the agent or a QEMU included — reads it back through the volume files
// API, with no sandbox involved.
const (
	opVolWrite = "volume_write"
	volPath    = "/mnt/vol"
	volSizeMiB = 64
)

// volState is what the suite knows of one key's volume.
type volState struct {
	name string
	// acked are the files whose write was acknowledged, by path in the
	// volume, with their SHA-256; unchecked those not read back yet.
	acked     map[string]string
	unchecked map[string]bool
}

// createVolumes makes each key's volume.
func (r *runner) createVolumes(ctx context.Context) error {
	for i, c := range r.clients {
		name := fmt.Sprintf("chaos-%s-%d", r.runID, i)
		if _, err := c.CreateVolume(ctx, name, volSizeMiB); err != nil {
			return fmt.Errorf("create volume %s: %w", name, err)
		}
		r.vols = append(r.vols, &volState{name: name, acked: map[string]string{}, unchecked: map[string]bool{}})
	}
	return nil
}

// volMounts are the volume mounts of a sandbox key creates.
func (r *runner) volMounts(key int) []pandastack.VolumeMount {
	if key >= len(r.vols) {
		return nil
	}
	return []pandastack.VolumeMount{{Name: r.vols[key].name, Path: volPath}}
}

// planVolWrite fills in o (a volume write): a new file of printable data.
func (r *runner) planVolWrite(o *op) {
	o.path = "/w" + strconv.Itoa(o.n)
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	o.data = make([]byte, 16+r.rng.IntN(2048))
	for i := range o.data {
		o.data[i] = alphabet[r.rng.IntN(len(alphabet))]
	}
	h := sha256.Sum256(o.data)
	o.sum = hex.EncodeToString(h[:])
}

// doVolWrite writes o's file into the volume from inside o's sandbox.
func doVolWrite(ctx context.Context, h *pandastack.Sandbox, o *op) error {
	cmd := "printf %s '" + string(o.data) + "' > " + volPath + o.path
	res, err := h.Exec(ctx, pandastack.Command{Cmd: cmd})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("%s: exit %d, stderr %q", cmd[:40]+"...", res.ExitCode, res.Stderr)
	}
	return err
}

// applyVolWrite records an acknowledged volume write.
func (r *runner) applyVolWrite(o *op) {
	if o.err != nil {
		return // maybe written, maybe not: nothing to hold it to
	}
	v := r.vols[o.sb.key]
	v.acked[o.path] = o.sum
	v.unchecked[o.path] = true
}

// checkVolumes holds each volume to its acknowledged writes, through the
// volume files API: every one is listed, each new one (and two older ones)
// read back whole. A server or agent just restarted may answer with
// errors for a while; a file missing or different is a violation at once.
func (r *runner) checkVolumes(ctx context.Context) error {
	var vs []string
	for key, v := range r.vols {
		if len(v.acked) == 0 {
			continue
		}
		c := r.clients[key]
		files := c.VolumeFiles(v.name)
		var listed []pandastack.FileInfo
		err := retryAPI(ctx, func(ctx context.Context) error {
			var err error
			listed, err = files.ListFiles(ctx, "/")
			return err
		})
		if err != nil {
			vs = append(vs, fmt.Sprintf("volume %s: cannot list it: %v", v.name, err))
			continue
		}
		have := map[string]bool{}
		for _, f := range listed {
			have["/"+f.Name] = true
		}
		paths := slices.Sorted(maps.Keys(v.acked))
		for _, p := range paths {
			if !have[p] {
				vs = append(vs, fmt.Sprintf("volume %s: acknowledged file %s is missing", v.name, p))
			}
		}
		read := slices.Sorted(maps.Keys(v.unchecked))
		for range 2 {
			read = append(read, paths[r.rng.IntN(len(paths))])
		}
		for _, p := range read {
			if !have[p] {
				continue
			}
			var got string
			err := retryAPI(ctx, func(ctx context.Context) error {
				rc, err := files.ReadFile(ctx, p)
				if err != nil {
					return err
				}
				defer rc.Close()
				h := sha256.New()
				if _, err := io.Copy(h, rc); err != nil {
					return err
				}
				got = hex.EncodeToString(h.Sum(nil))
				return nil
			})
			switch {
			case err != nil:
				vs = append(vs, fmt.Sprintf("volume %s: cannot read %s: %v", v.name, p, err))
			case got != v.acked[p]:
				vs = append(vs, fmt.Sprintf("volume %s: %s holds SHA-256 %s, want %s (acknowledged)", v.name, p, got, v.acked[p]))
			default:
				delete(v.unchecked, p)
			}
		}
		r.rep.VolumeChecks++
	}
	return r.fail(vs)
}

// retryAPI runs f until it succeeds, for up to contentTimeout while the
// API answers that it cannot serve yet (unavailable, or a conflict while
// the volume's host comes back).
func retryAPI(ctx context.Context, f func(context.Context) error) error {
	deadline := time.Now().Add(contentTimeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, contentTimeout)
		err := f(cctx)
		cancel()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) ||
			!(errors.Is(err, pandastack.ErrUnavailable) || errors.Is(err, pandastack.ErrConflict)) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}
