#!/usr/bin/env bash
# Installs the Debian packages named as arguments, only those missing; the
# first argument names the caller in messages. As root it uses apt-get;
# otherwise it names what to install and fails. Used by test-deps.sh and
# bench-deps.sh.
set -euo pipefail

who=$1
shift

installed() {
	# A Node.js from elsewhere (e.g. NodeSource, whose nodejs bundles npm)
	# serves as well and must not be replaced.
	case "$1" in
	nodejs) command -v node >/dev/null && return 0 ;;
	npm) command -v npm >/dev/null && return 0 ;;
	esac
	dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

if ! command -v dpkg-query >/dev/null; then
	echo "$who: not a Debian system; install the equivalents of: $*" >&2
	exit 1
fi

missing=()
for pkg in "$@"; do
	installed "$pkg" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "$who: missing Debian packages: ${missing[*]}" >&2
	echo "$who: install them with: sudo apt-get install --no-install-recommends ${missing[*]}" >&2
	exit 1
fi

echo "$who: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
