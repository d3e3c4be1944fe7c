package hostagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/pandastack/pandastack/internal/contract/guestproto"
	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/contract/lifecycle"
	"github.com/pandastack/pandastack/internal/contract/templates"
	"github.com/pandastack/pandastack/internal/storage/chunkstore"
	"golang.org/x/sys/unix"
)

// CreateRequest asks for a new sandbox: the host contract's.
type CreateRequest = host.CreateRequest

// checkCreate checks a create's ID (giving it one if it has none) and
// owner.
func checkCreate(req *CreateRequest) error {
	if req.ID == "" {
		req.ID = host.NewID()
	} else if !host.ValidID(req.ID) {
		return fmt.Errorf("create sandbox: %w: id %q must be lowercase letters and digits", ErrInvalid, req.ID)
	}
	if req.Owner != "" && !validOwner(req.Owner) {
		return fmt.Errorf("create sandbox: %w: owner %q", ErrInvalid, req.Owner)
	}
	return nil
}

// Create restores a new sandbox from a template and returns once its guest
// agent has answered (clock set, RNG reseeded, identity written).
func (a *Agent) Create(ctx context.Context, req CreateRequest) (Info, error) {
	if err := checkCreate(&req); err != nil {
		return Info{}, err
	}
	var im image
	var fetched chunkstore.DownloadStats // what this create downloaded
	if req.SnapshotID != "" {
		snap, err := a.GetSnapshot(req.SnapshotID)
		if errors.Is(err, ErrNotFound) && a.store != nil {
			// Taken on another host sharing the store?
			snap, fetched, err = a.adoptSnapshot(ctx, req.SnapshotID)
		}
		if err != nil {
			return Info{}, fmt.Errorf("create sandbox: %w", err)
		}
		if _, err := os.Stat(a.snapshotDir(snap.ID)); errors.Is(err, os.ErrNotExist) && a.store != nil {
			// Durable in the store, lost here: fetch it first.
			if fetched, err = a.sync.FetchSnapshot(ctx, snap.ID, nil); err != nil {
				return Info{}, fmt.Errorf("create sandbox: %w", err)
			}
		}
		if err := a.verifySnapshot(snap); err != nil {
			return Info{}, fmt.Errorf("create sandbox: %w", err)
		}
		im = a.snapshotImage(snap)
	} else {
		if err := a.sync.ReplicateUserTemplate(ctx, req.Template, req.Progress); err != nil {
			return Info{}, fmt.Errorf("create sandbox: %w", err)
		}
		p := a.TemplateParams(req.Template, req.MemoryMiB, req.VCPUs)
		if err := p.Validate(); err != nil {
			return Info{}, fmt.Errorf("create sandbox: %w: %v", ErrInvalid, err)
		}
		tmpl, err := a.templates.Get(ctx, p, req.Progress)
		if err != nil {
			if errors.Is(err, templates.ErrNotFound) {
				return Info{}, fmt.Errorf("create sandbox: %w: %v", ErrNotFound, err)
			}
			if errors.Is(err, templates.ErrInvalid) {
				return Info{}, fmt.Errorf("create sandbox: %w: %v", ErrInvalid, err)
			}
			return Info{}, fmt.Errorf("create sandbox: %w", err)
		}
		im = templateImage(tmpl, a.images)
		if req.Owner != "" {
			mem, err := a.tenantMemory(tmpl, req.Owner)
			if err != nil {
				return Info{}, fmt.Errorf("create sandbox: %w", err)
			}
			im.memFile = mem
		}
	}
	return a.createFrom(ctx, req, im, fetched)
}

// createFrom registers sandbox req and starts it from im (Create's end);
// fetched is what was downloaded to make im.
func (a *Agent) createFrom(ctx context.Context, req CreateRequest, im image, fetched chunkstore.DownloadStats) (Info, error) {
	if err := a.checkSpace(); err != nil {
		return Info{}, fmt.Errorf("create sandbox: %w", err)
	}
	if err := req.Network.Validate(); err != nil {
		return Info{}, fmt.Errorf("create sandbox: %w: %w", ErrInvalid, err)
	}
	a.mountMu.RLock()
	if err := a.checkMounts(req.Volumes, nil); err != nil {
		a.mountMu.RUnlock()
		return Info{}, fmt.Errorf("create sandbox: %w", err)
	}
	env, cwd, user := a.imageDefaults(req.Template, req.Env)
	s, err := a.register(record{ID: req.ID, Env: env, Cwd: cwd, User: user, Owner: req.Owner, Snapshot: req.SnapshotID, Lineage: im.lineage, Network: req.Network, Volumes: req.Volumes})
	a.mountMu.RUnlock()
	if err != nil {
		return Info{}, fmt.Errorf("create sandbox: %w", err)
	}
	s.setFetched(fetched.BytesFetched)
	s.mu.Lock()
	s.dropMounts = req.SnapshotID != "" && len(req.Volumes) == 0
	s.mu.Unlock()
	if err := a.start(ctx, s, im); err != nil {
		return Info{}, fmt.Errorf("create sandbox: %w", err)
	}
	return s.info(), nil
}

// imageDefaults returns the default environment, working directory and
// user of the execs of a sandbox of template name with create-time env: for
// a user template, its image's Env under env (a variable of env wins), its
// WorkingDir and its User; otherwise env, "" and "" (root). A User the
// guest protocol cannot carry is dropped (the execs run as root, as they
// did before users were applied) rather than failing every exec.
func (a *Agent) imageDefaults(name string, env map[string]string) (map[string]string, string, string) {
	if name == "" || a.templates.IsBuiltin(name) {
		return env, "", ""
	}
	u, err := a.templates.UserRootFS(name)
	if err != nil {
		return env, "", ""
	}
	user := u.Image.User
	if err := guestproto.ValidateUser(user); err != nil {
		a.log.Warn("image user ignored", "template", name, "user", user, "err", err)
		user = ""
	}
	out := u.Image.EnvMap()
	if out == nil {
		return env, u.Image.WorkingDir, user
	}
	for k, v := range env {
		out[k] = v
	}
	return out, u.Image.WorkingDir, user
}

// start restores a registered (starting) sandbox from im and makes it
// running; on failure, or if it is killed meanwhile, it is stopped and its
// files are gone.
func (a *Agent) start(ctx context.Context, s *sandbox, im image) error {
	ctx, end, err := s.begin(ctx, "start", StateStarting)
	if err != nil {
		a.stop(s)
		return err
	}
	err = a.restore(ctx, s, im)
	if err == nil {
		err = s.transition(lifecycle.Started)
	}
	if err == nil {
		err = classifyIOError(s.writeRecord(false))
	}
	end()
	if err != nil {
		killed := s.stopping()
		a.stop(s)
		if killed {
			return errStopped(s, "start")
		}
		return err
	}
	return nil
}

// register reserves rec.ID for a new sandbox in state starting.
func (a *Agent) register(rec record) (*sandbox, error) {
	rec.Hostname = rec.ID
	rec.MachineID = randHex(16)
	rec.CreatedAt = time.Now().UTC()
	s := newSandbox(rec, filepath.Join(a.sbDir, rec.ID), filepath.Join(a.cfg.RunDir, rec.ID), StateStarting)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, fmt.Errorf("%w: host agent is shutting down", ErrConflict)
	}
	if _, dup := a.sandboxes[rec.ID]; dup {
		return nil, fmt.Errorf("%w: id %s in use", ErrConflict, rec.ID)
	}
	a.sandboxes[rec.ID] = s
	return s, nil
}

// checkSpace fails with ErrNoSpace when the store is nearly full. The
// message is for users: it names no host path (the log does).
func (a *Agent) checkSpace() error {
	var st unix.Statfs_t
	if err := unix.Statfs(a.vol.Dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", a.vol.Dir, err)
	}
	free := int64(st.Bavail) * st.Bsize
	if free < a.cfg.MinFreeBytes {
		a.log.Warn("store nearly full", "dir", a.vol.Dir, "free_mib", free>>20, "min_free_mib", a.cfg.MinFreeBytes>>20)
		return fmt.Errorf("%w: the host has %d MiB free for sandboxes and needs at least %d MiB; kill sandboxes or delete snapshots",
			ErrNoSpace, free>>20, a.cfg.MinFreeBytes>>20)
	}
	return nil
}
