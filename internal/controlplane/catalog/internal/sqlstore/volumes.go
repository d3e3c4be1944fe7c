package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/pandastack/pandastack/internal/controlplane/catalog"
)

// Volumes.

func (s *Store) CreateVolumes(ctx context.Context, vs []catalog.Volume, lim catalog.Limits) error {
	if len(vs) == 0 {
		return nil
	}
	keyID := vs[0].KeyID
	req := catalog.Usage{Volumes: len(vs)}
	for _, v := range vs {
		if v.KeyID != keyID {
			return fmt.Errorf("create volumes: volumes of keys %s and %s in one call", keyID, v.KeyID)
		}
		req.DiskMiB += v.SizeMiB
	}
	err := s.withinQuota(ctx, keyID, req, lim, func(tx *sql.Tx) error {
		for _, v := range vs {
			if _, err := tx.ExecContext(ctx, s.d.bind(`INSERT INTO volumes (`+volumeCols+`) VALUES (`+params(volumeColumns)+`)`),
				s.volumeArgs(v)...); err != nil {
				return fmt.Errorf("volume %s (%s): %w", v.ID, v.Name, s.d.Classify(err))
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("create volumes: %w", err)
	}
	return nil
}

func (s *Store) GetVolume(ctx context.Context, id string) (catalog.Volume, error) {
	return get(ctx, s, "get volume "+id, scanVolume, `SELECT `+volumeCols+` FROM volumes WHERE id = ?`, id)
}

func (s *Store) VolumeByName(ctx context.Context, keyID, name string) (catalog.Volume, error) {
	return get(ctx, s, "get volume "+name, scanVolume, `SELECT `+volumeCols+` FROM volumes WHERE key_id = ? AND name = ?`, keyID, name)
}

func (s *Store) ListVolumes(ctx context.Context, keyID string) ([]catalog.Volume, error) {
	q, args := `SELECT `+volumeCols+` FROM volumes`, []any(nil)
	if keyID != "" {
		q, args = q+` WHERE key_id = ?`, append(args, keyID)
	}
	return list(ctx, s, "list volumes", scanVolume, q+` ORDER BY created_at, id`, args...)
}

func (s *Store) UpdateVolume(ctx context.Context, id string, lim catalog.Limits, fn func(*catalog.Volume) error) (catalog.Volume, error) {
	var v catalog.Volume
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		// The key's row is locked before the volume's, as every
		// reservation locks it first: a growth and a reservation of one
		// key are serialized, and locks are always taken in one order.
		var keyID string
		if err := tx.QueryRowContext(ctx, s.d.bind(`SELECT key_id FROM volumes WHERE id = ?`), id).Scan(&keyID); err != nil {
			return notFound(err)
		}
		revoked, err := s.lockKey(ctx, tx, keyID)
		if err != nil {
			return err
		}
		v, err = scanVolume(tx.QueryRowContext(ctx, s.d.bind(`SELECT `+volumeCols+` FROM volumes WHERE id = ?`+s.d.LockRow), id))
		if err != nil {
			return notFound(err)
		}
		old := v
		if err := fn(&v); err != nil {
			return fnError{err}
		}
		if v.ID != old.ID || v.KeyID != old.KeyID || v.Name != old.Name {
			return fmt.Errorf("fn changed the id, key or name of volume %s", id)
		}
		if v.SizeMiB > old.SizeMiB {
			if err := s.checkQuota(ctx, tx, keyID, revoked, catalog.Usage{DiskMiB: v.SizeMiB - old.SizeMiB}, lim); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, s.d.bind(`UPDATE volumes SET `+volumeSet+` WHERE id = ?`), append(s.volumeArgs(v)[1:], id)...); err != nil {
			return s.d.Classify(err)
		}
		return nil
	})
	if err != nil {
		return catalog.Volume{}, updateError(err, "update volume "+id)
	}
	v.CreatedAt = v.CreatedAt.UTC().Truncate(time.Microsecond)
	return v, nil
}

func (s *Store) DeleteVolume(ctx context.Context, id string) error {
	return s.changeOne(ctx, "delete volume "+id, `DELETE FROM volumes WHERE id = ?`, id)
}
