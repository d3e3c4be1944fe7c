package hostagent

import (
	"context"
	"path/filepath"

	"github.com/pandastack/pandastack/internal/contract/host"
	"github.com/pandastack/pandastack/internal/hostagent/internal/lazyrestore"
	"github.com/pandastack/pandastack/internal/hostagent/lazymem"
)

// Lazy restore (Config.Lazy; docs/lazy-restore.md) is package
// lazyrestore's; this file is the agent's side of it.

// LazyConfig turns on lazy restore of memory images: lazyrestore.Config.
type LazyConfig = lazyrestore.Config

// ChunkCacheDir is where in the store a host with lazy restore keeps its
// chunk cache (LazyConfig.Chunks' chunkstore.Cache): lazyrestore's.
const ChunkCacheDir = lazyrestore.ChunkCacheDir

// LazyStats reports the lazy file of set name (e.g. "snapshots/<id>"),
// if this host served one.
func (a *Agent) LazyStats(name string) (lazymem.Stats, bool) { return a.lazy.Stats(name) }

// lazyMemStats is what s's memory image, if it is a lazy file, has read
// and fetched so far; nil if it is not one.
func (a *Agent) lazyMemStats(s *sandbox) *host.LazyMemStats {
	return a.lazy.MemStats(filepath.Join(s.dir, memFile))
}

// PauseLazy pauses every running sandbox whose memory this agent pages
// in lazily and returns their IDs, unless a holder process serves the
// mount (LazyConfig.Holder; then it does nothing). Without one, such a
// machine cannot outlive the agent: the FUSE server behind its memory
// file runs in this process, and once it has exited the machine's next
// page-cache miss fails (SIGBUS in QEMU). So an agent that leaves its
// machines running for the next one to adopt (on-shutdown keep) pauses
// these first: the next agent finds them paused, their memory on disk,
// and the control plane records them so. A sandbox that cannot be
// paused is logged and left running.
func (a *Agent) PauseLazy(ctx context.Context) []string {
	if a.lazy.Held() {
		return nil
	}
	a.mu.Lock()
	var lazy []*sandbox
	for _, s := range a.sandboxes {
		if s.getState() == StateRunning && a.lazyMemStats(s) != nil {
			lazy = append(lazy, s)
		}
	}
	a.mu.Unlock()
	var paused []string
	for _, s := range lazy {
		if _, err := a.Pause(ctx, s.rec.ID); err != nil {
			a.log.Error("pause a lazily restored sandbox before leaving it (it will not survive this agent)", "sandbox_id", s.rec.ID, "err", err)
			continue
		}
		a.log.Info("paused a lazily restored sandbox: it cannot outlive this agent", "sandbox_id", s.rec.ID)
		paused = append(paused, s.rec.ID)
	}
	return paused
}
