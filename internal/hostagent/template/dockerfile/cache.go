package dockerfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/internal/hostagent/template"
)

// Files of a cache entry, the directory CacheDir/<key>; an entry a VM
// committed may also hold that VM's snapshot (template.SnapshotDisk,
// SnapshotMem, SnapshotState).
const (
	layerFile  = "rootfs.ext4"
	configFile = "config.json"
	// tmpPrefix starts the names of directories being written.
	tmpPrefix = ".tmp-"
	// staleTmp is the age after which a leftover temporary directory (of
	// a build interrupted by a crash) is removed.
	staleTmp = 24 * time.Hour
)

// layerCache is the layer cache in a directory. It is safe for concurrent
// use by the builds of one process; one process owns a directory.
type layerCache struct {
	dir string
	log *slog.Logger

	mu sync.Mutex
	// pins counts the running builds using each entry: eviction leaves
	// those alone.
	pins map[string]int
}

// entryConfig is an entry's config.json.
type entryConfig struct {
	Result
	Created time.Time `json:"created"`
	// Scope is the scope of the build that made the entry (Request.Scope),
	// whose share of the cache eviction weighs; "" for entries made before
	// it was recorded.
	Scope string `json:"scope,omitempty"`
}

func (c *layerCache) path(key string) string { return filepath.Join(c.dir, key, layerFile) }

// pin marks key in use (whether or not it is cached yet) and reports
// whether it is cached; a hit counts as a use for eviction.
func (c *layerCache) pin(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pins[key]++
	if _, err := os.Stat(c.path(key)); err != nil {
		return false
	}
	now := time.Now()
	os.Chtimes(filepath.Join(c.dir, key), now, now)
	return true
}

func (c *layerCache) unpin(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pins[key]--; c.pins[key] <= 0 {
		delete(c.pins, key)
	}
}

// tempDir makes a directory for an entry being written, in the cache
// directory so that the rename that publishes it is atomic and a clone
// into it can be a reflink.
func (c *layerCache) tempDir() (string, error) {
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return "", fmt.Errorf("build cache: %w", err)
	}
	d, err := os.MkdirTemp(c.dir, tmpPrefix)
	if err != nil {
		return "", fmt.Errorf("build cache: %w", err)
	}
	return d, nil
}

// commit publishes tmp (holding the layer file) as entry key, with cfg,
// made by a build of scope. If another build published key first, tmp is
// discarded: both are the same layer.
func (c *layerCache) commit(tmp, key, scope string, cfg Result) error {
	b, err := json.Marshal(entryConfig{Result: cfg, Created: time.Now().UTC(), Scope: scope})
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, configFile), b, 0o600); err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("build cache: %w", err)
	}
	err = os.Rename(tmp, filepath.Join(c.dir, key))
	if err != nil {
		os.RemoveAll(tmp)
		if errors.Is(err, fs.ErrExist) || errors.Is(err, syscall.ENOTEMPTY) {
			return nil
		}
		return fmt.Errorf("build cache: %w", err)
	}
	return nil
}

// snapshotFiles are the paths of a cache entry's VM snapshot.
type snapshotFiles struct{ disk, mem, state string }

// snapshot returns the files of entry key's snapshot and whether it has
// one (its state is written last, so it marks a whole snapshot).
func (c *layerCache) snapshot(key string) (snapshotFiles, bool) {
	dir := filepath.Join(c.dir, key)
	s := snapshotFiles{
		disk:  filepath.Join(dir, template.SnapshotDisk),
		mem:   filepath.Join(dir, template.SnapshotMem),
		state: filepath.Join(dir, template.SnapshotState),
	}
	for _, f := range []string{s.state, s.disk, s.mem} {
		if _, err := os.Stat(f); err != nil {
			return snapshotFiles{}, false
		}
	}
	return s, true
}

// config reads entry key's config.
func (c *layerCache) config(key string) (Result, error) {
	b, err := os.ReadFile(filepath.Join(c.dir, key, configFile))
	if err != nil {
		return Result{}, fmt.Errorf("build cache: %w", err)
	}
	var ec entryConfig
	if err := json.Unmarshal(b, &ec); err != nil {
		return Result{}, fmt.Errorf("build cache: entry %s: %w", key, err)
	}
	return ec.Result, nil
}

type cacheEntry struct {
	key   string
	scope string
	used  time.Time
	bytes int64
}

// entries lists the cache's entries with their allocated sizes.
func (c *layerCache) entries() ([]cacheEntry, error) {
	des, err := os.ReadDir(c.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []cacheEntry
	for _, de := range des {
		fi, err := de.Info()
		if err != nil || !de.IsDir() {
			continue
		}
		if strings.HasPrefix(de.Name(), tmpPrefix) {
			if time.Since(fi.ModTime()) > staleTmp {
				os.RemoveAll(filepath.Join(c.dir, de.Name()))
			}
			continue
		}
		e := cacheEntry{key: de.Name(), used: fi.ModTime()}
		var ec entryConfig
		if b, err := os.ReadFile(filepath.Join(c.dir, de.Name(), configFile)); err == nil && json.Unmarshal(b, &ec) == nil {
			e.scope = ec.Scope
		}
		files, _ := os.ReadDir(filepath.Join(c.dir, de.Name()))
		for _, f := range files {
			e.bytes += allocated(filepath.Join(c.dir, de.Name(), f.Name()))
		}
		out = append(out, e)
	}
	return out, nil
}

// allocated is the space the file p takes on disk (its blocks, not its
// apparent size: layers and memory images are sparse). A reflinked file
// is counted whole though it shares blocks with others.
func allocated(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

// evict removes entries that no build uses until the cache holds at most
// max bytes (all of them if max is negative). Each time it removes the
// least recently used entry of the scope that holds the most bytes, so a
// scope that fills the cache evicts its own layers before anyone else's:
// one tenant's builds cannot flush another's cache.
func (c *layerCache) evict(max int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	es, err := c.entries()
	if err != nil {
		return fmt.Errorf("build cache: %w", err)
	}
	var total int64
	held := map[string]int64{} // bytes per scope
	for _, e := range es {
		total += e.bytes
		held[e.scope] += e.bytes
	}
	sort.Slice(es, func(i, j int) bool { return es[i].used.Before(es[j].used) })
	done := make([]bool, len(es))
	for max < 0 || total > max {
		pick := -1
		for i, e := range es {
			if done[i] || c.pins[e.key] > 0 {
				continue
			}
			if pick < 0 || held[e.scope] > held[es[pick].scope] {
				pick = i
			}
		}
		if pick < 0 {
			break // what is left is in use
		}
		done[pick] = true
		e := es[pick]
		// Rename first so that a half-removed entry is never seen as one.
		gone := filepath.Join(c.dir, tmpPrefix+"evict-"+e.key)
		if err := os.Rename(filepath.Join(c.dir, e.key), gone); err != nil {
			c.log.Warn("build cache: evict", "key", e.key, "err", err)
			continue
		}
		if err := os.RemoveAll(gone); err != nil {
			c.log.Warn("build cache: evict", "key", e.key, "err", err)
		}
		total -= e.bytes
		held[e.scope] -= e.bytes
		c.log.Info("build cache: evicted", "key", e.key, "bytes", e.bytes)
	}
	return nil
}
