#!/usr/bin/env bash
# Installs the Debian packages `make bench` needs, only those missing: wrk
# drives the HTTP comparison and nginx is the reference proxy. As root it
# uses apt-get; otherwise it names what to install and fails.
set -euo pipefail

# One package a line, with the reason it is needed.
PACKAGES=(
	wrk         # the load generator users measure proxies with
	nginx-light # the reference proxy (a keep-alive upstream to the same engine)
)

if ! command -v dpkg-query >/dev/null; then
	echo "bench-deps: not a Debian system; install the equivalents of: ${PACKAGES[*]}" >&2
	exit 1
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "bench-deps: missing Debian packages: ${missing[*]}" >&2
	echo "bench-deps: install them with: sudo apt-get install --no-install-recommends ${missing[*]}" >&2
	exit 1
fi

echo "bench-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
