// Package opencatalog opens the catalog store a URL names. It is separate
// from package catalog because it imports the implementations, which import
// catalog.
package opencatalog

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/postgres"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/sqlite"
)

// Open opens the catalog named by u:
//
//   - postgres://... or postgresql://...: PostgreSQL (the URL is passed to
//     the driver as is, so any libpq URL parameter works);
//   - sqlite:///abs/path.db, sqlite:rel/path.db or a plain file path:
//     SQLite. The path after the scheme is taken literally (no percent
//     decoding).
func Open(ctx context.Context, u string) (catalog.Catalog, error) {
	switch {
	case strings.HasPrefix(u, "postgres://"), strings.HasPrefix(u, "postgresql://"):
		c, err := postgres.Open(ctx, u)
		if err != nil {
			return nil, err
		}
		return c, nil
	}
	path, ok := strings.CutPrefix(u, "sqlite://")
	if !ok {
		path, ok = strings.CutPrefix(u, "sqlite:")
	}
	if !ok {
		if scheme, _, found := strings.Cut(u, "://"); found {
			return nil, fmt.Errorf("open catalog: unknown scheme %q (want sqlite or postgres)", scheme)
		}
	}
	if path == "" {
		return nil, errors.New("open catalog: empty path")
	}
	c, err := sqlite.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	return c, nil
}
