-- vCPU and disk quotas per key; per sandbox its disk size, the bytes its
-- pause capture holds, and the message of its last failed operation.
ALTER TABLE keys ADD COLUMN max_vcpus integer NOT NULL DEFAULT 0;
ALTER TABLE keys ADD COLUMN max_disk_mib integer NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN last_error text NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN disk_mib integer NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN paused_bytes bigint NOT NULL DEFAULT 0;
