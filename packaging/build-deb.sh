#!/usr/bin/env bash
# Builds the Debian package DIR/napd_VERSION_ARCH.deb (DIR: the first
# argument, default dist/) from this source tree, without debhelper: a staged
# tree and dpkg-deb. The same commit gives the same bytes (SOURCE_DATE_EPOCH
# is the commit's time; file times, owners, order and compression are fixed).
#
# Needs: go (with cgo and a C compiler), git, dpkg-dev (dpkg-shlibdeps), gzip.
#
# Version: the top `## VERSION - DATE` section of CHANGELOG.md. A commit
# tagged vVERSION is VERSION; an unreleased section builds the snapshot
# VERSION~gitYYYYMMDD.COMMIT (sorting before VERSION), a released one
# VERSION+gitYYYYMMDD.COMMIT for later commits.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
pkg=$top/packaging
outdir=$(mkdir -p "${1:-$top/dist}" && cd "${1:-$top/dist}" && pwd)
GO=${GO:-go}
export LC_ALL=C TZ=UTC
umask 022

die() {
	echo "build-deb: $*" >&2
	exit 1
}

# --- version and time --------------------------------------------------------

heading=$(grep -m1 '^## ' "$top/CHANGELOG.md") || die "no '## VERSION - DATE' section in CHANGELOG.md"
base=${heading#\#\# }
base=${base%% - *}
released=${heading##* - }
[[ $base =~ ^[0-9][0-9A-Za-z.+~]*$ ]] || die "CHANGELOG.md: bad version in '$heading'"

if git -C "$top" rev-parse --git-dir >/dev/null 2>&1; then
	commit_epoch=$(git -C "$top" log -1 --format=%ct)
	commit=$(git -C "$top" rev-parse --short=10 HEAD)
	day=$(date -d "@$commit_epoch" +%Y%m%d)
	if [ "$(git -C "$top" tag --points-at HEAD --list "v$base")" = "v$base" ]; then
		version=$base
	elif [ "$released" = unreleased ]; then
		version=$base~git$day.$commit
	else
		version=$base+git$day.$commit
	fi
else
	# A source tree without git (an exported tarball): the changelog's
	# version, and the caller's SOURCE_DATE_EPOCH.
	[ -n "${SOURCE_DATE_EPOCH:-}" ] || die "not a git checkout: set SOURCE_DATE_EPOCH"
	commit_epoch=$SOURCE_DATE_EPOCH
	version=$base
fi
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$commit_epoch}
arch=$(dpkg --print-architecture)

# --- staging -----------------------------------------------------------------

work=$(mktemp -d "${TMPDIR:-/tmp}/napd-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
# dpkg-shlibdeps expects the debian/PACKAGE layout of a source package.
stage=$work/debian/napd
mkdir -p "$stage/DEBIAN"

# PIE, stripped, and cgo (go-nvml loads libnvidia-ml with dlopen, and the
# programs link libc dynamically) built with Debian's hardening flags, as
# dh_strip and dpkg-buildflags would have them. -trimpath and no VCS stamp
# keep the build reproducible.
export CGO_ENABLED=1
# go-nvml's generated cgo code calls NVML functions NVIDIA deprecated.
CGO_CFLAGS="$(dpkg-buildflags --get CFLAGS) $(dpkg-buildflags --get CPPFLAGS) -Wno-deprecated-declarations"
export CGO_CFLAGS
# gobuild HARDENING OUTDIR PACKAGE... builds with dpkg-buildflags' linker
# flags for DEB_BUILD_MAINT_OPTIONS=HARDENING.
gobuild() {
	local hardening=$1 out=$2
	shift 2
	(cd "$top" && CGO_LDFLAGS=$(DEB_BUILD_MAINT_OPTIONS=$hardening dpkg-buildflags --get LDFLAGS) \
		"$GO" build -trimpath -buildvcs=false -buildmode=pie \
		-ldflags "-s -w -linkmode=external -X main.version=$version" -o "$out" "$@")
}
# napd without bindnow: it refers to NVML's functions, which are resolved
# when libnvidia-ml is loaded with dlopen; binding them at start fails
# ("undefined symbol: nvml…"), with or without a GPU.
gobuild hardening=+all,-bindnow "$stage/usr/bin/" ./cmd/napd
gobuild hardening=+all "$stage/usr/bin/" ./cmd/napctl
gobuild hardening=+all "$stage/usr/lib/napd/" ./cmd/napd-demo-engine
# What dh_strip also removes: the C compiler's identification.
for bin in "$stage"/usr/bin/* "$stage"/usr/lib/napd/*; do
	objcopy --remove-section=.comment "$bin"
done

install -D -m 0644 "$top/etc/napd/napd.toml" "$stage/etc/napd/napd.toml"
# The drop-in directory, empty: the operator's files, not conffiles.
install -d -m 0755 "$stage/etc/napd/napd.d"
install -D -m 0644 -t "$stage/lib/systemd/system" "$pkg/systemd/napd.service" "$pkg/systemd/napd.socket"
install -D -m 0644 "$pkg/sysusers.conf" "$stage/usr/lib/sysusers.d/napd.conf"
install -D -m 0644 "$pkg/tmpfiles.conf" "$stage/usr/lib/tmpfiles.d/napd.conf"
install -D -m 0644 "$pkg/grafana/napd.json" "$stage/usr/share/napd/grafana/napd.json"
install -D -m 0644 "$pkg/debian/lintian-overrides" "$stage/usr/share/lintian/overrides/napd"
for page in "$pkg"/man/*.[1-8]; do
	section=${page##*.}
	install -d "$stage/usr/share/man/man$section"
	gzip -9n <"$page" >"$stage/usr/share/man/man$section/$(basename "$page").gz"
done

doc=$stage/usr/share/doc/napd
# Uncompressed: the shipped config, the units and the man pages name these
# paths.
install -D -m 0644 -t "$doc" "$top/README.md" "$top/docs/install.md" "$top/docs/config.md" "$top/docs/fleet.md" \
	"$top/docs/migrating.md" "$top/docs/remote.md"
install -D -m 0644 -t "$doc/examples" "$top/docs/examples/haproxy.cfg"

maintainer=$(sed -n 's/^Maintainer: //p' "$pkg/debian/control.in")

# changelog_entries turns CHANGELOG.md into a Debian changelog (see the top
# of CHANGELOG.md for the format); the unreleased entry gets $version.
changelog_entries() {
	local line ver when open=0
	while IFS= read -r line; do
		case $line in
		'## '*)
			[ $open = 1 ] && printf '\n -- %s  %s\n\n' "$maintainer" "$when"
			ver=${line#\#\# }
			when=${ver##* - }
			ver=${ver%% - *}
			if [ "$when" = unreleased ]; then
				ver=$version
				when=$(date -R -d "@$SOURCE_DATE_EPOCH")
			else
				when=$(date -R -d "$when") || die "CHANGELOG.md: bad date in '$line'"
			fi
			printf 'napd (%s) unstable; urgency=medium\n\n' "$ver"
			open=1
			;;
		'- '*) [ $open = 1 ] && printf '  * %s\n' "${line#- }" ;;
		'  '*) [ $open = 1 ] && printf '    %s\n' "${line#  }" ;;
		esac
	done <"$top/CHANGELOG.md"
	[ $open = 1 ] && printf '\n -- %s  %s\n' "$maintainer" "$when"
}
changelog_entries | gzip -9n >"$doc/changelog.gz"

# copyright: napd's notice, then the license of everything linked in.
indent() { sed 's/^/    /; s/ *$//' "$@"; }
# licenses prints the license (and Apache NOTICE) of the source tree $1. The
# Apache License 2.0 is referred to, as Debian policy asks, not copied.
licenses() {
	local f found=0
	for f in "$1"/LICENSE* "$1"/LICENCE* "$1"/COPYING*; do
		[ -f "$f" ] || continue
		found=1
		if grep -q 'Apache License' "$f" && grep -q 'Version 2.0, January 2004' "$f"; then
			echo "    Apache License 2.0: see /usr/share/common-licenses/Apache-2.0"
		else
			indent "$f"
		fi
	done
	[ $found = 1 ] || die "no license file in $1"
	if [ -f "$1/NOTICE" ]; then
		printf '\n    NOTICE:\n\n'
		indent "$1/NOTICE"
	fi
}
{
	cat "$pkg/debian/copyright.in"
	printf '\nGo standard library %s\n\n' "$("$GO" env GOVERSION)"
	licenses "$("$GO" env GOROOT)"
	(cd "$top" && "$GO" list -deps -f '{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}} {{.Dir}}{{end}}{{end}}' \
		./cmd/napd ./cmd/napctl ./cmd/napd-demo-engine) | sort -u |
		while read -r path modver dir; do
			printf '\nGo module %s %s\n\n' "$path" "$modver"
			licenses "$dir"
		done
} >"$doc/copyright"

# --- control files -----------------------------------------------------------

printf 'Source: napd\n\nPackage: napd\nArchitecture: any\n' >"$work/debian/control"
# napd refers to NVML symbols it resolves with dlopen at run time: not a
# missing dependency, so those warnings (bit 1) are off.
shlibs=$(cd "$work" && dpkg-shlibdeps --warnings=2 -O -e debian/napd/usr/bin/napd -e debian/napd/usr/bin/napctl \
	-e debian/napd/usr/lib/napd/napd-demo-engine)
shlibs=${shlibs#shlibs:Depends=}
installed_size=$(du -sk --apparent-size --exclude=DEBIAN "$stage" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@INSTALLED_SIZE@/$installed_size/" \
	-e "s/@SHLIBS_DEPENDS@/$shlibs/" "$pkg/debian/control.in" >"$stage/DEBIAN/control"
echo /etc/napd/napd.toml >"$stage/DEBIAN/conffiles"
install -m 0755 -t "$stage/DEBIAN" "$pkg/debian/postinst" "$pkg/debian/prerm" "$pkg/debian/postrm"
# md5sums of every file but the conffiles, which dpkg tracks itself.
(cd "$stage" && find . -type f ! -path './DEBIAN/*' ! -path './etc/*' -printf '%P\n' | sort |
	xargs -d '\n' md5sum) >"$stage/DEBIAN/md5sums"
chmod 0644 "$stage/DEBIAN/control" "$stage/DEBIAN/conffiles" "$stage/DEBIAN/md5sums"

# --- the package -------------------------------------------------------------

find "$stage" -type d -exec chmod 0755 {} +
find "$stage" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
deb=$outdir/napd_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
echo "$deb"
