package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pandastack/pandastack/internal/contract/builds"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/controlplane/rest"
	"github.com/pandastack/pandastack/internal/hostagent"
	"github.com/pandastack/pandastack/internal/hostagent/template"
	"github.com/pandastack/pandastack/internal/hostagent/template/build"
	"github.com/pandastack/pandastack/internal/hostagent/template/dockerfile"
	"github.com/pandastack/pandastack/internal/hostagent/template/rootfs"
)

// A host's build manager serves the REST API's template builds in panda up.
var _ rest.TemplateBuilds = (*build.Manager)(nil)

// openTemplateBuilds returns the builder of user templates on host's
// store: images become root filesystems through rootfs.FromImage; a
// template with start or ready commands is baked at the host's default
// shape before its build succeeds.
func openTemplateBuilds(cfg Config, host *hostagent.Agent, log *slog.Logger) (*build.Manager, error) {
	// The build contexts a previous run received and did not build: no
	// build of this run has any yet. Only the API's own files: the
	// directory may be a shared one.
	dir := cfg.templateContextDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cannot start template builds: %w", err)
	}
	old, _ := filepath.Glob(filepath.Join(dir, rest.ContextFilePattern))
	for _, f := range old {
		os.Remove(f)
	}
	pull, err := cfg.registryPull()
	if err != nil {
		return nil, fmt.Errorf("cannot start template builds: %w", err)
	}
	convert := imageConverter(cfg.TemplateMaxSizeMiB, pull, log.With("part", "template-builds"))
	df, err := dockerfileBuilder(cfg, host, convert, log)
	if err != nil {
		return nil, err
	}
	tc := build.Config{
		Store:   host.Templates(),
		Convert: convert,
		Dockerfile: func(ctx context.Context, spec builds.Spec, out string, progress func(string)) (builds.Result, error) {
			// The cache is the building key's: no other key's build
			// reuses (or sees as cached) what its steps made.
			r, err := df.Build(ctx, dockerfile.Request{Dockerfile: spec.Dockerfile, ContextTar: spec.ContextTar,
				BuildArgs: spec.BuildArgs, Scope: spec.Owner}, out, progress)
			return builds.Result(r), err
		},
		CheckDockerfile: dockerfile.Check,
		MaxConcurrent:   cfg.MaxTemplateBuilds,
		// A build writes its root filesystem and its layers to the store.
		CheckSpace: build.DiskSpace(host.StoreDir(), builds.MinFreeBytes),
		// Beside the template store: the builds' status and logs outlive
		// a restart.
		Dir: filepath.Join(host.StoreDir(), "template-builds"),
		Bake: func(ctx context.Context, ref string, progress func(string)) error {
			_, err := host.Templates().Bake(ctx, host.TemplateParams(ref, 0, 0), templates.Progress(progress))
			return err
		},
		Logger: log.With("part", "template-builds"),
	}
	if host.SharesTemplates() {
		// The other hosts fetch what it builds.
		tc.Publish, tc.Unpublish = host.PublishUserTemplate, host.UnpublishUserTemplate
	}
	// A host of a fleet: the catalog keeps the registry.
	tc.Copies = cfg.ServerURL != ""
	m, err := build.New(tc)
	if err != nil {
		return nil, fmt.Errorf("cannot start template builds: %w", err)
	}
	return m, nil
}

// templateContextDir is where the API receives build contexts
// (Config.TemplateContextDir).
func (c Config) templateContextDir() string {
	if c.TemplateContextDir != "" {
		return c.TemplateContextDir
	}
	return filepath.Join(c.DataDir, "build-contexts")
}

// dockerfileBuilder runs Dockerfile builds on host: each build boots one
// build VM (the shape of host's default template, the network bakes get)
// from the last cached layer its steps can reuse. FROM names a registry
// image, or one of the built-in root filesystems (base, tiny). Layers are
// cached in STORE/build-cache (the store reflinks where it can), bounded
// by cfg.BuildCacheMaxMiB.
func dockerfileBuilder(cfg Config, host *hostagent.Agent, convert build.Convert, log *slog.Logger) (*dockerfile.Builder, error) {
	shape := host.TemplateParams("", 0, 0)
	images := template.Images{Dir: cfg.ImagesDir}
	maxDisk := cfg.TemplateMaxSizeMiB
	// Build contexts are unpacked here; a restart during a build leaves
	// one behind.
	tmp := filepath.Join(cfg.DataDir, "build-tmp")
	if err := os.RemoveAll(tmp); err != nil {
		return nil, fmt.Errorf("cannot start Dockerfile builds: %w", err)
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("cannot start Dockerfile builds: %w", err)
	}
	opts := template.BuildVMOptions{MemoryMiB: shape.MemoryMiB, VCPUs: shape.VCPUs, MaxDiskMiB: maxDisk}
	b, err := dockerfile.New(dockerfile.Config{
		Boot: func(ctx context.Context, disk string, progress func(string)) (dockerfile.VM, error) {
			vm, err := host.Templates().BootBuildVM(ctx, disk, opts, progress)
			if err != nil {
				return nil, err
			}
			return vm, nil
		},
		Restore: func(ctx context.Context, disk, mem, state string, progress func(string)) (dockerfile.VM, error) {
			vm, err := host.Templates().RestoreBuildVM(ctx, disk, mem, state, opts, progress)
			if err != nil {
				return nil, err
			}
			return vm, nil
		},
		FromImage: func(ctx context.Context, ref, out string, progress func(string)) (dockerfile.Result, error) {
			if slices.Contains(templates.Reserved, ref) {
				return builtinBase(images, ref, out, progress)
			}
			r, err := convert(ctx, ref, out, progress)
			return dockerfile.Result(r), err
		},
		CacheDir:      filepath.Join(host.StoreDir(), "build-cache"),
		CacheMaxBytes: int64(cfg.BuildCacheMaxMiB) << 20,
		TempDir:       tmp,
		RunNote:       cfg.runNote(),
		Logger:        log.With("part", "dockerfile"),
	})
	if err != nil {
		return nil, fmt.Errorf("cannot start Dockerfile builds: %w", err)
	}
	return b, nil
}

// runNote is what a Dockerfile build says about its RUN steps: that they
// have no network, unless the build VM gets one (bakes do: --bake-network
// on a host with networking). Without it a RUN that needs the network
// fails with the tool's own words (a name that does not resolve, a
// network that is unreachable), which do not say why.
func (c Config) runNote() string {
	switch {
	case c.Network == "off":
		return "RUN steps have no network: this server runs with --network off"
	case !c.BakeNetwork:
		return "RUN steps have no network: this server runs without --bake-network"
	}
	return ""
}

// builtinBase copies the built-in root filesystem name (FROM base) to
// out. Its digest names the file's version (size and modification time:
// setup rewrites the file when it rebuilds it), so layers built on it are
// reused until it changes.
func builtinBase(images template.Images, name, out string, progress func(string)) (dockerfile.Result, error) {
	src := images.RootFS(name)
	st, err := os.Stat(src)
	if err != nil {
		return dockerfile.Result{}, fmt.Errorf("%w: the built-in root filesystem %s is missing on this server", builds.ErrImageNotFound, name)
	}
	progress(fmt.Sprintf("copying the built-in root filesystem %s (%d MiB)", name, st.Size()>>20))
	if err := dockerfile.CloneFile(src, out); err != nil {
		return dockerfile.Result{}, fmt.Errorf("copy the built-in root filesystem %s: %w", name, err)
	}
	return dockerfile.Result{
		Image:  templates.ImageConfig{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}},
		Digest: fmt.Sprintf("builtin:%s@%d-%d", name, st.Size(), st.ModTime().UnixNano()),
	}, nil
}

// registryPull is how template builds reach registries: public
// addresses only, but for RegistryAllowNets and RegistryAllowHosts;
// anonymously.
func (c Config) registryPull() (*rootfs.Pull, error) {
	nets, err := rootfs.ParseAllowNets(c.RegistryAllowNets)
	if err != nil {
		return nil, fmt.Errorf("registry_allow_nets: %w", err)
	}
	for _, h := range c.RegistryAllowHosts {
		if h == "" || strings.ContainsAny(h, "/ \t@") {
			return nil, fmt.Errorf("registry_allow_hosts: %q is not a registry host name (registry.example.com or registry.example.com:5000)", h)
		}
	}
	return &rootfs.Pull{AllowNets: nets, AllowHosts: c.RegistryAllowHosts}, nil
}

// imageConverter adapts rootfs.FromImage to tmplbuild.Convert. Sources
// are registry references only (the API refuses the others, which name
// the host's files; the "docker://" prefix makes sure of it), pulled as
// pull says: public addresses only (unless the operator allowed more),
// anonymously — never with the server's own Docker credentials. A failed
// pull's error says what kind of failure it was, never what the registry
// sent: that is logged.
func imageConverter(maxSizeMiB int, pull *rootfs.Pull, log *slog.Logger) build.Convert {
	return func(ctx context.Context, src, out string, progress func(string)) (builds.Result, error) {
		ref := src
		if !strings.HasPrefix(ref, "docker://") {
			ref = "docker://" + ref
		}
		c, err := rootfs.FromImage(ctx, ref, out, rootfs.Options{MaxSizeMiB: maxSizeMiB, Progress: progress, Pull: pull})
		if d := rootfs.Detail(err); d != nil {
			log.Info("image pull failed", "from_image", src, "err", err, "detail", d)
		}
		if err != nil && ref != src {
			err = renamed{strings.ReplaceAll(err.Error(), ref, src), err} // as the user wrote it
		}
		if err != nil {
			if errors.Is(err, rootfs.ErrNotFound) {
				return builds.Result{}, fmt.Errorf("%w: %w", builds.ErrImageNotFound, err)
			}
			return builds.Result{}, err
		}
		return builds.Result{Digest: c.Digest, Image: templates.ImageConfig{
			Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd,
		}}, nil
	}
}

// renamed is err with another message.
type renamed struct {
	msg string
	err error
}

func (e renamed) Error() string { return e.msg }
func (e renamed) Unwrap() error { return e.err }
