// Package migration reads the catalog's versioned schema migrations from an
// embedded directory. Applying them is each store's business (locking and
// transactions differ); this package only decides what the list is and
// what is left of it to apply.
package migration

import (
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"
)

// Migration is one forward-only schema change.
type Migration struct {
	Version int    // from the file name: 0001_init.sql is version 1
	Name    string // the file name
	SQL     string
}

// Load returns the *.sql files of dir in fsys, named NNNN_what.sql, ordered
// by version. Versions must start at 1 and have no gaps or duplicates, so a
// missing file is caught at build time by the stores' tests rather than
// silently skipped on a live database.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var ms []Migration
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".sql") {
			continue
		}
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("read migrations: %s is not named NNNN_what.sql", name)
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("read migrations: %w", err)
		}
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(b)})
	}
	// ReadDir sorts by name and the numbers are zero-padded, but check
	// rather than trust the padding.
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("read migrations: %s has version %d, want %d", m.Name, m.Version, i+1)
		}
	}
	if len(ms) == 0 {
		return nil, fmt.Errorf("read migrations: none in %s", dir)
	}
	return ms, nil
}

// Pending returns the migrations of ms (as Load returns them) after
// version applied, the newest one a store has recorded. A store newer than
// ms, migrated by a newer program, is an error: running against a schema
// the program does not know could damage it.
func Pending(ms []Migration, applied int) ([]Migration, error) {
	if applied > len(ms) {
		return nil, fmt.Errorf("schema version %d is newer than this program's %d: run a newer panda", applied, len(ms))
	}
	return ms[applied:], nil
}
