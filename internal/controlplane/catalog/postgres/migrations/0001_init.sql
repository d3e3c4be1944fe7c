-- Ids sort bytewise (COLLATE "C"), as in SQLite, whatever the database's
-- locale: listings break ties on created_at by id.

CREATE TABLE keys (
	id             text COLLATE "C" PRIMARY KEY CHECK (id <> ''),
	name           text NOT NULL,
	hash           text NOT NULL UNIQUE CHECK (hash <> ''),
	prefix         text NOT NULL,
	admin          boolean NOT NULL,
	max_sandboxes  integer NOT NULL,
	max_memory_mib integer NOT NULL,
	created_at     timestamptz NOT NULL,
	revoked_at     timestamptz
);

CREATE INDEX keys_created ON keys (created_at, id);

CREATE TABLE sandboxes (
	id          text COLLATE "C" PRIMARY KEY CHECK (id <> ''),
	key_id      text COLLATE "C" NOT NULL REFERENCES keys (id),
	template    text NOT NULL,
	host_id     text NOT NULL,
	state       text NOT NULL,
	stop_reason text NOT NULL,
	memory_mib  integer NOT NULL,
	vcpus       integer NOT NULL,
	metadata    jsonb NOT NULL CHECK (jsonb_typeof(metadata) = 'object'),
	env         jsonb NOT NULL CHECK (jsonb_typeof(env) = 'object'),
	ttl_seconds integer NOT NULL,
	on_expire   text NOT NULL,
	parent_id   text NOT NULL,
	snapshot_id text NOT NULL,
	created_at  timestamptz NOT NULL,
	updated_at  timestamptz,
	expires_at  timestamptz,
	stopped_at  timestamptz
);

-- Quota checks and per-key listing.
CREATE INDEX sandboxes_key_state ON sandboxes (key_id, state);
CREATE INDEX sandboxes_created ON sandboxes (created_at, id);
-- Metadata filters (metadata @> '{"k": "v"}').
CREATE INDEX sandboxes_metadata ON sandboxes USING gin (metadata jsonb_path_ops);
-- Due and PurgeStopped.
CREATE INDEX sandboxes_expires ON sandboxes (expires_at) WHERE state <> 'stopped' AND expires_at IS NOT NULL;
CREATE INDEX sandboxes_stopped ON sandboxes (stopped_at) WHERE state = 'stopped';

CREATE TABLE snapshots (
	id         text COLLATE "C" PRIMARY KEY CHECK (id <> ''),
	key_id     text COLLATE "C" NOT NULL REFERENCES keys (id),
	sandbox_id text NOT NULL,
	name       text NOT NULL,
	host_id    text NOT NULL,
	template   text NOT NULL,
	memory_mib integer NOT NULL,
	vcpus      integer NOT NULL,
	size_bytes bigint NOT NULL,
	created_at timestamptz NOT NULL
);

CREATE INDEX snapshots_key ON snapshots (key_id, created_at, id);
