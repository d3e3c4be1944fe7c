package hostagent

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pandastack/pandastack/internal/hostagent/internal/volume"
	"github.com/pandastack/pandastack/internal/hostagent/template"
	"github.com/pandastack/pandastack/internal/hostagent/vmm"
	"github.com/pandastack/pandastack/internal/storage/manifest"
)

// tenantMemory returns owner's copy of tmpl's memory image, making it on
// first use: a reflink clone (O(metadata) on disk) that does not share page
// cache with the original, so pages are shared copy-on-write only among
// one owner's sandboxes. Copies are keyed by the template's boot id: a
// re-bake gets new copies, and tenantGC removes the old ones.
func (a *Agent) tenantMemory(tmpl *template.Template, owner string) (string, error) {
	dir := filepath.Join(a.vol.Dir, "tenants", owner)
	path := filepath.Join(dir, tmpl.Key()+"-"+tmpl.BootID+".mem")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", classifyIOError(err)
	}
	tmp := fmt.Sprintf("%s.tmp-%s", path, randHex(4))
	if err := volume.Clone(tmpl.MemFile(), tmp); err != nil {
		return "", classifyIOError(fmt.Errorf("copy template memory for %s: %w", owner, err))
	}
	if err := os.Rename(tmp, path); err != nil { // concurrent creates: either copy is fine
		os.Remove(tmp)
		return "", fmt.Errorf("copy template memory for %s: %w", owner, err)
	}
	return path, nil
}

// Tenant group ids: each owner's VMMs run with a group of their own, the
// group of that owner's shared memory images (see vmm.Spec.GID), so that
// the VMM of one tenant cannot open another tenant's images. Allocated
// from tenantGIDBase up, recorded in the owner's tenant directory.
const (
	tenantGIDBase  = 1_400_000_000
	tenantGIDCount = 1_000_000
)

// tenantGID returns owner's group id, allocating it on first use ("" is
// the driver's default group).
func (a *Agent) tenantGID(owner string) (uint32, error) {
	if owner == "" {
		return 0, nil
	}
	a.gidMu.Lock()
	defer a.gidMu.Unlock()
	if gid, ok := a.gids[owner]; ok {
		return gid, nil
	}
	dir := filepath.Join(a.vol.Dir, "tenants", owner)
	file := filepath.Join(dir, "gid")
	if b, err := os.ReadFile(file); err == nil {
		if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32); err == nil {
			a.gids[owner] = uint32(v)
			return uint32(v), nil
		}
	}
	// The next free one: one more than the largest recorded.
	next := uint32(tenantGIDBase)
	files, _ := filepath.Glob(filepath.Join(a.vol.Dir, "tenants", "*", "gid"))
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32); err == nil && uint32(v) >= next {
				next = uint32(v) + 1
			}
		}
	}
	if next >= tenantGIDBase+tenantGIDCount {
		return 0, fmt.Errorf("%w: no tenant group id left", vmm.ErrExhausted)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, classifyIOError(err)
	}
	if err := manifest.WriteFile(file, []byte(strconv.FormatUint(uint64(next), 10)+"\n"), 0o600); err != nil {
		return 0, classifyIOError(err)
	}
	a.gids[owner] = next
	return next, nil
}

func validOwner(owner string) bool {
	if owner == "" || len(owner) > 64 {
		return false
	}
	for _, c := range owner {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// tenantGC removes tenants' copies of template memory images whose bake is
// gone. Running sandboxes are unaffected: they hold hard links.
func (a *Agent) tenantGC() {
	current := map[string]bool{}
	if list, err := a.templates.List(); err == nil {
		for _, t := range list {
			current[t.Key()+"-"+t.BootID+".mem"] = true
		}
	}
	files, _ := filepath.Glob(filepath.Join(a.vol.Dir, "tenants", "*", "*"))
	for _, f := range files {
		if !current[filepath.Base(f)] {
			os.Remove(f)
		}
	}
}
