// Package dockerfile builds a template's root filesystem from a Dockerfile.
//
// The model is Docker's classic one, with ext4 disk images as layers and a
// build VM instead of containers:
//
//   - The Dockerfile is parsed with BuildKit's parser and evaluated here:
//     one stage (FROM), RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, and the
//     metadata CMD, ENTRYPOINT, LABEL and EXPOSE. Anything else is refused
//     before anything runs, naming the line (errors wrap ErrInvalid).
//   - The base layer is the FROM image converted to ext4 (Config.FromImage).
//   - Each step that changes the disk (RUN, COPY, ADD, WORKDIR) is a layer
//     with a cache key: sha256 of its parent's key, the instruction after
//     ARG/ENV expansion, the working directory and user it runs with (and
//     for RUN its environment: ENV and ARG values and the proxy build
//     args), and for COPY/ADD the hash of exactly what is copied. The base
//     layer's key is the build's scope (Request.Scope: the building API
//     key) with the image's digest (a tag is converted again on every
//     build, since it may have moved) or, for a digest-pinned reference,
//     the reference (converted once). So every key is one scope's: a
//     build never reuses, reports as cached or restores the VM snapshot
//     of a layer another scope's build made.
//   - A build finds the last step whose layer is cached, starts one VM
//     from it, runs the remaining steps in order and commits a layer into
//     the cache after each. The final layer is cloned to the output file.
//     The VM is restored (Config.Restore) from the snapshot of the running
//     VM that committed the layer, when the entry has one, or else booted
//     (Config.Boot) from a clone of the layer: a restore skips the boot
//     and finds the guest as the previous step left it.
//
// The build context is a tar (plain or gzip) unpacked into a private
// directory with every entry checked (no absolute paths, no "..", no
// devices, symlinks kept but never followed out of the context), honouring
// .dockerignore. Each COPY/ADD becomes a tar stream the VM unpacks at its
// root (VM.Extract).
//
// The cache (Config.CacheDir) holds one directory per layer, named by its
// key (so by scope too), written atomically (a temporary directory renamed into place; a
// build that loses a race discards its copy). It is kept under
// Config.CacheMaxBytes by removing the least recently used layers that no
// running build uses. One process owns a cache directory.
package dockerfile

import (
	"context"
	"io"

	"github.com/pandastack/pandastack/internal/contract/errs"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/templates"
)

// Error classes of a build. The messages are written for users.
var (
	// ErrInvalid: the Dockerfile, its build args or its build context are
	// not something this builder can build (a syntax error, an unsupported
	// instruction, a COPY source that does not exist, an unsafe context
	// entry...).
	ErrInvalid = errs.New(errs.Invalid, "invalid Dockerfile build")
	// ErrRunFailed: a RUN step exited with a non-zero code.
	ErrRunFailed = errs.New(errs.Invalid, "Dockerfile RUN step failed")
)

// Limits of a Dockerfile.
const (
	// MaxDockerfileBytes bounds the Dockerfile's size.
	MaxDockerfileBytes = 1 << 20
	// MaxSteps bounds its instructions (FROM and ARGs before it included).
	MaxSteps = 500
)

// Result is an image's configuration and an identifying digest: what
// FromImage learnt of the base image, or what Build made.
type Result struct {
	Image templates.ImageConfig
	// Digest is the image's manifest digest ("sha256:..."); for a Build,
	// the final layer's cache key ("sha256:...").
	Digest string
}

// FromImage writes the root filesystem of image ref (a registry reference,
// as FROM names it) to the ext4 image out, which it creates, reporting
// progress lines. It returns the image's configuration and manifest digest.
// rootfs.FromImage (through tmplbuild's Convert) is one.
type FromImage func(ctx context.Context, ref, out string, progress func(string)) (Result, error)

// VM is a build VM booted from a disk (an ext4 image file) as the template
// store provides it. Its methods are called from one goroutine at a time.
type VM interface {
	// Run runs req in the guest, streaming stdout and stderr to out;
	// it returns the process's exit code. err is for failures to run it
	// at all (including a command that cannot be found, if the guest
	// reports that as an error rather than exit code 127).
	Run(ctx context.Context, req guestproto.ExecRequest, out io.Writer) (exitCode int, err error)
	// Extract unpacks the tar stream r at the guest's / (entries' names
	// are relative to /) with the tar's modes. chown, "" or Docker's USER
	// form ("name[:group]" or "uid[:gid]"), is resolved in the guest and
	// applied to every entry it creates; with "" entries keep the tar's
	// uid and gid. A directory entry for a directory that already exists
	// leaves that directory's mode and owner as they are (the tar holds
	// the parents of every file it copies). Other entries replace what is
	// at their path.
	Extract(ctx context.Context, r io.Reader, chown string) error
	// Commit flushes the guest's file systems and copies the disk as it
	// is now to dst (a reflink where the file system can); the VM keeps
	// running. When it can, it also snapshots the VM into dst's
	// directory, the files template.SnapshotDisk, SnapshotMem and
	// SnapshotState (the last one written last), which Restore starts a
	// VM from; a VM that cannot leaves them out.
	Commit(ctx context.Context, dst string) error
	// Close stops the VM; its disk is then the caller's to remove.
	Close() error
}

// Boot boots a build VM from the ext4 image disk, a file the build owns
// (a clone of a layer, never a cached layer in place).
type Boot func(ctx context.Context, disk string, progress func(string)) (VM, error)

// Restore starts a build VM from the snapshot a VM's Commit wrote: disk
// and mem are the build's own copies of the snapshot's disk and memory
// files (the VM writes them in place), state its device state (a cached
// file, only read). The VM goes on where the snapshotted one was, its
// processes running. On error nothing is left running; the build then
// boots from the layer instead.
type Restore func(ctx context.Context, disk, mem, state string, progress func(string)) (VM, error)
