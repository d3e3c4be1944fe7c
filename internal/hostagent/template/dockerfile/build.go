package dockerfile

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/hostagent/template"
)

// DefaultCacheMaxBytes is the default of Config.CacheMaxBytes.
const DefaultCacheMaxBytes = 50 << 30

// Config configures a Builder.
type Config struct {
	// Boot boots build VMs. Required.
	Boot Boot
	// Restore restores build VMs from the snapshots cached with layers;
	// nil: always boot.
	Restore Restore
	// FromImage converts FROM images. Required.
	FromImage FromImage
	// CacheDir holds the layer cache; best on a file system with reflinks
	// (XFS, btrfs), where layers share their blocks. Required.
	CacheDir string
	// CacheMaxBytes bounds the cache's allocated size (default 50 GiB);
	// it is enforced after each build, so a build may pass it while it
	// runs.
	CacheMaxBytes int64
	// MaxContextBytes bounds a build context's unpacked file contents
	// (default DefaultMaxContextBytes).
	MaxContextBytes int64
	// TempDir is where build contexts are unpacked (default os.TempDir()).
	TempDir string
	// Clone copies a disk image file (default CloneFile).
	Clone func(src, dst string) error
	// RunNote, if set, is said once per build before the first RUN step
	// that runs, and after the output of a RUN step that fails: what the
	// user should know about RUN steps here (that they have no network).
	RunNote string
	Logger  *slog.Logger
}

// Validate checks c and fills in defaults.
func (c *Config) Validate() error {
	if c.Boot == nil || c.FromImage == nil || c.CacheDir == "" {
		return errors.New("dockerfile builder: Boot, FromImage and CacheDir are required")
	}
	if c.CacheMaxBytes < 0 || c.MaxContextBytes < 0 {
		return errors.New("dockerfile builder: limits must not be negative")
	}
	if c.CacheMaxBytes == 0 {
		c.CacheMaxBytes = DefaultCacheMaxBytes
	}
	if c.MaxContextBytes == 0 {
		c.MaxContextBytes = DefaultMaxContextBytes
	}
	if c.TempDir == "" {
		c.TempDir = os.TempDir()
	}
	if c.Clone == nil {
		c.Clone = CloneFile
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Builder runs Dockerfile builds. Its methods are safe for concurrent use;
// builds running at once share the cache directory, each using only the
// entries of its own scope (Request.Scope).
type Builder struct {
	cfg   Config
	cache *layerCache
}

// New returns a Builder. It starts nothing.
func New(cfg Config) (*Builder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Builder{
		cfg:   cfg,
		cache: &layerCache{dir: cfg.CacheDir, log: cfg.Logger, pins: map[string]int{}},
	}, nil
}

// Check parses dockerfile and checks it and buildArgs as Build would
// before running anything (not the build context). Errors wrap ErrInvalid.
func Check(dockerfile []byte, buildArgs map[string]string) error {
	f, err := parse(dockerfile)
	if err != nil {
		return err
	}
	if err := declaredArgs(f, buildArgs); err != nil {
		return err
	}
	_, _, err = fromRef(f, buildArgs)
	return err
}

// ClearCache removes every cache entry no running build uses.
func (b *Builder) ClearCache() error { return b.cache.evict(-1) }

// Request is what one build builds, and for whom.
type Request struct {
	Dockerfile []byte
	// ContextTar is the build context, a tar file (plain or gzip); ""
	// for none.
	ContextTar string
	BuildArgs  map[string]string
	// Scope is whose cache entries the build may use: the id of the API
	// key running it. Every layer key includes it, so a build never
	// reuses (nor reports as cached) a layer, nor restores the build VM
	// snapshot of a layer, that a build of another scope made: a layer
	// holds what its tenant's steps wrote and its build VM's memory, and
	// one made by another tenant may hold anything. "" is a scope like
	// any other.
	Scope string
}

// Build builds req.Dockerfile with its build context and build args,
// writing the final root filesystem to the ext4 image out (created). It
// reports progress lines (see docs/dockerfile.md for their form). Errors
// the user can fix wrap ErrInvalid or ErrRunFailed; FromImage's errors
// are returned wrapped. It returns soon after ctx ends.
func (b *Builder) Build(ctx context.Context, req Request, out string, progress func(string)) (Result, error) {
	if progress == nil {
		progress = func(string) {}
	}
	dockerfile, contextTar, buildArgs := req.Dockerfile, req.ContextTar, req.BuildArgs
	start := time.Now()
	f, err := parse(dockerfile)
	if err != nil {
		return Result{}, err
	}
	if err := declaredArgs(f, buildArgs); err != nil {
		return Result{}, err
	}
	ref, globals, err := fromRef(f, buildArgs)
	if err != nil {
		return Result{}, err
	}
	var bctx *buildContext
	if contextTar != "" && slices.ContainsFunc(f.steps, func(in instr) bool { return in.cmd == "COPY" || in.cmd == "ADD" }) {
		dir, err := os.MkdirTemp(b.cfg.TempDir, "panda-context-")
		if err != nil {
			return Result{}, fmt.Errorf("unpack build context: %w", err)
		}
		defer os.RemoveAll(dir)
		if bctx, err = openContext(ctx, contextTar, dir, b.cfg.MaxContextBytes); err != nil {
			return Result{}, err
		}
	}

	r := &run{b: b, scope: req.Scope, progress: progress, total: len(f.steps) + 1}
	defer r.release()
	baseKey, base, err := r.base(ctx, f.from, ref)
	if err != nil {
		return Result{}, err
	}
	p, err := makePlan(ctx, f, base.Image, baseKey, buildArgs, globals, bctx)
	if err != nil {
		return Result{}, err
	}
	final, err := r.steps(ctx, p, baseKey)
	if err != nil {
		return Result{}, err
	}
	if err := b.cfg.Clone(b.cache.path(final), out); err != nil {
		return Result{}, fmt.Errorf("write the built root filesystem: %w", err)
	}
	b.cfg.Logger.Info("dockerfile build done", "from", ref, "layer", final, "dur_ms", time.Since(start).Milliseconds())
	return Result{Image: p.image, Digest: "sha256:" + final}, nil
}

// run is one build's state.
type run struct {
	b *Builder
	// scope is Request.Scope, part of the base layer's key and so of
	// every key after it.
	scope    string
	progress func(string)
	total    int
	pinned   []string
	// noted: Config.RunNote was said.
	noted bool

	vm VM
	// work is the directory of the VM's disk.
	work string
	// dirs are the directories known to exist in the VM.
	dirs map[string]bool
}

func (r *run) pin(key string) bool {
	r.pinned = append(r.pinned, key)
	return r.b.cache.pin(key)
}

// release stops the VM, unpins the build's entries and trims the cache.
func (r *run) release() {
	if r.vm != nil {
		if err := r.vm.Close(); err != nil {
			r.b.cfg.Logger.Warn("dockerfile build: close VM", "err", err)
		}
	}
	if r.work != "" {
		os.RemoveAll(r.work)
	}
	for _, k := range r.pinned {
		r.b.cache.unpin(k)
	}
	if err := r.b.cache.evict(r.b.cfg.CacheMaxBytes); err != nil {
		r.b.cfg.Logger.Warn("dockerfile build: trim cache", "err", err)
	}
}

func (r *run) stepLine(n int, in instr) {
	text := strings.Join(strings.Fields(in.text), " ")
	r.progress(fmt.Sprintf("step %d/%d: %s", n, r.total, cut(text, 200)))
}

func (r *run) doneLine(n int, since time.Time) {
	r.progress(fmt.Sprintf("step %d/%d done in %.1fs", n, r.total, time.Since(since).Seconds()))
}

func hashKey(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// base makes sure the FROM image's layer is cached and returns its key and
// the image's config. A digest-pinned reference (name@sha256:...) is keyed
// by the reference and converted only once; any other is converted on
// every build (its tag may have moved) and keyed by the digest the
// conversion reports, so an unchanged image still reuses every cached
// step after it. Both keys are the build's scope's: not even the base
// layer is shared between scopes (one scope learning, from a "cached"
// line, that another pulled an image would be a leak of its own).
func (r *run) base(ctx context.Context, from instr, ref string) (string, Result, error) {
	start := time.Now()
	r.stepLine(1, from)
	var key string
	if strings.Contains(ref, "@sha256:") {
		key = hashKey("scope", r.scope, "image-ref", ref)
		if r.pin(key) {
			res, err := r.b.cache.config(key)
			if err == nil {
				r.progress("  cached")
				return key, res, nil
			}
		}
	}
	tmp, err := r.b.cache.tempDir()
	if err != nil {
		return "", Result{}, err
	}
	res, err := r.b.cfg.FromImage(ctx, ref, filepath.Join(tmp, layerFile), r.progress)
	if err != nil {
		os.RemoveAll(tmp)
		return "", Result{}, fmt.Errorf("Dockerfile line %d: FROM %s: %w", from.line, ref, err)
	}
	if key == "" {
		if res.Digest != "" {
			key = hashKey("scope", r.scope, "image", res.Digest)
		} else {
			// Nothing identifies the image: its layers are not reused.
			key = hashKey("scope", r.scope, "image-once", ref, rand.Text())
		}
		r.pin(key)
	}
	if err := r.b.cache.commit(tmp, key, r.scope, res); err != nil {
		return "", Result{}, err
	}
	r.doneLine(1, start)
	return key, res, nil
}

// steps runs p's steps from the last cached layer on and returns the
// final layer's key.
func (r *run) steps(ctx context.Context, p *plan, baseKey string) (string, error) {
	from, last := baseKey, -1
	for i := len(p.steps) - 1; i >= 0; i-- {
		s := p.steps[i]
		if s.kind != metaStep && r.pin(s.key) {
			from, last = s.key, i
			break
		}
	}
	cur := from
	for i, s := range p.steps {
		r.stepLine(s.n, s.in)
		if s.note != "" {
			r.progress(s.note)
		}
		if s.kind == metaStep {
			continue
		}
		if i <= last {
			r.progress("  cached")
			continue
		}
		start := time.Now()
		if err := r.boot(ctx, cur); err != nil {
			return "", err
		}
		if err := r.exec(ctx, s); err != nil {
			return "", err
		}
		tmp, err := r.b.cache.tempDir()
		if err != nil {
			return "", err
		}
		if err := r.vm.Commit(ctx, filepath.Join(tmp, layerFile)); err != nil {
			os.RemoveAll(tmp)
			return "", fmt.Errorf("Dockerfile line %d: save the layer of %s: %w", s.in.line, s.in.cmd, err)
		}
		r.pin(s.key)
		if err := r.b.cache.commit(tmp, s.key, r.scope, Result{Image: s.image}); err != nil {
			return "", err
		}
		cur = s.key
		r.doneLine(s.n, start)
	}
	return cur, nil
}

// boot starts the build's VM, once, from layer key: restored from the
// layer's snapshot if it has one, else (or if that fails) booted from a
// clone of the layer.
func (r *run) boot(ctx context.Context, key string) error {
	if r.vm != nil {
		return nil
	}
	work, err := r.b.cache.tempDir()
	if err != nil {
		return err
	}
	r.work = work
	disk := filepath.Join(work, layerFile)
	if vm, err := r.restore(ctx, key, disk); err != nil {
		return err
	} else if vm != nil {
		r.vm, r.dirs = vm, map[string]bool{"/": true}
		return nil
	}
	if err := r.b.cfg.Clone(r.b.cache.path(key), disk); err != nil {
		return fmt.Errorf("clone layer for the build VM: %w", err)
	}
	vm, err := r.b.cfg.Boot(ctx, disk, r.progress)
	if err != nil {
		return fmt.Errorf("boot the build VM: %w", err)
	}
	r.vm, r.dirs = vm, map[string]bool{"/": true}
	return nil
}

// restore restores the build's VM from layer key's snapshot, its disk
// cloned to disk. It returns no VM (and no error) when there is no
// snapshot or the restore failed: the caller boots instead. err is only
// for ctx's end.
func (r *run) restore(ctx context.Context, key, disk string) (VM, error) {
	snap, ok := r.b.cache.snapshot(key)
	if r.b.cfg.Restore == nil || !ok {
		return nil, nil
	}
	mem := filepath.Join(filepath.Dir(disk), template.SnapshotMem)
	err := r.b.cfg.Clone(snap.disk, disk)
	if err == nil {
		err = r.b.cfg.Clone(snap.mem, mem)
	}
	var vm VM
	if err == nil {
		vm, err = r.b.cfg.Restore(ctx, disk, mem, snap.state, r.progress)
	}
	if err == nil {
		return vm, nil
	}
	os.Remove(disk)
	os.Remove(mem)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	r.b.cfg.Logger.Warn("dockerfile build: restore the build VM failed, booting it", "layer", key, "err", err)
	r.progress("  could not restore the build VM from the layer's snapshot; booting it")
	return nil, nil
}

// exec runs one disk step in the VM.
func (r *run) exec(ctx context.Context, s step) error {
	switch s.kind {
	case runStep:
		return r.runCmd(ctx, s)
	case workdirStep:
		return r.mkdir(ctx, s)
	case copyStep:
		return r.copy(ctx, s)
	}
	return nil
}

func (r *run) runCmd(ctx context.Context, s step) error {
	if cwd := s.exec.Cwd; !r.dirs[cwd] {
		// Docker runs a RUN in its working directory even when nothing
		// created it (an image's WORKDIR that does not exist).
		r.vm.Run(ctx, guestproto.ExecRequest{Argv: []string{"mkdir", "-p", cwd}}, io.Discard)
		r.dirs[cwd] = true
	}
	if note := r.b.cfg.RunNote; note != "" && !r.noted {
		r.progress("  " + note)
		r.noted = true
	}
	lw := newLineWriter(r.progress, 20)
	code, err := r.vm.Run(ctx, s.exec, lw)
	lw.Flush()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("Dockerfile line %d: RUN: %w", s.in.line, err)
	}
	if code != 0 {
		msg := fmt.Sprintf("Dockerfile line %d: %s: exit code %d", s.in.line, cut(strings.Join(strings.Fields(s.in.text), " "), 200), code)
		if tail := lw.Tail(); len(tail) > 0 {
			msg += "; its last output lines:\n" + strings.Join(tail, "\n")
		}
		if note := r.b.cfg.RunNote; note != "" {
			msg += "\n(" + note + ")"
		}
		return &userError{msg: msg, class: ErrRunFailed}
	}
	return nil
}

// mkdirScript creates the directory $1 and its missing parents, giving
// those it created to the user $2 (as BuildKit's WORKDIR does).
const mkdirScript = `set -e; d=$1; set --; p=$d
while [ ! -e "$p" ]; do set -- "$p" "$@"; p=${p%/*}; [ -n "$p" ] || p=/; done
mkdir -p "$d"; [ $# -eq 0 ] || chown "$USERSPEC" "$@"`

func (r *run) mkdir(ctx context.Context, s step) error {
	req := guestproto.ExecRequest{Argv: []string{"mkdir", "-p", s.dir}}
	if s.user != "" {
		req = guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", mkdirScript, "sh", s.dir}, Env: map[string]string{"USERSPEC": s.user}}
	}
	lw := newLineWriter(r.progress, 20)
	code, err := r.vm.Run(ctx, req, lw)
	lw.Flush()
	if err == nil && code != 0 {
		err = fmt.Errorf("exit code %d", code)
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &userError{msg: fmt.Sprintf("Dockerfile line %d: WORKDIR %s: cannot create it: %v", s.in.line, s.dir, err), class: ErrRunFailed}
	}
	r.dirs[s.dir] = true
	return nil
}

// errExtractEnded is what the tar writer sees when Extract returned
// before reading all of the stream (a tar reader may stop at the first of
// the two zero blocks ending it).
var errExtractEnded = errors.New("extract ended")

func (r *run) copy(ctx context.Context, s step) error {
	cs := s.copy
	intoDir := false
	if len(cs.entries) == 1 && cs.entries[0].Single {
		// Docker copies a file into a destination that is an existing
		// directory even without a trailing slash.
		code, err := r.vm.Run(ctx, guestproto.ExecRequest{Argv: []string{"/bin/sh", "-c", `test -d "$1"`, "sh", cs.Dst}}, io.Discard)
		intoDir = err == nil && code == 0
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := writeTar(pw, cs, intoDir)
		pw.CloseWithError(err)
		done <- err
	}()
	err := r.vm.Extract(ctx, pr, cs.Chown)
	pr.CloseWithError(errExtractEnded)
	werr := <-done
	if werr != nil && !errors.Is(werr, errExtractEnded) && err == nil {
		err = werr
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var ue *userError
		if errors.As(err, &ue) {
			return lineErr(s.in.line, "%s: %s", s.in.cmd, ue.msg)
		}
		return fmt.Errorf("Dockerfile line %d: %s: %w", s.in.line, s.in.cmd, err)
	}
	if cs.DstDir {
		r.dirs[cs.Dst] = true
	}
	return nil
}
