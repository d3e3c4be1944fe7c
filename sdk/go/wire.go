package pandastack

import (
	"encoding/json"
	"fmt"

	"github.com/pandastack/pandastack/sdk/go/internal/wire"
)

// The bodies this client sends are internal/wire's types, generated from
// api/openapi.yaml (docs/sdk-go.md, "Wire types"): a request field the
// document renames or drops breaks the build. Its optional fields are
// pointers; these helpers leave a zero value out, so that the server
// applies its default, as the document says.

// optional returns &v, or nil for the zero value.
func optional[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// optionalMap returns &m, or nil for an empty map.
func optionalMap(m map[string]string) *map[string]string {
	if len(m) == 0 {
		return nil
	}
	return &m
}

// optionalSlice returns &s, or nil for an empty slice.
func optionalSlice(s []string) *[]string {
	if len(s) == 0 {
		return nil
	}
	return &s
}

// wirePlacement is p's wire form ("auto" for the zero value).
func wirePlacement(p Placement) (*wire.Placement, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode placement: %w", err)
	}
	w := wire.Placement(b)
	return &w, nil
}

// optionalPlacement is wirePlacement, nil for the zero value (the
// server's choice).
func optionalPlacement(p Placement) (*wire.Placement, error) {
	if p.IsZero() {
		return nil, nil
	}
	return wirePlacement(p)
}

// wireNetwork is n's wire form: Internet always (the zero Network denies
// everything, while a missing internet means allowed).
func wireNetwork(n *Network) *wire.NetworkPolicy {
	if n == nil {
		return nil
	}
	return &wire.NetworkPolicy{Internet: &n.Internet, AllowOut: optionalSlice(n.AllowOut), DenyOut: optionalSlice(n.DenyOut)}
}

// wireMounts is m's wire form; nil for none.
func wireMounts(m []VolumeMount) *[]wire.VolumeMount {
	if len(m) == 0 {
		return nil
	}
	out := make([]wire.VolumeMount, len(m))
	for i, v := range m {
		out[i] = wire.VolumeMount{Name: v.Name, Path: v.Path, ReadOnly: optional(v.ReadOnly)}
	}
	return &out
}
