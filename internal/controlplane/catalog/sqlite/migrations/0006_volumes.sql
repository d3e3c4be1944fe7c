-- Volumes: a key's persistent directory trees, each stored on one host
-- (host_id, its home). Names are unique per key. parent_id is the volume
-- a branch was cloned from ('' if none).
CREATE TABLE volumes (
	id         TEXT PRIMARY KEY CHECK (id <> ''),
	key_id     TEXT NOT NULL REFERENCES keys (id),
	name       TEXT NOT NULL CHECK (name <> ''),
	host_id    TEXT NOT NULL,
	size_mib   INTEGER NOT NULL,
	used_bytes INTEGER NOT NULL,
	parent_id  TEXT NOT NULL,
	created_at TEXT NOT NULL,
	UNIQUE (key_id, name)
) STRICT;
CREATE INDEX volumes_key ON volumes (key_id, created_at, id);

-- The volumes a sandbox mounts: a JSON array of {volume_id, path,
-- read_only}.
ALTER TABLE sandboxes ADD COLUMN volumes TEXT NOT NULL DEFAULT '[]' CHECK (json_type(volumes) = 'array');
