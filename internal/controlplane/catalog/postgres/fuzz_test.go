package postgres_test

import (
	"testing"

	"github.com/pandastack/pandastack/internal/controlplane/catalog/catalogtest"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/postgres"
	"github.com/pandastack/pandastack/internal/testing/pgtest"
)

// FuzzMetadataFilter: see catalogtest.MetadataFilter. Each fuzzing process
// starts its own PostgreSQL server (a second or two).
func FuzzMetadataFilter(f *testing.F) {
	c, err := postgres.Open(f.Context(), pgtest.NewDatabase(f, pgtest.Start(f)))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { c.Close() })
	catalogtest.MetadataFilter(f, c)
}
