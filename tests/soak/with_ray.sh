#!/usr/bin/env bash
# `make soak` with its Ray phase: a one-node Ray cluster (2 CPUs) in a private network and pid
# namespace whose only interface is loopback (Ray 2.60 swaps 127.0.0.1 for the routable address;
# nothing leaves the namespace, and the kernel ends every Ray daemon with it), then
# tests/soak/chaos.py with --ray-address. Needs root, `unshare` and Ray; arguments go to
# chaos.py. Never `ray stop`: it kills by name, machine wide.
set -euo pipefail
PY=${PY:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
# the actors import the soak's dataset: Ray's workers get the environment `ray start` had
export PYTHONPATH="$HERE:$(dirname "$HERE")${PYTHONPATH:+:$PYTHONPATH}"
exec unshare --net --pid --fork --mount-proc bash -c '
  set -euo pipefail
  ip link set lo up
  export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token
  export RAY_AUTH_TOKEN=$("'"$PY"'" -c "import secrets; print(secrets.token_hex(16))")
  tmp=$(mktemp -d /tmp/stoker-soak-ray-XXXXXX)
  "$(dirname "'"$PY"'")/ray" start --head --num-cpus 2 --node-ip-address 127.0.0.1 \
    --port 6399 --temp-dir "$tmp" --disable-usage-stats --include-dashboard false > /dev/null
  # not the last command: bash would exec it, it would be pid 1 of the namespace, and the Ray
  # daemons would be its children (counted as what it left behind)
  status=0
  "'"$PY"'" "'"$HERE"'/chaos.py" --ray-address 127.0.0.1:6399 "$@" || status=$?
  exit $status
' soak "$@"
