-- Volumes: a key's persistent directory trees, each stored on one host
-- (host_id, its home). Names are unique per key. parent_id is the volume
-- a branch was cloned from ('' if none).
CREATE TABLE volumes (
	id         text COLLATE "C" PRIMARY KEY CHECK (id <> ''),
	key_id     text COLLATE "C" NOT NULL REFERENCES keys (id),
	name       text COLLATE "C" NOT NULL CHECK (name <> ''),
	host_id    text NOT NULL,
	size_mib   integer NOT NULL,
	used_bytes bigint NOT NULL,
	parent_id  text NOT NULL,
	created_at timestamptz NOT NULL,
	UNIQUE (key_id, name)
);
CREATE INDEX volumes_key ON volumes (key_id, created_at, id);

-- The volumes a sandbox mounts: a JSON array of {volume_id, path,
-- read_only}.
ALTER TABLE sandboxes ADD COLUMN volumes text NOT NULL DEFAULT '[]';
