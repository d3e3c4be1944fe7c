package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pandastack/pandastack/internal/catalog"
)

// User templates: one row a name; what changes is the doc column.

const templateCols = "name, owner, doc, created_at"

// templateDoc is a template's doc column.
type templateDoc struct {
	Public      bool                      `json:"public,omitempty"`
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
		t.Public, t.LastVersion, t.Versions, t.Builds = d.Public, d.LastVersion, d.Versions, d.Builds
	}
	return t, err
}

func encTemplateDoc(t catalog.Template) (string, error) {
	t = normalizeTemplate(t)
	b, err := json.Marshal(templateDoc{Public: t.Public, LastVersion: t.LastVersion, Versions: t.Versions, Builds: t.Builds})
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

func (s *Store) CreateTemplate(ctx context.Context, t catalog.Template, maxPerOwner int) error {
	if len(t.Versions) == 0 && len(t.Builds) == 0 {
		return fmt.Errorf("create template %s: it has neither a version nor a build", t.Name)
	}
	doc, err := encTemplateDoc(t)
	if err != nil {
		return err
	}
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		if maxPerOwner > 0 {
			// The owner's key row serializes its creates (PostgreSQL;
			// SQLite's writer holds the only write lock already).
			var id string
			err := tx.QueryRowContext(ctx, s.d.bind(`SELECT id FROM keys WHERE id = ?`+s.d.LockRow), t.Owner).Scan(&id)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return err
			}
			var n int
			if err := tx.QueryRowContext(ctx, s.d.bind(`SELECT count(*) FROM templates WHERE owner = ?`), t.Owner).Scan(&n); err != nil {
				return err
			}
			if n >= maxPerOwner {
				return fmt.Errorf("%w: the key owns %d templates, its limit", catalog.ErrQuota, n)
			}
		}
		_, err := tx.ExecContext(ctx, s.d.bind(`INSERT INTO templates (`+templateCols+`) VALUES (?, ?, ?, ?)`),
			t.Name, t.Owner, doc, s.timeArg(t.CreatedAt))
		return s.d.Classify(err)
	})
	if err != nil {
		return fmt.Errorf("create template %s: %w", t.Name, err)
	}
	return nil
}

func (s *Store) GetTemplate(ctx context.Context, name string) (catalog.Template, error) {
	return get(ctx, s, "get template "+name, scanTemplate, `SELECT `+templateCols+` FROM templates WHERE name = ?`, name)
}

func (s *Store) ListTemplates(ctx context.Context) ([]catalog.Template, error) {
	return list(ctx, s, "list templates", scanTemplate, `SELECT `+templateCols+` FROM templates ORDER BY name`)
}

func (s *Store) UpdateTemplate(ctx context.Context, name string, fn func(*catalog.Template) error) (catalog.Template, error) {
	var t catalog.Template
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		var err error
		t, err = scanTemplate(tx.QueryRowContext(ctx, s.d.bind(`SELECT `+templateCols+` FROM templates WHERE name = ?`+s.d.LockRow), name))
		if err != nil {
			return notFound(err)
		}
		owner := t.Owner
		if err := fn(&t); err != nil {
			return fnError{err}
		}
		if t.Name != name || t.Owner != owner {
			return fmt.Errorf("fn changed the name or the owner")
		}
		if len(t.Versions) == 0 && len(t.Builds) == 0 {
			_, err := tx.ExecContext(ctx, s.d.bind(`DELETE FROM templates WHERE name = ?`), name)
			return s.d.Classify(err)
		}
		doc, err := encTemplateDoc(t)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, s.d.bind(`UPDATE templates SET doc = ? WHERE name = ?`), doc, name)
		return s.d.Classify(err)
	})
	if err != nil {
		var fe fnError
		if errors.As(err, &fe) {
			return catalog.Template{}, fe.err
		}
		return catalog.Template{}, fmt.Errorf("update template %s: %w", name, err)
	}
	return normalizeTemplate(t), nil
}
