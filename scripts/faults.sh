#!/usr/bin/env bash
# The multi-host fault suite (README "Fault suite"): three grove nodes and a
# client in network namespaces joined by a bridge, faults made with nftables
# (this kernel has no netem), SIGSTOP and noise from the client. Needs root.
#
#   bash scripts/faults.sh          # the full run (about 35 minutes)
#   bash scripts/faults.sh short    # CI's short run (a few minutes)
#
# It installs what is missing (iproute2, nftables) on Debian, removes what an
# aborted earlier run left (namespaces named gf-*), and prints a results
# table at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-full}
if [ "$(id -u)" != 0 ]; then
  echo "faults.sh: the fault suite creates network namespaces: run it as root" >&2
  exit 1
fi
missing=()
command -v ip >/dev/null || missing+=(iproute2)
command -v nft >/dev/null || missing+=(nftables)
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing ${missing[*]}"
  apt-get install -y "${missing[@]}" || { apt-get update && apt-get install -y "${missing[@]}"; }
fi

GROVE_FAULTS=$mode exec go test -count=1 -v -timeout 60m -run '^TestFaults$' ./internal/faults
