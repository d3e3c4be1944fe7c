package fleet

import "github.com/pandastack/pandastack/internal/contract/builds"

// SetBuilders makes t build on the hosts ids, whose builders builderOf
// returns (false: the host is away now), instead of the registry's
// members; a host in gone is forgotten.
func SetBuilders(t *Templates, ids []string, builderOf func(id string) (builds.Builder, bool), gone func(id string) bool) {
	t.builderOf = func(id string) (builds.Builder, error) {
		if b, ok := builderOf(id); ok && !gone(id) {
			return b, nil
		}
		return t.memberBuilder(id)
	}
	t.gone = gone
	t.connected = func() map[string]builds.Builder {
		out := map[string]builds.Builder{}
		for _, id := range ids {
			if b, ok := builderOf(id); ok && !gone(id) {
				out[id] = b
			}
		}
		return out
	}
}

// SetSweeper makes t sweep the object store through via, for every host.
func SetSweeper(t *Templates, via StoreSweeper) {
	t.sweeperOf = func(string) (StoreSweeper, bool) { return via, true }
}
