#!/usr/bin/env bash
# Installs the Debian packages `make bench` needs, only those missing: wrk
# drives the HTTP comparison and nginx is the reference proxy
# (scripts/debian-deps.sh installs them).
set -euo pipefail

# One package a line, with the reason it is needed.
PACKAGES=(
	wrk         # the load generator users measure proxies with
	nginx-light # the reference proxy (a keep-alive upstream to the same engine)
)

exec "$(dirname "$0")/debian-deps.sh" bench-deps "${PACKAGES[@]}"
