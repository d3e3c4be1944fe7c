#!/bin/busybox sh
# /init of the PandaStack initramfs: load the virtio modules, mount the root
# filesystem from virtio-blk, configure the network, put the guest agent on
# a tmpfs in the new root and hand PID 1 to it. Any failure powers the
# machine off (panic=-1 reboots and QEMU runs with -no-reboot), so the host
# sees a dead VMM, not a hang.
#
# The network is the same in every guest and is baked into every template
# (a restore or a fork runs none of this again): eth0 is GUEST_IP, its
# default route and DNS server are the gateway, whose MAC is fixed too (a
# permanent neighbour entry: a restored guest never ARPs for it, so the
# host side of every sandbox's TAP must carry GATEWAY_MAC and GATEWAY).
# internal/hostagent/internal/guestnet holds the same values for the host; a test checks that
# they agree.
B=/bin/busybox
GUEST_IP=100.96.0.2
PREFIX_LEN=30
GATEWAY=100.96.0.1
GATEWAY_MAC=52:54:00:70:6e:01
DNS=100.96.0.1
fail() {
	echo "panda-init: $*" >/dev/console
	$B sleep 1
	$B reboot -f
}
$B mount -t proc proc /proc
$B mount -t sysfs sysfs /sys
$B mount -t devtmpfs devtmpfs /dev
# The modules include fuse (volumes): devtmpfs, moved to the new root
# below, then holds /dev/fuse.
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

# network configures lo and eth0. A guest without a NIC (a VMM started
# without one) boots anyway, with loopback only, and says so.
network() {
	$B ip link set lo up || fail "cannot bring up lo"
	# virtio_net registers eth0 while insmod runs; wait briefly in case
	# the device shows up late.
	i=0
	while [ ! -e /sys/class/net/eth0 ]; do
		i=$((i + 1))
		if [ $i -gt 100 ]; then
			echo "panda-init: no network interface (eth0): booting without a network" >/dev/console
			return 0
		fi
		$B usleep 10000
	done
	# IPv4 only: no IPv6 link-local address, router solicitations or
	# duplicate address detection on eth0 (lo keeps ::1).
	[ ! -e /proc/sys/net/ipv6/conf/eth0/disable_ipv6 ] || echo 1 >/proc/sys/net/ipv6/conf/eth0/disable_ipv6
	$B ip addr add $GUEST_IP/$PREFIX_LEN dev eth0 || fail "cannot address eth0"
	$B ip link set eth0 up || fail "cannot bring up eth0"
	$B arp -i eth0 -s $GATEWAY $GATEWAY_MAC || fail "cannot set the gateway's MAC"
	$B ip route add default via $GATEWAY dev eth0 || fail "cannot add the default route"
}
network

# Name resolution in the new root, whatever root filesystem it is: the
# gateway is the DNS server; /etc/hosts names localhost; a glibc without
# /etc/nsswitch.conf would ask DNS before /etc/hosts. resolv.conf may be a
# symlink (resolvconf, systemd-resolved) into a /run that is empty here.
$B mkdir -p /newroot/etc
$B rm -f /newroot/etc/resolv.conf
echo "nameserver $DNS" >/newroot/etc/resolv.conf || fail "cannot write /etc/resolv.conf"
if ! $B grep -qs '^127\.0\.0\.1[[:space:]].*localhost' /newroot/etc/hosts; then
	$B rm -f /newroot/etc/hosts
	printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >/newroot/etc/hosts || fail "cannot write /etc/hosts"
fi
if [ ! -e /newroot/etc/nsswitch.conf ]; then
	printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n' >/newroot/etc/nsswitch.conf
fi
$B mkdir -p /newroot/run /newroot/dev /newroot/proc /newroot/sys /newroot/tmp
$B mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs /newroot/run
$B cp /panda-guest /newroot/run/panda-guest || fail "cannot install the guest agent"
$B mount --move /dev /newroot/dev
$B umount /sys
$B umount /proc
exec $B switch_root /newroot /run/panda-guest
