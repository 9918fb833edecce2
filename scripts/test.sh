#!/usr/bin/env bash
# The whole test suite. On a fresh Debian machine with Go installed it
# fetches what it needs (Go modules; Debian packages once later layers need
# real NFS/NBD clients) and runs: formatting and vet checks, every test
# (simulations at their CI seed counts, real-process tests), the race
# detector on the protocol packages, and a short fuzz run of every decoder.
#
# Knobs: GROVE_SEEDS=N (seeds per simulation), GROVE_SEED=S (replay one
# seed), GROVE_FUZZTIME=30s or 100000x (per fuzz target), GROVE_FAULTS=short|full|off
# (the multi-host fault suite; short by default, as root), GROVE_DOCKER=0|1
# (the container test; on where docker answers).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v go >/dev/null; then
  echo "test.sh: Go is required (https://go.dev/dl); this machine has none on PATH" >&2
  exit 1
fi
# -trimpath (unless GOFLAGS is set): without it the build cache keys every
# package of this module by its directory, so CI's fresh clone in a new
# directory compiled every test binary, race build and fuzz build again
# (64 s of the main phase's compiling alone, 13 s with -trimpath and a
# cache an earlier clone filled). The tests and the grove binaries they
# build inherit it.
export GOFLAGS=${GOFLAGS:--trimpath}
# The collector at GOGC=400 (unless set), for the compiler, the tests and
# the grove servers they start (which set 400 themselves): the suite is
# CPU-bound on 2 cores, and at the default 100 the lock service's
# simulation spent 30 % more CPU (5.8 s user + 0.9 s sys against 4.0 +
# 0.2 for 40 seeds), most of it collecting and returning a heap of 25 MiB.
# Heaps grow about 2-4x; the largest, the RLDevs' simulation, to 1 GiB.
export GOGC=${GOGC:-400}

# Each phase's header says how long the run has taken so far (planning the
# suite's time: it should stay near 15 minutes on a 2-core machine).
phase() { echo "== $* [$((SECONDS / 60))m$((SECONDS % 60))s]"; }
phase "go mod download"
go mod download

phase "gofmt / go vet"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted" >&2
  exit 1
fi
go vet ./...

# fio: the RLDev benchmark's raw-file figures (its smoke test needs it).
if ! command -v fio >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing fio"
    apt-get install -y fio || { apt-get update && apt-get install -y fio; }
  else
    echo "(no fio and not root to install it: the RLDev benchmark's smoke test is skipped)"
  fi
fi

# etcd 3.4 (etcd-server, etcd-client): etcdctl drives the B-tree's
# etcd-compatible endpoint in its test; the benchmarks compare with etcd.
if ! command -v etcdctl >/dev/null || ! command -v etcd >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing etcd-server and etcd-client"
    apt-get install -y etcd-server etcd-client || { apt-get update && apt-get install -y etcd-server etcd-client; }
  else
    echo "(no etcd and not root to install it: the etcdctl test is skipped)"
  fi
fi

# redis (redis-server, redis-tools): grove bench table compares the DDS
# hash tables with redis-server driven by redis-benchmark (its smoke test
# checks the comparison runs). Nothing here starts the packaged service.
if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing redis-server and redis-tools"
    apt-get install -y redis-server redis-tools || { apt-get update && apt-get install -y redis-server redis-tools; }
  else
    echo "(no redis and not root to install it: the benchmark's redis comparison is skipped)"
  fi
fi

phase "tests"
# The container test (cmd/grove.TestDockerCompose) runs where a docker
# engine and docker-compose answer; GROVE_DOCKER=0 skips it.
if [ -z "${GROVE_DOCKER:-}" ]; then
  if command -v docker-compose >/dev/null && docker info >/dev/null 2>&1; then
    export GROVE_DOCKER=1
    echo "(docker answers: the container test runs)"
  else
    echo "(no docker engine or docker-compose here: the container test is skipped)"
  fi
fi
# -p 4: four packages' tests at once on this 2-core machine. The longest
# packages (cmd/grove's real processes, the B-tree's simulator) wait on
# timers and processes more than they compute: with two at a time the
# cores stood 30-40 % busy for their first four minutes, and the phase took
# 9 min; with four, 4.6 min.
go test -p 4 -count=1 -timeout 20m ./...

phase "fault suite (short) started in the background"
# The fault suite (real processes in network namespaces, below) waits on
# its faults' timers: 3.5-4.5 min at 10-25 % of the cores. It starts here
# and runs in the background while the race detector's tests and then the
# fuzzers use the cores (beside the fuzzers alone it outlasted them by
# 1-2 min), and its output follows theirs. Both keep the two cores busy,
# as the fuzzers alone did: the suite sees no more contention than before.
# Its checks of safety do not rest on timing; its timings are reported,
# not asserted (README "Fault suite": the figures come from the full run,
# alone).
faults_log=$(mktemp)
faults_pid=
if [ "${GROVE_FAULTS:-short}" = off ]; then
  echo "(fault suite skipped: GROVE_FAULTS=off)" >"$faults_log"
elif [ "$(id -u)" != 0 ]; then
  echo "(fault suite skipped: not root; the suite creates network namespaces)" >"$faults_log"
else
  # Real processes on a bridged test network with nftables faults; needs
  # root and the kernel's network namespaces (CI runs as root).
  # scripts/faults.sh full runs the full version.
  bash scripts/faults.sh "${GROVE_FAULTS:-short}" >"$faults_log" 2>&1 &
  faults_pid=$!
  # A race or fuzz failure ends this script: the fault suite still ends first
  # (its processes and namespaces are its to clean), and its output shows.
  trap 'if [ -n "$faults_pid" ]; then echo "(waiting for the fault suite to end)"; wait "$faults_pid" || true; cat "$faults_log"; fi' EXIT
fi

phase "race detector (protocol packages, fewer simulation seeds)"
# -short: the oracles' teeth sweeps are single-threaded simulations; they
# run once in the full suite above. The failure detector's, lock service's,
# RLDevs' and chunk managers' simulations (GROVE_SEEDS) are single-threaded
# too: one goroutine runs every simulated node's protocol core on
# internal/sim's event queue, so the race detector has nothing to compare
# there; two seeds each keep them building and running under it, and the
# full seed counts run above. The RLDevs' tests on their harness or
# simulator (one goroutine) skip themselves under -race -short
# (skipOneGoroutineUnderRace): 4½ min of this phase, checking nothing the
# main phase did not. What it watches here is the runtimes' own
# goroutines (the services' in-process tests, the log's group commit, the
# B-tree servers): the RLDev runtime (its in-process cluster test), the
# chunk managers' runtime (its in-process failover test), the DDS bricks
# and libraries (their in-process failover, recovery and drop tests), the transaction
# log's group commit and recovery (its in-process failover test, its
# concurrent review tests; its simulation drives the real log, goroutines
# and all: 20 seeds), and the B-link tree's algorithm (its concurrent
# differential test), its server runtime in the simulator, the forwarding
# stream (its unit tests and a 3-node in-process cluster) and values in
# chunks.
# Two invocations side by side (the B-tree's takes a -run filter), each
# running its packages side by side: 70 s on this 2-core machine, where
# one after the other they took 157 s.
race_log=$(mktemp)
GROVE_SEEDS=${GROVE_RACE_SEEDS:-2} GROVE_TXN_SEEDS=${GROVE_RACE_TXN_SEEDS:-20} GROVE_DDS_SEEDS=${GROVE_RACE_DDS_SEEDS:-20} go test -count=1 -race -short -timeout 20m \
  ./internal/fd/... ./internal/meta/... ./internal/sim/... ./internal/lock/... ./internal/rldev/... ./internal/chunk/... ./internal/txn/... ./internal/ddstable/... >"$race_log" 2>&1 &
race_pid=$!
race_btree=0
GROVE_BTREE_SEEDS=${GROVE_RACE_BTREE_SEEDS:-20} go test -count=1 -race -short -timeout 20m -run 'TestTree|TestSim|TestNode|TestReview5|TestReview6|TestReview7|TestEtcdForwardStream|TestServerWait|TestGetNotStarved|TestOutbox' ./internal/btree/... || race_btree=$?
race_rest=0
wait "$race_pid" || race_rest=$?
cat "$race_log"
rm -f "$race_log"
if [ "$race_btree" != 0 ] || [ "$race_rest" != 0 ]; then
  echo "race detector: failed (B-tree packages: exit $race_btree; the others: exit $race_rest)" >&2
  exit 1
fi

phase "fuzz (short)"
# A count, not a duration: Go 1.26's fuzz coordinator can report
# "context deadline exceeded" (and fail) when a duration -fuzztime expires
# while a worker is mid-call (golang/go#75804, fixed in Go 1.27); a count has
# no deadline to race. GROVE_FUZZTIME=30s still works for a longer local run.
ft=${GROVE_FUZZTIME:-30000x}
# -fuzzminimizetime 0: on this Go/sandbox, minimizing each new interesting
# input stalls the workers (0 execs/s); without it they run ~60k execs/s.
# A crasher is still reported and saved under testdata/fuzz, unminimized.
# One instrumented test binary per package (go test -c -fuzz: one package
# per call), built two at a time, then run once per target in the
# package's directory (where testdata/fuzz lives), with go test's own
# corpus cache and timeout: compiling is most of a short run's time, and
# three of the packages have more than one target.
fuzz_bins=$(mktemp -d)
fuzz_pkgs="fd meta node lock rldev chunk txn btree ddstable"
printf '%s\n' $fuzz_pkgs | xargs -P 2 -I{} go test -c -fuzz=. -o "$fuzz_bins/{}.test" ./internal/{}
fuzz() {
  local pkg=$1 ip
  shift
  ip=$(go list "./internal/$pkg")
  for target in "$@"; do
    echo "-- $target ($ip)"
    (cd "internal/$pkg" && "$fuzz_bins/$pkg.test" -test.run '^$' -test.fuzz "^$target\$" -test.fuzztime "$ft" \
      -test.fuzzminimizetime 0 -test.timeout 10m -test.paniconexit0 -test.fuzzcachedir "$(go env GOCACHE)/fuzz/$ip")
  done
}
fuzz fd FuzzDecode FuzzPersistedState
fuzz meta FuzzDecodeDecree FuzzRestoreSnapshot FuzzDecodeNodes FuzzDecodeCounted
fuzz node FuzzConfig
fuzz lock FuzzDecodeSessionRequest FuzzDecodeSessionResponse FuzzDecodeState
fuzz rldev FuzzDecodePeer FuzzDecodeOnDisk FuzzDecodeTable FuzzDataFrames FuzzReview89DecodeOwed
fuzz chunk FuzzDecodeMap FuzzDecodePeer FuzzDecodeTable
fuzz txn FuzzDecodeLog
fuzz btree FuzzDecodeNode FuzzDecodeValue FuzzNodeDelta FuzzReview51Delta2 FuzzDirectory
fuzz ddstable FuzzDecodeMaps FuzzDecodeCheckpoint
rm -rf "$fuzz_bins"

phase "fault suite (short): three grove servers and a client in network namespaces"
faults_rc=0
if [ -n "$faults_pid" ]; then
  wait "$faults_pid" || faults_rc=$?
  faults_pid=
fi
cat "$faults_log"
rm -f "$faults_log"
if [ "$faults_rc" != 0 ]; then
  echo "fault suite: failed (exit $faults_rc)" >&2
  exit 1
fi

phase "all tests passed"
