#!/bin/bash
# setup.sh prepares a Debian 12 host for PandaStack: it installs the host
# packages that are missing and builds the guest images (kernel, initramfs,
# root filesystems) into $IMAGES. Every step is idempotent and skipped when its
# output is already up to date, so `make setup` is fast the second time.
#
# Usage: scripts/setup.sh deps|kernel|initramfs AGENT|rootfs base|tiny|all AGENT
# Environment: IMAGES (default /var/lib/pandastack/images).
#
# Nothing is downloaded except Debian packages through apt.
set -euo pipefail

IMAGES=${IMAGES:-/var/lib/pandastack/images}
HOST_PACKAGES=(qemu-system-x86 qemu-utils xfsprogs e2fsprogs mmdebstrap busybox-static cpio kmod util-linux python3 postgresql)
KERNEL_PACKAGE=linux-image-cloud-amd64
# Modules the guest needs (the cloud kernel builds them as modules); their
# dependencies are added and ordered by the kernel step.
GUEST_MODULES=(virtio virtio_ring virtio_mmio virtio_blk virtio_console)
BASE_PACKAGES=python3,git,curl,ca-certificates,procps,iproute2,less,xz-utils
ROOTFS_BASE_MIB=${ROOTFS_BASE_MIB:-4096}
ROOTFS_TINY_MIB=${ROOTFS_TINY_MIB:-2048}

step_start=0
step() { step_start=${EPOCHREALTIME/./}; printf '==> %s\n' "$*"; }
done_step() { local us=$((${EPOCHREALTIME/./} - step_start)); printf '    done in %d.%01ds\n' $((us / 1000000)) $((us % 1000000 / 100000)); }
die() { printf 'setup: %s\n' "$*" >&2; exit 1; }
CLEANUP=()
cleanup() { [ ${#CLEANUP[@]} -eq 0 ] || rm -rf "${CLEANUP[@]}"; }
trap cleanup EXIT
need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (run as root or with sudo)"; }

# deps installs the Debian packages that are missing. apt-get update runs only
# when something has to be installed.
deps() {
	local missing=() p
	for p in "${HOST_PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	if [ ${#missing[@]} -eq 0 ]; then
		echo "==> host packages: all present"
		return
	fi
	need_root "installing ${missing[*]}"
	step "installing host packages: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q
	apt-get install -y -q --no-install-recommends "${missing[@]}"
	done_step
}

# kernel_package prints the versioned image package that the meta package points at.
kernel_package() {
	apt-cache depends "$KERNEL_PACKAGE" 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}'
}

# kernel extracts vmlinuz and the virtio modules from Debian's cloud kernel.
kernel() {
	local pkg ver
	pkg=$(kernel_package)
	[ -n "$pkg" ] || { apt-get update -q >/dev/null; pkg=$(kernel_package); }
	[ -n "$pkg" ] || die "cannot resolve $KERNEL_PACKAGE: is apt configured for Debian bookworm?"
	ver=$(apt-cache policy "$pkg" | awk '/Candidate:/{print $2}')
	if [ -f "$IMAGES/kernel/stamp" ] && [ "$(cat "$IMAGES/kernel/stamp")" = "$pkg $ver" ]; then
		echo "==> kernel: $pkg $ver present"
		return
	fi
	step "extracting guest kernel from $pkg $ver"
	local tmp
	tmp=$(mktemp -d)
	CLEANUP+=("$tmp")
	(cd "$tmp" && apt-get download -q "$pkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
	ls "$tmp"/*.deb >/dev/null 2>&1 || die "apt-get download $pkg failed"
	dpkg-deb -x "$tmp"/*.deb "$tmp/x"
	rm -rf "$IMAGES/kernel.new"
	mkdir -p "$IMAGES/kernel.new/modules"
	cp "$tmp"/x/boot/vmlinuz-* "$IMAGES/kernel.new/vmlinuz"
	# Copy each module with its dependencies, recording a load order in
	# which every module follows what it depends on.
	local order=()
	add_module() {
		local m=$1 f d
		case " ${order[*]} " in *" $m "*) return ;; esac
		f=$(find "$tmp/x/lib/modules" -name "$m.ko*" | head -n1)
		[ -n "$f" ] || die "module $m not found in $pkg"
		case "$f" in
		*.ko.xz) xz -dc "$f" >"$IMAGES/kernel.new/modules/$m.ko" ;;
		*.ko.zst) zstd -qdc "$f" >"$IMAGES/kernel.new/modules/$m.ko" ;;
		*) cp "$f" "$IMAGES/kernel.new/modules/$m.ko" ;;
		esac
		for d in $(modinfo -F depends "$IMAGES/kernel.new/modules/$m.ko" | tr ',' ' '); do
			add_module "${d//-/_}"
		done
		order+=("$m")
	}
	local m
	for m in "${GUEST_MODULES[@]}"; do
		add_module "$m"
	done
	printf '%s\n' "${order[@]}" >"$IMAGES/kernel.new/modules/order"
	echo "$pkg $ver" >"$IMAGES/kernel.new/stamp"
	rm -rf "$IMAGES/kernel"
	mv "$IMAGES/kernel.new" "$IMAGES/kernel"
	done_step
}

# initramfs packs busybox, the modules, the guest agent and the init script.
initramfs() {
	local agent=$1 out="$IMAGES/initramfs.img"
	[ -x "$agent" ] || die "guest agent $agent not built"
	local inputs
	inputs=$(cat "$agent" "$IMAGES/kernel/stamp" "$IMAGES/kernel/modules/order" "$(dirname "$0")/guest-init.sh" /bin/busybox | sha256sum | cut -d' ' -f1)
	if [ -f "$out" ] && [ -f "$out.stamp" ] && [ "$(cat "$out.stamp")" = "$inputs" ]; then
		echo "==> initramfs: up to date"
		return
	fi
	step "building initramfs"
	local tmp
	tmp=$(mktemp -d)
	CLEANUP+=("$tmp")
	mkdir -p "$tmp"/{bin,dev,proc,sys,newroot,lib/modules}
	cp /bin/busybox "$tmp/bin/busybox"
	cp "$IMAGES"/kernel/modules/*.ko "$IMAGES/kernel/modules/order" "$tmp/lib/modules/"
	cp "$(dirname "$0")/guest-init.sh" "$tmp/init"
	chmod 0755 "$tmp/init"
	cp "$agent" "$tmp/panda-guest"
	# Uncompressed: unpacking gzip under TCG costs more than reading 10 MB.
	(cd "$tmp" && find . -print0 | cpio --null -o -H newc --quiet) >"$out.new"
	mv "$out.new" "$out"
	echo "$inputs" >"$out.stamp"
	done_step
}

# rootfs builds an ext4 image from a directory tree without mounting anything.
rootfs() {
	local name=$1 out="$IMAGES/rootfs-$1.ext4"
	# The recipe: what the image is built from. A change rebuilds it.
	local recipe
	case "$name" in
	base) recipe="base ${ROOTFS_BASE_MIB}MiB $BASE_PACKAGES" ;;
	tiny) recipe="tiny ${ROOTFS_TINY_MIB}MiB $(/bin/busybox --help 2>&1 | head -n1)" ;;
	*) die "unknown rootfs $name (want base or tiny)" ;;
	esac
	if [ -f "$out" ] && [ -f "$out.stamp" ] && [ "$(head -n1 "$out.stamp")" = "$recipe" ]; then
		echo "==> rootfs $name: up to date ($(tail -n1 "$out.stamp"))"
		return
	fi
	need_root "building the $name root filesystem"
	local tmp
	tmp=$(mktemp -d "$IMAGES/.rootfs-$name.XXXXXX")
	CLEANUP+=("$tmp")
	local size
	case "$name" in
	base)
		step "building rootfs base: Debian 12 minbase + $BASE_PACKAGES (about a minute)"
		local sources=/etc/apt/sources.list.d/debian.sources
		[ -f "$sources" ] || sources=/etc/apt/sources.list
		mmdebstrap --variant=minbase --include="$BASE_PACKAGES" \
			--dpkgopt='path-exclude=/usr/share/doc/*' \
			--dpkgopt='path-exclude=/usr/share/man/*' \
			--dpkgopt='path-exclude=/usr/share/locale/*' \
			--dpkgopt='path-include=/usr/share/locale/locale.alias' \
			--customize-hook='echo "127.0.0.1 localhost" > "$1/etc/hosts"' \
			--customize-hook='rm -f "$1/etc/machine-id" "$1/etc/hostname"' \
			bookworm "$tmp/root" "$sources" </dev/null
		size=$ROOTFS_BASE_MIB
		;;
	tiny)
		step "building rootfs tiny: busybox"
		mkdir -p "$tmp/root"/{bin,sbin,etc,proc,sys,dev,run,tmp,root,usr/bin,usr/sbin}
		chmod 1777 "$tmp/root/tmp"
		cp /bin/busybox "$tmp/root/bin/busybox"
		local applet
		for applet in $(/bin/busybox --list); do
			[ "$applet" = busybox ] || ln -sf busybox "$tmp/root/bin/$applet"
		done
		echo "root:x:0:0:root:/root:/bin/sh" >"$tmp/root/etc/passwd"
		echo "root:x:0:" >"$tmp/root/etc/group"
		echo "127.0.0.1 localhost" >"$tmp/root/etc/hosts"
		size=$ROOTFS_TINY_MIB
		;;
	*) die "unknown rootfs $name (want base or tiny)" ;;
	esac
	mkdir -p "$tmp/root/run" "$tmp/root/tmp" "$tmp/root/work"
	rm -f "$out.new"
	truncate -s "${size}M" "$out.new"
	mkfs.ext4 -q -F -L "rootfs-$name" -E lazy_itable_init=1,lazy_journal_init=1 -d "$tmp/root" "$out.new"
	mv "$out.new" "$out"
	printf '%s\nbuilt %s\n' "$recipe" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$out.stamp"
	done_step
}

main() {
	mkdir -p "$IMAGES"
	case "${1:-}" in
	deps) deps ;;
	kernel) kernel ;;
	initramfs) initramfs "${2:?agent path}" ;;
	rootfs) rootfs "${2:?base or tiny}" ;;
	all)
		deps
		kernel
		initramfs "${2:?agent path}"
		rootfs tiny
		rootfs base
		;;
	*) die "usage: $0 deps|kernel|initramfs AGENT|rootfs base|tiny|all AGENT" ;;
	esac
}

main "$@"
