-- Times are UTC text, 2006-01-02T15:04:05.000000Z: fixed width, so text
-- order is time order. Maps are JSON objects of strings.

CREATE TABLE keys (
	id             TEXT PRIMARY KEY CHECK (id <> ''),
	name           TEXT NOT NULL,
	hash           TEXT NOT NULL UNIQUE CHECK (hash <> ''),
	prefix         TEXT NOT NULL,
	admin          INTEGER NOT NULL,
	max_sandboxes  INTEGER NOT NULL,
	max_memory_mib INTEGER NOT NULL,
	created_at     TEXT NOT NULL,
	revoked_at     TEXT
) STRICT;

CREATE INDEX keys_created ON keys (created_at, id);

CREATE TABLE sandboxes (
	id          TEXT PRIMARY KEY CHECK (id <> ''),
	key_id      TEXT NOT NULL REFERENCES keys (id),
	template    TEXT NOT NULL,
	host_id     TEXT NOT NULL,
	state       TEXT NOT NULL,
	stop_reason TEXT NOT NULL,
	memory_mib  INTEGER NOT NULL,
	vcpus       INTEGER NOT NULL,
	metadata    TEXT NOT NULL CHECK (json_type(metadata) = 'object'),
	env         TEXT NOT NULL CHECK (json_type(env) = 'object'),
	ttl_seconds INTEGER NOT NULL,
	on_expire   TEXT NOT NULL,
	parent_id   TEXT NOT NULL,
	snapshot_id TEXT NOT NULL,
	created_at  TEXT NOT NULL,
	updated_at  TEXT,
	expires_at  TEXT,
	stopped_at  TEXT
) STRICT;

-- Quota checks and per-key listing.
CREATE INDEX sandboxes_key_state ON sandboxes (key_id, state);
CREATE INDEX sandboxes_created ON sandboxes (created_at, id);
-- Due and PurgeStopped.
CREATE INDEX sandboxes_expires ON sandboxes (expires_at) WHERE state <> 'stopped' AND expires_at IS NOT NULL;
CREATE INDEX sandboxes_stopped ON sandboxes (stopped_at) WHERE state = 'stopped';

CREATE TABLE snapshots (
	id         TEXT PRIMARY KEY CHECK (id <> ''),
	key_id     TEXT NOT NULL REFERENCES keys (id),
	sandbox_id TEXT NOT NULL,
	name       TEXT NOT NULL,
	host_id    TEXT NOT NULL,
	template   TEXT NOT NULL,
	memory_mib INTEGER NOT NULL,
	vcpus      INTEGER NOT NULL,
	size_bytes INTEGER NOT NULL,
	created_at TEXT NOT NULL
) STRICT;

CREATE INDEX snapshots_key ON snapshots (key_id, created_at, id);
