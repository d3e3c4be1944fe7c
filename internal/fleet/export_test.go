package fleet

import "github.com/pandastack/pandastack/internal/tmplbuild"

// SetBuilders makes t build on builders instead of the registry's
// members; a host in gone is gone for good.
func SetBuilders(t *Templates, builders map[string]tmplbuild.Builder, gone func(id string) bool) {
	t.builderOf = func(id string) (tmplbuild.Builder, error) {
		if b, ok := builders[id]; ok && !gone(id) {
			return b, nil
		}
		return t.memberBuilder(id)
	}
	t.gone = gone
	t.connected = func() map[string]tmplbuild.Builder {
		out := map[string]tmplbuild.Builder{}
		for id, b := range builders {
			if !gone(id) {
				out[id] = b
			}
		}
		return out
	}
}
