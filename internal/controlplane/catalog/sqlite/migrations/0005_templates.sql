-- The registry of a fleet's user templates (panda server --fleet): one row
-- a name. doc is a JSON object (public flag, last version number given
-- out, the versions built with their descriptions, the builds running):
-- see catalog.Template. A deleted template's row stays, without versions or
-- builds, for its last version number: numbers are never given out twice.
CREATE TABLE templates (
	name       TEXT PRIMARY KEY CHECK (name <> ''),
	owner      TEXT NOT NULL,
	doc        TEXT NOT NULL,
	created_at TEXT NOT NULL
) STRICT;
CREATE INDEX templates_owner ON templates (owner);
