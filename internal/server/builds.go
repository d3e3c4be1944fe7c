package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/rootfs"
	"github.com/pandastack/pandastack/internal/template"
	"github.com/pandastack/pandastack/internal/tmplbuild"
)

// openTemplateBuilds returns the builder of user templates on host's
// store: images become root filesystems through rootfs.FromImage; a
// template with start or ready commands is baked at the host's default
// shape before its build succeeds.
func openTemplateBuilds(cfg Config, host *agent.Agent, log *slog.Logger) (*tmplbuild.Manager, error) {
	m, err := tmplbuild.New(tmplbuild.Config{
		Store:         host.Templates(),
		Convert:       imageConverter(cfg.TemplateMaxSizeMiB),
		MaxConcurrent: cfg.MaxTemplateBuilds,
		// Beside the template store: the builds' status and logs outlive
		// a restart.
		Dir: filepath.Join(host.StoreDir(), "template-builds"),
		Bake: func(ctx context.Context, ref string, progress func(string)) error {
			_, err := host.Templates().Bake(ctx, host.TemplateParams(ref, 0, 0), template.Progress(progress))
			return err
		},
		Logger: log.With("part", "template-builds"),
	})
	if err != nil {
		return nil, fmt.Errorf("cannot start template builds: %w", err)
	}
	return m, nil
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
