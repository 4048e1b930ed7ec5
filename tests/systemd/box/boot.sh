#!/bin/sh
# Boots a throwaway systemd in private namespaces (docs/systemd.md).
#   boot.sh probe DIR                          can this machine run a box?
#   boot.sh host  DIR CGNAME UNITPATH [PKG]    on the host: own cgroups, then unshare
#   boot.sh inner DIR UNITPATH [PKG]           PID 1 of the box: overlay root, exec systemd
# Everything mounted here lives in the private mount namespace only: the
# host sees none of it, and it all goes when the box's PID 1 is killed.
set -eu

stage=$1
dir=$2
ns="--mount --pid --fork --cgroup --uts --ipc --net --propagation private"

case $stage in
probe)
	mkdir -p "$dir/probe/upper" "$dir/probe/work" "$dir/probe/root"
	# shellcheck disable=SC2086
	unshare $ns /bin/sh -c "mount -t overlay napd-box-probe -o lowerdir=/,upperdir=$dir/probe/upper,workdir=$dir/probe/work $dir/probe/root && ip link set lo up"
	rm -rf "$dir/probe"
	exit 0
	;;
host)
	cgname=$3
	unitpath=$4
	pkg=${5:-}
	# Own cgroups per box: two boxes (or a box and the host) must never share
	# unit cgroups. The cgroup namespace made by unshare is rooted here.
	for h in systemd unified memory pids; do
		base=/sys/fs/cgroup/$h
		[ -d "$base" ] || continue
		case $h in systemd) key=name=systemd ;; unified) key= ;; *) key=$h ;; esac
		self=$(awk -F: -v k="$key" '$2 == k { print $3; exit }' /proc/self/cgroup)
		cg=$base${self%/}/$cgname
		mkdir -p "$cg"
		echo "$cg" >>"$dir/cgroups"
		echo $$ >"$cg/cgroup.procs"
	done
	# --kill-child: if unshare dies (the test binary died), the box dies.
	# shellcheck disable=SC2086
	exec unshare $ns --kill-child=SIGKILL /bin/sh "$0" inner "$dir" "$unitpath" "$pkg"
	;;
inner) ;;
*)
	echo "usage: boot.sh probe|host|inner DIR ..." >&2
	exit 2
	;;
esac

unitpath=$3
pkg=${4:-}
r=$dir/root
mkdir -p "$dir/upper" "$dir/work" "$r"
mount -t overlay napd-box -o "lowerdir=/,upperdir=$dir/upper,workdir=$dir/work" "$r"
mount -t proc proc "$r/proc"
mount --rbind /sys "$r/sys"
mount --rbind /dev "$r/dev"
# Fresh cgroup mounts, rooted at this box's cgroup namespace: the rbind of
# /sys would show the host's whole hierarchy, shared by every box.
umount -R "$r/sys/fs/cgroup"
mount -t tmpfs -o mode=755 cgroup "$r/sys/fs/cgroup"
for h in systemd unified memory pids; do
	grep -q " /sys/fs/cgroup/$h " /proc/self/mounts || continue
	mkdir -p "$r/sys/fs/cgroup/$h"
	case $h in
	unified) mount -t cgroup2 cgroup2 "$r/sys/fs/cgroup/unified" ;;
	systemd) mount -t cgroup -o none,name=systemd cgroup "$r/sys/fs/cgroup/systemd" ;;
	*) mount -t cgroup -o "$h" cgroup "$r/sys/fs/cgroup/$h" ;;
	esac
done
# A host with a pure cgroup2 /sys/fs/cgroup.
if grep -q " /sys/fs/cgroup cgroup2 " /proc/self/mounts; then
	umount "$r/sys/fs/cgroup"
	mount -t cgroup2 cgroup2 "$r/sys/fs/cgroup"
fi
# Private /run and /tmp: systemd-tmpfiles would otherwise empty the host's /tmp.
mount -t tmpfs -o mode=755 tmpfs "$r/run"
mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"
if [ -n "$pkg" ]; then
	# Empty unit dirs for dpkg: the host's units (and .wants/) stay unseen.
	mount -t tmpfs -o mode=755 tmpfs "$r/etc/systemd/system"
	mount -t tmpfs -o mode=755 tmpfs "$r/usr/lib/systemd/system"
	# A container's policy-rc.d (exit 101) would stop deb-systemd-invoke from
	# starting anything. Removed in the overlay only (a whiteout).
	rm -f "$r/usr/sbin/policy-rc.d"
fi
mkdir -p "$r/napd-box"
mount --bind "$dir/shared" "$r/napd-box"
ip link set lo up
hostname napd-box
cd "$r"
mkdir -p .oldroot
pivot_root . .oldroot
umount -l /.oldroot
rmdir /.oldroot
exec env -i container=napd-box PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	SYSTEMD_UNIT_PATH="$unitpath" /lib/systemd/systemd --system --unit=napd-box.target
