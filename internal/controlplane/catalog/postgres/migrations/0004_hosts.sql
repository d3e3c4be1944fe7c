-- Host agents registered with the control plane (panda agent --server).
-- token is the agent's own host API token: the control plane's credential
-- for that host. capacity is a JSON object (catalog.HostCapacity).
CREATE TABLE hosts (
	id            text COLLATE "C" PRIMARY KEY CHECK (id <> ''),
	url           text NOT NULL,
	token         text NOT NULL,
	ca_cert       text NOT NULL,
	state         text NOT NULL,
	draining      boolean NOT NULL,
	capacity      text NOT NULL,
	registered_at timestamptz NOT NULL,
	heartbeat_at  timestamptz
);
