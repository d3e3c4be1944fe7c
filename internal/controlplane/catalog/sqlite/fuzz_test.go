package sqlite_test

import (
	"path/filepath"
	"testing"

	"github.com/pandastack/pandastack/internal/controlplane/catalog/catalogtest"
	"github.com/pandastack/pandastack/internal/controlplane/catalog/sqlite"
)

// FuzzMetadataFilter: see catalogtest.MetadataFilter.
func FuzzMetadataFilter(f *testing.F) {
	c, err := sqlite.Open(f.Context(), filepath.Join(f.TempDir(), "catalog.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { c.Close() })
	catalogtest.MetadataFilter(f, c)
}
