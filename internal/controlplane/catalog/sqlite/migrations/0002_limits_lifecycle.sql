-- vCPU and disk quotas per key; per sandbox its disk size, the bytes its
-- pause capture holds, and the message of its last failed operation.
ALTER TABLE keys ADD COLUMN max_vcpus INTEGER NOT NULL DEFAULT 0;
ALTER TABLE keys ADD COLUMN max_disk_mib INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN last_error TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN disk_mib INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN paused_bytes INTEGER NOT NULL DEFAULT 0;
