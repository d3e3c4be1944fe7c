#!/bin/busybox sh
# /init of the PandaStack initramfs: load the virtio modules, mount the root
# filesystem from virtio-blk, put the guest agent on a tmpfs in the new root
# and hand PID 1 to it. Any failure powers the machine off (panic=-1 reboots
# and QEMU runs with -no-reboot), so the host sees a dead VMM, not a hang.
B=/bin/busybox
fail() {
	echo "panda-init: $*" >/dev/console
	$B sleep 1
	$B reboot -f
}
$B mount -t proc proc /proc
$B mount -t sysfs sysfs /sys
$B mount -t devtmpfs devtmpfs /dev
for m in $($B cat /lib/modules/order); do
	$B insmod /lib/modules/$m.ko || fail "insmod $m failed"
done
i=0
while [ ! -b /dev/vda ]; do
	i=$((i + 1))
	[ $i -gt 500 ] && fail "no /dev/vda after 5s"
	$B usleep 10000
done
$B mount -t ext4 -o rw,noatime /dev/vda /newroot || fail "cannot mount /dev/vda"
$B mkdir -p /newroot/run /newroot/dev /newroot/proc /newroot/sys /newroot/tmp
$B mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /newroot/run
$B cp /panda-guest /newroot/run/panda-guest || fail "cannot install the guest agent"
$B mount --move /dev /newroot/dev
$B umount /sys
$B umount /proc
exec $B switch_root /newroot /run/panda-guest
