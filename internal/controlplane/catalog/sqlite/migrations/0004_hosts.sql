-- Host agents registered with the control plane (panda agent --server).
-- token is the agent's own host API token: the control plane's credential
-- for that host. capacity is a JSON object (catalog.HostCapacity).
CREATE TABLE hosts (
	id            TEXT PRIMARY KEY CHECK (id <> ''),
	url           TEXT NOT NULL,
	token         TEXT NOT NULL,
	ca_cert       TEXT NOT NULL,
	state         TEXT NOT NULL,
	draining      INTEGER NOT NULL,
	capacity      TEXT NOT NULL,
	registered_at TEXT NOT NULL,
	heartbeat_at  TEXT
) STRICT;
