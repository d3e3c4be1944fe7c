-- A sandbox's egress policy, a JSON object; sandboxes made before networks
-- existed are online by default.
ALTER TABLE sandboxes ADD COLUMN network TEXT NOT NULL DEFAULT '{"internet":true,"allow_out":[],"deny_out":[]}';
