package hostagent

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/pandastack/pandastack/internal/contract/host"
)

// MemStats is the host memory a sandbox's VMM uses: the host contract's.
type MemStats = host.MemStats

// Memory reports a sandbox's memory use.
func (a *Agent) Memory(id string) (MemStats, error) {
	s, err := a.get(id)
	if err != nil {
		return MemStats{}, err
	}
	s.mu.Lock()
	m := s.m
	s.mu.Unlock()
	if m == nil {
		return MemStats{}, fmt.Errorf("sandbox %s has no vmm: %w", id, ErrConflict)
	}
	st, err := ReadMemStats(m.PID())
	if err == nil {
		st.Lazy = a.lazyMemStats(s)
	}
	return st, err
}

// MemoryInUse is what this host's running machines hold privately, in
// bytes: the anonymous resident memory of each VMM (its heap, translation
// cache, and the guest pages it has written), not the pages of memory
// images it shares with others through the page cache. Cheap: one small
// read per machine.
func (a *Agent) MemoryInUse() int64 {
	a.mu.Lock()
	all := make([]*sandbox, 0, len(a.sandboxes))
	for _, s := range a.sandboxes {
		all = append(all, s)
	}
	a.mu.Unlock()
	var total int64
	for _, s := range all {
		s.mu.Lock()
		m := s.m
		s.mu.Unlock()
		if m != nil {
			total += host.AnonResidentBytes(m.PID())
		}
	}
	return total
}

// ReadMemStats reads /proc/PID/smaps_rollup.
func ReadMemStats(pid int) (MemStats, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return MemStats{}, fmt.Errorf("read memory of process %d: %w", pid, err)
	}
	var st MemStats
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) < 1 {
			continue
		}
		kib, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		n := kib << 10
		switch k {
		case "Rss":
			st.RSSBytes = n
		case "Pss":
			st.PSSBytes = n
		case "Shared_Clean", "Shared_Dirty":
			st.SharedBytes += n
		case "Private_Clean", "Private_Dirty":
			st.PrivateBytes += n
		}
	}
	return st, nil
}
