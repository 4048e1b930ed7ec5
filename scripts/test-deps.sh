#!/usr/bin/env bash
# Installs the Debian packages the test suite needs, only those missing.
# As root it uses apt-get; otherwise it names what to install and fails.
set -euo pipefail

# One package a line, with the reason it is needed.
PACKAGES=(
	python3-zmq     # libzmq peer for the ZeroMQ transport interop tests
	python3-msgpack # message encoding of that peer
	iproute2        # ip(8): loopback inside the systemd test box
	lintian         # checks the built .deb
	dpkg-dev        # dpkg-shlibdeps and dpkg-buildflags for make deb
	curl            # the package test's client inside the systemd box
	chromium        # headless browser that renders the status page (tests/gateway)
	fonts-dejavu-core # a font for that browser's screenshot
	stress-ng       # a CPU hog for running the suite on a busy machine
	haproxy         # the load balancer of tests/fleet, started from docs/examples/haproxy.cfg
	nodejs          # runs the official OpenAI and Anthropic SDKs against napd (tests/sdk)
	npm             # installs those SDKs from the npm registry (npm ci, tests/sdk/package-lock.json)
)

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
	echo "test-deps: not a Debian system; install the equivalents of: ${PACKAGES[*]}" >&2
	exit 1
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
	installed "$pkg" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "test-deps: missing Debian packages: ${missing[*]}" >&2
	echo "test-deps: install them with: sudo apt-get install --no-install-recommends ${missing[*]}" >&2
	exit 1
fi

echo "test-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
