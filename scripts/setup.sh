#!/bin/bash
# setup.sh prepares a Debian 12 host for PandaStack: it installs the host
# packages that are missing and builds the guest images (kernel, guest agent,
# initramfs, root filesystems) into $IMAGES. Every step is idempotent and
# skipped when its output is already up to date, so `make setup` is fast the
# second time.
#
# Usage: scripts/setup.sh deps | kernel | agent AGENT | initramfs AGENT |
#        rootfs base|tiny|code-interpreter | images AGENT | all AGENT
# `images AGENT` is kernel, agent, initramfs and the root filesystems (what
# `make setup` runs after deps; scripts/setup_test.go runs it into an empty
# directory); `all` is deps and images.
# Environment: IMAGES (default /var/lib/pandastack/images); ROOTFS, the root
# filesystems `images` builds, in order (default "tiny base
# code-interpreter"; scripts/setup_test.go passes "tiny base": the code
# interpreter's is base's recipe with more packages and would only cost it
# time).
#
# Nothing is downloaded except Debian packages through apt.
#
# A fresh machine runs every step for the first time, and must pass every
# time; so:
#   - No pipe whose reader can stop before its writer (`| head`, `| grep -q`,
#     `awk '{...; exit}'`, ...): under pipefail the writer's SIGPIPE (status
#     141) fails the step, depending on timing. Output is captured into a
#     variable and parsed with shell expansions instead.
#   - Outputs are built in a temporary directory inside $IMAGES (same file
#     system, so the final rename is atomic) and renamed into place; an
#     output's stamp is removed before and written after that rename
#     (publish), so an interrupted run leaves a missing or stale output,
#     never one that looks up to date.
#   - One run at a time per images directory (flock); what an interrupted
#     run left behind is removed when the next one starts.
#   - apt waits for dpkg's lock and retries apt-get update, which a fresh
#     machine's apt-daily may be running at the same moment.
set -euo pipefail

IMAGES=${IMAGES:-/var/lib/pandastack/images}
# mkfs.ext4, modinfo and friends live in sbin, which `su` or sudo may leave
# out of PATH.
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin
SCRIPTS=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# xz-utils and zstd unpack kernel modules if the kernel package compresses them;
# iproute2 and git serve the networking tests (ip -n, a git HTTP server);
# chromium (headless) drives the web console in its browser test; curl and
# jq run the documentation's API examples (cmd/panda/docs_test.go), as
# they do for its readers;
HOST_PACKAGES=(qemu-system-x86 qemu-utils xfsprogs e2fsprogs mmdebstrap busybox-static cpio kmod util-linux xz-utils zstd python3 postgresql iproute2 git chromium curl jq)
# nodejs and npm run the official e2b SDK's suite (e2e/e2b, internal/controlplane/e2b).
# They are installed from Debian only when the commands are missing: a
# host may have another Node.js (NodeSource's bundles npm and conflicts
# with Debian's npm package).
NODE_PACKAGES=(nodejs npm)
KERNEL_PACKAGE=linux-image-cloud-amd64
# Modules the guest needs (the cloud kernel builds them as modules); their
# dependencies are added and ordered by the kernel step, which runs again
# when one is missing from an existing kernel directory. fuse carries the
# volumes (the guest agent mounts a FUSE file system per volume; loading
# it makes devtmpfs create /dev/fuse).
GUEST_MODULES=(virtio virtio_ring virtio_mmio virtio_blk virtio_console virtio_net fuse)
BASE_PACKAGES=python3,git,curl,ca-certificates,procps,iproute2,less,xz-utils
# The code-interpreter template's packages, on top of base's: the Jupyter
# kernel and the data stack its Python contexts import warm, and Node.js for
# its JavaScript contexts. Without recommends (mmdebstrap's default, made
# explicit). python3-munkres is the cheap alternative of python3-fonttools's
# dependency "python3-scipy | python3-munkres" (fonttools comes with
# matplotlib): without it apt takes scipy, and with it pythran, gcc and
# boost's headers (1.4 GB instead of about 1 GB).
# The code server itself is not in the image (internal/hostagent/template/
# codeinterp: the bake writes it into the guest).
CODE_PACKAGES=python3-ipykernel,python3-jupyter-client,python3-numpy,python3-pandas,python3-matplotlib,python3-munkres,nodejs
ROOTFS_BASE_MIB=${ROOTFS_BASE_MIB:-4096}
ROOTFS_CODE_MIB=${ROOTFS_CODE_MIB:-4096}
ROOTFS=${ROOTFS:-tiny base code-interpreter}
ROOTFS_TINY_MIB=${ROOTFS_TINY_MIB:-2048}
# apt-get waits up to 10 minutes for dpkg's lock instead of failing at once,
# and retries a failed download.
APT=(apt-get -o DPkg::Lock::Timeout=600 -o Acquire::Retries=3)

step_start=0
step() { step_start=${EPOCHREALTIME/./}; printf '==> %s\n' "$*"; }
done_step() { local us=$((${EPOCHREALTIME/./} - step_start)); printf '    done in %d.%01ds\n' $((us / 1000000)) $((us % 1000000 / 100000)); }
# up_to_date is what a skipped step prints; scripts/setup_test.go looks for it.
up_to_date() { printf '==> %s: up to date\n' "$*"; }
die() { printf 'setup: %s\n' "$*" >&2; exit 1; }
warn() { printf 'setup: warning: %s\n' "$*" >&2; }
need_root() { [ "$(id -u)" = 0 ] || die "$1 needs root (run as root or with sudo)"; }

# remove_tree removes a temporary directory, first unmounting whatever an
# interrupted mmdebstrap may have left mounted inside it (proc, sys, dev):
# rm -rf must never descend into the host's /dev.
remove_tree() {
	local dir=$1 mnt i mounts=()
	while read -r _ _ _ _ mnt _; do
		case "$mnt" in "$dir"/*) mounts+=("$mnt") ;; esac
	done </proc/self/mountinfo
	for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
		umount -l "${mounts[i]}" || true
	done
	rm -rf --one-file-system "$dir"
}

CLEANUP=()
cleanup() {
	local d
	for d in ${CLEANUP[@]+"${CLEANUP[@]}"}; do
		remove_tree "$d"
	done
}
trap cleanup EXIT
# A signal ends the script through exit, so the EXIT trap still cleans up.
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

# tmpdir makes a temporary directory in $IMAGES (removed on exit) and sets
# the variable named $1 to it.
tmpdir() {
	local d
	d=$(mktemp -d "$IMAGES/.tmp-$2.XXXXXX")
	CLEANUP+=("$d")
	printf -v "$1" '%s' "$d"
}

# lock takes the images directory's lock for the rest of the run and then
# removes what an interrupted run left: no other run can be using it.
lock() {
	mkdir -p "$IMAGES"
	exec 9>>"$IMAGES/.setup.lock"
	if ! flock -n 9; then
		echo "==> waiting for another setup.sh working on $IMAGES"
		flock 9
	fi
	local p
	# .rootfs-* and kernel.new are the temporary names of older versions.
	for p in "$IMAGES"/.tmp-* "$IMAGES"/.rootfs-* "$IMAGES"/kernel.new "$IMAGES"/*.new; do
		[ -e "$p" ] || [ -L "$p" ] || continue
		echo "==> removing $p (left by an interrupted run)"
		remove_tree "$p"
	done
}

# publish renames the complete file built at $1 to $2 and writes $3 as its
# stamp ($2.stamp). The old stamp is removed first: an interruption between
# the two renames leaves an output without a stamp (rebuilt next time), never
# a stamp vouching for other content. The file is synced before the rename
# so that a crash cannot publish a name whose data was never written.
publish() {
	local built=$1 out=$2 stamp=$3
	sync "$built"
	rm -f "$out.stamp"
	mv -fT "$built" "$out"
	printf '%s\n' "$stamp" >"$out.stamp.new"
	mv -fT "$out.stamp.new" "$out.stamp"
}

# apt_update refreshes the package lists. apt-get update does not wait for
# the lists lock (DPkg::Lock::Timeout covers dpkg's lock only), which a fresh
# machine's apt-daily may hold, and a mirror can be mid-sync; so it is tried
# three times.
apt_update() {
	local i
	for i in 1 2 3; do
		"${APT[@]}" update -q && return 0
		if [ "$i" -lt 3 ]; then
			echo "    apt-get update failed (attempt $i of 3); trying again in 15s" >&2
			sleep 15
		fi
	done
	die "apt-get update failed 3 times"
}

# deps installs the Debian packages that are missing. apt-get update runs only
# when something has to be installed.
deps() {
	local missing=() p status
	for p in "${HOST_PACKAGES[@]}"; do
		# "install ok installed", or "hold ok installed" for a held package.
		status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) || status=
		[[ $status == *" ok installed" ]] || missing+=("$p")
	done
	if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
		missing+=("${NODE_PACKAGES[@]}")
	fi
	if [ ${#missing[@]} -eq 0 ]; then
		up_to_date "host packages"
		return
	fi
	need_root "installing ${missing[*]}"
	step "installing host packages: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt_update
	"${APT[@]}" install -y -q --no-install-recommends "${missing[@]}"
	done_step
}

# kernel_package prints the versioned image package that the meta package
# points at, or nothing if apt does not know the meta package.
kernel_package() {
	local out line
	out=$(apt-cache depends "$KERNEL_PACKAGE" 2>/dev/null) || return 0
	while read -r line; do
		case "$line" in
		"Depends: linux-image-"*)
			printf '%s\n' "${line#Depends: }"
			return
			;;
		esac
	done <<<"$out"
}

# candidate prints the version apt would install of package $1, or nothing.
candidate() {
	local out line
	out=$(apt-cache policy "$1" 2>/dev/null) || return 0
	while read -r line; do
		case "$line" in
		"Candidate: (none)") return ;;
		"Candidate: "*)
			printf '%s\n' "${line#Candidate: }"
			return
			;;
		esac
	done <<<"$out"
}

# download fetches package $2 (name=version) into directory $1; apt's
# output goes to $1.log and is shown only if it fails.
download() {
	if (cd "$1" && "${APT[@]}" download -q "$2") >"$1.log" 2>&1; then
		return 0
	fi
	cat "$1.log" >&2
	return 1
}

# has_modules reports whether the module load order $1 has every one of
# GUEST_MODULES (a module added to the list re-extracts the kernel).
has_modules() {
	local lines m order
	mapfile -t lines <"$1"
	order=" ${lines[*]} "
	for m in "${GUEST_MODULES[@]}"; do
		[[ $order == *" $m "* ]] || return 1
	done
}

# kernel extracts vmlinuz and the virtio modules from Debian's cloud kernel.
kernel() {
	local pkg ver dir=$IMAGES/kernel
	pkg=$(kernel_package)
	[ -n "$pkg" ] || {
		apt_update >/dev/null
		pkg=$(kernel_package)
	}
	[ -n "$pkg" ] || die "cannot resolve $KERNEL_PACKAGE: is apt configured for Debian bookworm?"
	ver=$(candidate "$pkg")
	[ -n "$ver" ] || die "apt has no installable version of $pkg"
	if [ -f "$dir/stamp" ] && [ -f "$dir/vmlinuz" ] && [ -f "$dir/modules/order" ] &&
		[ "$(<"$dir/stamp")" = "$pkg $ver" ] && has_modules "$dir/modules/order"; then
		up_to_date "kernel ($pkg $ver)"
		return
	fi
	step "extracting guest kernel from $pkg $ver"
	local tmp
	tmpdir tmp kernel
	mkdir "$tmp/deb"
	if ! download "$tmp/deb" "$pkg=$ver"; then
		# Package lists older than the mirror name a version it no longer has.
		echo "    refreshing the package lists and trying again" >&2
		apt_update >/dev/null
		pkg=$(kernel_package)
		ver=$(candidate "$pkg")
		[ -n "$pkg" ] && [ -n "$ver" ] || die "cannot resolve $KERNEL_PACKAGE after apt-get update"
		download "$tmp/deb" "$pkg=$ver" || die "apt-get download $pkg=$ver failed"
	fi
	local debs=("$tmp"/deb/*.deb)
	[ ${#debs[@]} -eq 1 ] && [ -f "${debs[0]}" ] || die "apt-get download $pkg=$ver left no single .deb: ${debs[*]}"
	dpkg-deb -x "${debs[0]}" "$tmp/x"
	local new=$tmp/kernel
	mkdir -p "$new/modules"
	local vmlinuz=("$tmp"/x/boot/vmlinuz-*)
	[ -f "${vmlinuz[0]}" ] || die "no /boot/vmlinuz-* in $pkg"
	cp "${vmlinuz[0]}" "$new/vmlinuz"
	# Copy each module with its dependencies, recording a load order in
	# which every module follows what it depends on.
	local order=()
	add_module() {
		local m=$1 f d deps
		case " ${order[*]-} " in *" $m "*) return ;; esac
		f=$(find "$tmp/x/lib/modules" -name "$m.ko*" -print -quit)
		[ -n "$f" ] || die "module $m not found in $pkg"
		case "$f" in
		*.ko.xz) xz -dc "$f" >"$new/modules/$m.ko" ;;
		*.ko.zst) zstd -qdc "$f" >"$new/modules/$m.ko" ;;
		*) cp "$f" "$new/modules/$m.ko" ;;
		esac
		deps=$(modinfo -F depends "$new/modules/$m.ko")
		for d in ${deps//,/ }; do
			add_module "${d//-/_}"
		done
		order+=("$m")
	}
	local m
	for m in "${GUEST_MODULES[@]}"; do
		add_module "$m"
	done
	printf '%s\n' "${order[@]}" >"$new/modules/order"
	# The stamp is inside the directory, which is replaced as a whole.
	echo "$pkg $ver" >"$new/stamp"
	sync "$new/vmlinuz" "$new"/modules/* "$new/stamp"
	[ ! -e "$dir" ] || mv -T "$dir" "$tmp/old"
	mv -T "$new" "$dir"
	done_step
}

# agent installs the guest agent binary $1 as $IMAGES/panda-guest.
agent() {
	local src=$1 out="$IMAGES/panda-guest"
	[ -x "$src" ] || die "guest agent $src not built"
	if cmp -s "$src" "$out"; then
		up_to_date "guest agent"
		return
	fi
	step "installing the guest agent"
	local tmp
	tmpdir tmp agent
	install -m 0755 "$src" "$tmp/panda-guest"
	sync "$tmp/panda-guest"
	mv -fT "$tmp/panda-guest" "$out"
	done_step
}

# initramfs packs busybox, the modules, the guest agent and the init script.
initramfs() {
	local agent=$1 out="$IMAGES/initramfs.img" f
	[ -x "$agent" ] || die "guest agent $agent not built"
	for f in "$IMAGES/kernel/stamp" "$IMAGES/kernel/modules/order"; do
		[ -f "$f" ] || die "$f is missing: run $0 kernel first"
	done
	[ -x /bin/busybox ] || die "/bin/busybox is missing: run $0 deps first"
	local inputs
	# sha256sum reads to the end: this pipe cannot SIGPIPE.
	inputs=$(cat "$agent" "$IMAGES/kernel/stamp" "$IMAGES/kernel/modules/order" "$SCRIPTS/guest-init.sh" /bin/busybox | sha256sum)
	inputs=${inputs%% *}
	if [ -f "$out" ] && [ -f "$out.stamp" ] && [ "$(<"$out.stamp")" = "$inputs" ]; then
		up_to_date "initramfs"
		return
	fi
	step "building initramfs"
	local tmp
	tmpdir tmp initramfs
	local root=$tmp/root
	mkdir -p "$root"/{bin,dev,proc,sys,newroot,lib/modules}
	cp /bin/busybox "$root/bin/busybox"
	cp "$IMAGES"/kernel/modules/*.ko "$IMAGES/kernel/modules/order" "$root/lib/modules/"
	cp "$SCRIPTS/guest-init.sh" "$root/init"
	chmod 0755 "$root/init"
	cp "$agent" "$root/panda-guest"
	# Uncompressed: unpacking gzip under TCG costs more than reading 10 MB.
	# cpio reads the list to its end: this pipe cannot SIGPIPE.
	(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) >"$tmp/initramfs.img"
	publish "$tmp/initramfs.img" "$out" "$inputs"
	done_step
}

# quick_login takes the processes out of the login profiles of the root
# filesystem at $1: commands run under `bash -l -c` (internal/guest), and
# under TCG each process a profile starts costs ~40 ms per command.
# /etc/profile asks `id -u` where bash knows $EUID; root's ~/.profile runs
# `mesg n` with no terminal to act on.
quick_login() {
	local root=$1
	# shellcheck disable=SC2016 # the $ are the profile's, not ours
	sed -i 's/"$(id -u)"/"${EUID:-$(id -u)}"/' "$root/etc/profile"
	# shellcheck disable=SC2016
	sed -i 's/^mesg n 2> \/dev\/null || true$/if [ -t 0 ]; then mesg n 2> \/dev\/null || true; fi/' "$root/root/.profile"
	# shellcheck disable=SC2016
	if grep -q '"$(id -u)"' "$root/etc/profile" || grep -q '^mesg n' "$root/root/.profile"; then
		warn "the login profiles changed shape: commands in base start slower (see quick_login in $0)"
	fi
}

# debian_root builds Debian 12 (minbase) with the packages $2 (comma
# separated) and user "user" into directory $1; further arguments are
# mmdebstrap options. Commands then start quickly under `bash -l`
# (quick_login).
debian_root() {
	local root=$1 packages=$2
	shift 2
	local sources=/etc/apt/sources.list.d/debian.sources
	[ -f "$sources" ] || sources=/etc/apt/sources.list
	# useradd: E2B's templates run commands as user "user" (home
	# /home/user), and so do e2b SDKs against base (internal/controlplane/e2b).
	mmdebstrap --variant=minbase --include="$packages" \
		--aptopt='Acquire::Retries "3"' \
		--dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-exclude=/usr/share/man/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		--dpkgopt='path-include=/usr/share/locale/locale.alias' \
		--customize-hook='echo "127.0.0.1 localhost" > "$1/etc/hosts"' \
		--customize-hook='rm -f "$1/etc/machine-id" "$1/etc/hostname"' \
		--customize-hook='chroot "$1" useradd --create-home --shell /bin/bash --uid 1000 --user-group user' \
		"$@" \
		bookworm "$root" "$sources" </dev/null
	quick_login "$root"
}

# rootfs builds an ext4 image from a directory tree without mounting anything.
rootfs() {
	local name=$1 out="$IMAGES/rootfs-$1.ext4"
	# The recipe: what the image is built from. A change rebuilds it.
	local recipe help
	case "$name" in
	base) recipe="base ${ROOTFS_BASE_MIB}MiB $BASE_PACKAGES user login" ;;
	code-interpreter) recipe="code-interpreter ${ROOTFS_CODE_MIB}MiB $BASE_PACKAGES,$CODE_PACKAGES user login norecommends mplcache" ;;
	tiny)
		[ -x /bin/busybox ] || die "/bin/busybox is missing: run $0 deps first"
		help=$(/bin/busybox --help 2>&1) || true
		recipe="tiny ${ROOTFS_TINY_MIB}MiB ${help%%$'\n'*}"
		;;
	*) die "unknown rootfs $name (want base, tiny or code-interpreter)" ;;
	esac
	local stamp=()
	[ ! -f "$out.stamp" ] || mapfile -t stamp <"$out.stamp"
	if [ -f "$out" ] && [ "${stamp[0]-}" = "$recipe" ]; then
		up_to_date "rootfs $name (${stamp[1]-})"
		return
	fi
	need_root "building the $name root filesystem"
	local tmp
	tmpdir tmp "rootfs-$name"
	local size
	case "$name" in
	base)
		step "building rootfs base: Debian 12 minbase + $BASE_PACKAGES (about a minute)"
		debian_root "$tmp/root" "$BASE_PACKAGES"
		size=$ROOTFS_BASE_MIB
		;;
	code-interpreter)
		step "building rootfs code-interpreter: Debian 12 minbase + base's packages + $CODE_PACKAGES (about a minute and a half)"
		debian_root "$tmp/root" "$BASE_PACKAGES,$CODE_PACKAGES" \
			--aptopt='APT::Install-Recommends "false"' \
			--customize-hook='chroot "$1" python3 -c "import numpy, pandas, IPython, ipykernel, jupyter_client"' \
			--customize-hook='chroot "$1" python3 -m ipykernel_launcher --help >/dev/null' \
			--customize-hook='chroot "$1" node -e "require(\"vm\")"' \
			--customize-hook='chroot "$1" runuser -u user -- env HOME=/home/user MPLBACKEND=Agg python3 -c "import io, matplotlib.pyplot as p; p.plot([1, 2]); p.savefig(io.BytesIO(), format=\"png\")"'
		size=$ROOTFS_CODE_MIB
		;;
	tiny)
		step "building rootfs tiny: busybox"
		mkdir -p "$tmp/root"/{bin,sbin,etc,proc,sys,dev,run,tmp,root,usr/bin,usr/sbin}
		chmod 1777 "$tmp/root/tmp"
		cp /bin/busybox "$tmp/root/bin/busybox"
		local applet applets
		applets=$(/bin/busybox --list)
		for applet in $applets; do
			[ "$applet" = busybox ] || ln -sf busybox "$tmp/root/bin/$applet"
		done
		echo "root:x:0:0:root:/root:/bin/sh" >"$tmp/root/etc/passwd"
		echo "root:x:0:" >"$tmp/root/etc/group"
		echo "127.0.0.1 localhost" >"$tmp/root/etc/hosts"
		size=$ROOTFS_TINY_MIB
		;;
	esac
	mkdir -p "$tmp/root/run" "$tmp/root/tmp" "$tmp/root/work"
	truncate -s "${size}M" "$tmp/rootfs.ext4"
	mkfs.ext4 -q -F -L "rootfs-$name" -E lazy_itable_init=1,lazy_journal_init=1 -d "$tmp/root" "$tmp/rootfs.ext4"
	publish "$tmp/rootfs.ext4" "$out" "$(printf '%s\nbuilt %s' "$recipe" "$(date -u +%Y-%m-%dT%H:%M:%SZ)")"
	done_step
}

# images builds every guest image from the guest agent binary $1.
images() {
	kernel
	agent "$1"
	initramfs "$IMAGES/panda-guest"
	local r
	for r in $ROOTFS; do
		rootfs "$r"
	done
}

usage="usage: $0 deps | kernel | agent AGENT | initramfs AGENT | rootfs base|tiny|code-interpreter | images AGENT | all AGENT"

main() {
	case "${1:-}" in
	deps | kernel | agent | initramfs | rootfs | images | all) ;;
	*) die "$usage" ;;
	esac
	lock
	case "$1" in
	deps) deps ;;
	kernel) kernel ;;
	agent) agent "${2:?agent path}" ;;
	initramfs) initramfs "${2:?agent path}" ;;
	rootfs) rootfs "${2:?base, tiny or code-interpreter}" ;;
	images) images "${2:?agent path}" ;;
	all)
		deps
		images "${2:?agent path}"
		;;
	esac
}

main "$@"
