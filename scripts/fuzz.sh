#!/usr/bin/env bash
# Runs every fuzz target of the parsers napd owns for a short budget each
# (FUZZTIME, default 10s): the request body's routing fields, multipart
# forms, the API keys file, usage.json, the request head's napd headers
# (deadline, idempotency), path rules, the config file, the HAProxy agent
# check, a remote napd's model list (agent/remote), the GPU probes'
# parsers (nvidia-smi's CSV, DRM fdinfo) and /proc/PID/io (probes/procio).
# `make fuzz` runs it; CI runs it after the tests. A failure leaves the
# input under the package's testdata/fuzz, where `go test` replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-10s}
packages=(./gateway/... ./agent/config/... ./agent/usage/... ./agentcheck/... ./agent/remote/... ./probes/...)
for pkg in $(go list "${packages[@]}"); do
	for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
		echo "fuzz $pkg $target ($fuzztime)"
		go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" >/tmp/napd-fuzz.log 2>&1 || {
			cat /tmp/napd-fuzz.log
			exit 1
		}
	done
done
