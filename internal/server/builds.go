package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/api"
	"github.com/pandastack/pandastack/internal/rootfs"
	"github.com/pandastack/pandastack/internal/template"
	"github.com/pandastack/pandastack/internal/tmplbuild"
)

// openTemplateBuilds returns the builder of user templates on host's
// store: images become root filesystems through rootfs.FromImage; a
// template with start or ready commands is baked at the host's default
// shape before its build succeeds.
func openTemplateBuilds(cfg Config, host *agent.Agent, log *slog.Logger) (*tmplbuild.Manager, error) {
	// The build contexts a previous run received and did not build: no
	// build of this run has any yet. Only the API's own files: the
	// directory may be a shared one.
	dir := cfg.templateContextDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("cannot start template builds: %w", err)
	}
	old, _ := filepath.Glob(filepath.Join(dir, api.ContextFilePattern))
	for _, f := range old {
		os.Remove(f)
	}
	m, err := tmplbuild.New(tmplbuild.Config{
		Store:         host.Templates(),
		Convert:       imageConverter(cfg.TemplateMaxSizeMiB),
		MaxConcurrent: cfg.MaxTemplateBuilds,
		Bake: func(ctx context.Context, name string, progress func(string)) error {
			_, err := host.Templates().Bake(ctx, host.TemplateParams(name, 0, 0), template.Progress(progress))
			return err
		},
		Logger: log.With("part", "template-builds"),
	})
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

// imageConverter adapts rootfs.FromImage to tmplbuild.Convert. Sources
// are registry references only (the API refuses the others, which name
// the host's files; the "docker://" prefix makes sure of it). Registry
// credentials are the server's own (its Docker config), if any.
func imageConverter(maxSizeMiB int) tmplbuild.Convert {
	return func(ctx context.Context, src, out string, progress func(string)) (tmplbuild.Result, error) {
		ref := src
		if !strings.HasPrefix(ref, "docker://") {
			ref = "docker://" + ref
		}
		c, err := rootfs.FromImage(ctx, ref, out, rootfs.Options{MaxSizeMiB: maxSizeMiB, Progress: progress})
		if err != nil && ref != src {
			err = renamed{strings.ReplaceAll(err.Error(), ref, src), err} // as the user wrote it
		}
		if err != nil {
			if errors.Is(err, rootfs.ErrNotFound) {
				return tmplbuild.Result{}, fmt.Errorf("%w: %w", tmplbuild.ErrImageNotFound, err)
			}
			return tmplbuild.Result{}, err
		}
		return tmplbuild.Result{Digest: c.Digest, Image: template.ImageConfig{
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
