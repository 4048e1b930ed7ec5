#!/usr/bin/env bash
# Installs the Debian packages the test suite needs, only those missing
# (scripts/debian-deps.sh installs them).
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
	podman          # container engines (tests/containers), rootful
	runc            # podman's OCI runtime in the tests: Debian's crun refuses a hybrid cgroup v1
	containernetworking-plugins # podman's bridge for a published container_port (in the systemd box)
	docker.io       # container engines with docker; the tests start a daemon of their own
)

exec "$(dirname "$0")/debian-deps.sh" test-deps "${PACKAGES[@]}"
