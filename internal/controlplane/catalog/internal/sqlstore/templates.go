package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// User templates: one row a name; what changes is the doc column.

const templateCols = "name, owner, doc, created_at"

// templateDoc is a template's doc column.
type templateDoc struct {
	// Public is the flag of docs written before versions were published
	// one by one (every version, later ones too): read as the latest
	// version published, never written.
	Public      bool                      `json:"public,omitempty"`
	Published   []int                     `json:"published,omitempty"`
	LastVersion int                       `json:"last_version"`
	Versions    []catalog.TemplateVersion `json:"versions,omitempty"`
	Builds      []catalog.TemplateBuild   `json:"builds,omitempty"`
}

func scanTemplate(row scanner) (catalog.Template, error) {
	var t catalog.Template
	var doc string
	err := row.Scan(&t.Name, &t.Owner, &doc, timeDest{&t.CreatedAt})
	if err == nil {
		var d templateDoc
		if jerr := json.Unmarshal([]byte(doc), &d); jerr != nil {
			return t, fmt.Errorf("decode template %s: %w", t.Name, jerr)
		}
		t.Published, t.LastVersion, t.Versions, t.Builds = d.Published, d.LastVersion, d.Versions, d.Builds
		if l, ok := t.Latest(); d.Public && ok && !t.IsPublished(l.Version) {
			// The version that was the latest when versions came to be
			// published one by one: a write (a build recorded, a
			// publish) keeps it so, whatever is built after it.
			t.Published = append(t.Published, l.Version)
		}
		t = normalizeTemplate(t)
	}
	return t, err
}

func encTemplateDoc(t catalog.Template) (string, error) {
	t = normalizeTemplate(t)
	b, err := json.Marshal(templateDoc{Published: t.Published, LastVersion: t.LastVersion, Versions: t.Versions, Builds: t.Builds})
	if err != nil {
		return "", fmt.Errorf("encode template %s: %w", t.Name, err)
	}
	return string(b), nil
}

// normalizeTemplate makes t what reading it back would return.
func normalizeTemplate(t catalog.Template) catalog.Template {
	t.CreatedAt = t.CreatedAt.UTC().Truncate(time.Microsecond)
	if len(t.Versions) == 0 {
		t.Versions = nil
	}
	// Published: ascending, once each, versions of Versions only.
	var pub []int
	for _, v := range t.Versions {
		if slices.Contains(t.Published, v.Version) && !slices.Contains(pub, v.Version) {
			pub = append(pub, v.Version)
		}
	}
	slices.Sort(pub)
	t.Published = pub
	if len(t.Builds) == 0 {
		t.Builds = nil
	} else {
		t.Builds = slices.Clone(t.Builds)
		for i := range t.Builds {
			t.Builds[i].CreatedAt = t.Builds[i].CreatedAt.UTC().Truncate(time.Microsecond)
		}
	}
	return t
}

func (s *Store) ReserveTemplateBuild(ctx context.Context, name string, b catalog.TemplateBuild, maxPerOwner int) (catalog.Template, error) {
	var t catalog.Template
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		t, err = scanTemplate(tx.QueryRowContext(ctx, s.d.bind(`SELECT `+templateCols+` FROM templates WHERE name = ?`+s.d.LockRow), name))
		row := err == nil
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if !t.Exists() {
			if maxPerOwner > 0 {
				if err := s.checkTemplates(ctx, tx, b.Owner, maxPerOwner); err != nil {
					return err
				}
			}
			t = catalog.Template{Name: name, Owner: b.Owner, LastVersion: t.LastVersion, CreatedAt: b.CreatedAt}
		} else if len(t.Versions) == 0 {
			for _, o := range t.Builds {
				if o.Owner != b.Owner {
					return fmt.Errorf("%w: the name %s is taken: another key is building it", catalog.ErrConflict, name)
				}
			}
		}
		t.LastVersion++
		b.Version = t.LastVersion
		t.Builds = append(t.Builds, b)
		doc, err := encTemplateDoc(t)
		if err != nil {
			return err
		}
		if row {
			_, err = tx.ExecContext(ctx, s.d.bind(`UPDATE templates SET owner = ?, doc = ?, created_at = ? WHERE name = ?`),
				t.Owner, doc, s.timeArg(t.CreatedAt), name)
		} else {
			_, err = tx.ExecContext(ctx, s.d.bind(`INSERT INTO templates (`+templateCols+`) VALUES (?, ?, ?, ?)`),
				name, t.Owner, doc, s.timeArg(t.CreatedAt))
		}
		return s.d.Classify(err)
	})
	if err != nil {
		return catalog.Template{}, fmt.Errorf("reserve a build of template %s: %w", name, err)
	}
	return normalizeTemplate(t), nil
}

// checkTemplates refuses a new template of owner's if it owns max
// already (ErrQuota).
func (s *Store) checkTemplates(ctx context.Context, tx *sql.Tx, owner string, max int) error {
	// The owner's key row serializes its reservations (PostgreSQL;
	// SQLite's writer holds the only write lock already).
	var id string
	err := tx.QueryRowContext(ctx, s.d.bind(`SELECT id FROM keys WHERE id = ?`+s.d.LockRow), owner).Scan(&id)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	rows, err := tx.QueryContext(ctx, s.d.bind(`SELECT `+templateCols+` FROM templates WHERE owner = ?`), owner)
	if err != nil {
		return err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			return err
		}
		if t.Exists() {
			n++
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if n >= max {
		return fmt.Errorf("%w: the key owns %d templates, its limit", catalog.ErrQuota, n)
	}
	return nil
}

func (s *Store) ImportTemplate(ctx context.Context, t catalog.Template) error {
	if len(t.Versions) == 0 || len(t.Builds) > 0 {
		return fmt.Errorf("import template %s: it needs versions and no builds", t.Name)
	}
	for _, v := range t.Versions {
		if v.Version < 1 || v.Version > t.LastVersion {
			return fmt.Errorf("import template %s: version %d is not within 1..%d", t.Name, v.Version, t.LastVersion)
		}
	}
	doc, err := encTemplateDoc(t)
	if err != nil {
		return err
	}
	_, err = s.exec(ctx, "import template "+t.Name, `INSERT INTO templates (`+templateCols+`) VALUES (?, ?, ?, ?)`,
		t.Name, t.Owner, doc, s.timeArg(t.CreatedAt))
	return err
}

func (s *Store) GetTemplate(ctx context.Context, name string) (catalog.Template, error) {
	t, err := get(ctx, s, "get template "+name, scanTemplate, `SELECT `+templateCols+` FROM templates WHERE name = ?`, name)
	if err == nil && !t.Exists() {
		err = fmt.Errorf("get template %s: %w", name, catalog.ErrNotFound)
	}
	return t, err
}

func (s *Store) ListTemplates(ctx context.Context) ([]catalog.Template, error) {
	ts, err := s.ListTemplateRecords(ctx)
	return slices.DeleteFunc(ts, func(t catalog.Template) bool { return !t.Exists() }), err
}

func (s *Store) ListTemplateRecords(ctx context.Context) ([]catalog.Template, error) {
	return list(ctx, s, "list templates", scanTemplate, `SELECT `+templateCols+` FROM templates ORDER BY name`)
}

func (s *Store) UpdateTemplate(ctx context.Context, name string, fn func(*catalog.Template) error) (catalog.Template, error) {
	var t catalog.Template
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		t, err = scanTemplate(tx.QueryRowContext(ctx, s.d.bind(`SELECT `+templateCols+` FROM templates WHERE name = ?`+s.d.LockRow), name))
		if err == nil && !t.Exists() {
			err = sql.ErrNoRows
		}
		if err != nil {
			return notFound(err)
		}
		before := t
		if err := fn(&t); err != nil {
			return fnError{err}
		}
		if t.Name != name || t.Owner != before.Owner || t.LastVersion != before.LastVersion {
			return fmt.Errorf("fn changed the name, the owner or the last version")
		}
		// Left empty, the row keeps the name's last version number.
		doc, err := encTemplateDoc(t)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, s.d.bind(`UPDATE templates SET doc = ? WHERE name = ?`), doc, name)
		return s.d.Classify(err)
	})
	if err != nil {
		return catalog.Template{}, updateError(err, "update template "+name)
	}
	return normalizeTemplate(t), nil
}
