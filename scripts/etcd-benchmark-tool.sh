#!/bin/bash
# etcd's own benchmark tool against etcd 3.4 (Debian etcd-server, 3 members on loopback) and
# Grove's etcd-compatible endpoint (grove up: 3 nodes), the same calls at the same sizes:
# puts of 10-byte keys and values, linearizable single-key ranges, 1/2/4/8 clients, 3 rounds.
# Debian packages no etcd benchmark tool and `go install` refuses its module (replace
# directives); build it from the module's source with the replaces removed (v3.5.17):
#   go mod download -json go.etcd.io/etcd/v3@v3.5.17   # prints its Dir
#   cp -r DIR /tmp/etcd-src && chmod -R u+w /tmp/etcd-src && cd /tmp/etcd-src
#   sed -i '/^replace (/,/^)/d' go.mod && GOFLAGS=-mod=mod go build -o /tmp/etcd-benchmark ./tools/benchmark
# Usage: scripts/etcd-benchmark-tool.sh [GROVE_BINARY [BENCHMARK_BINARY]] (uses ports 7400-7432 and
# 23701-23803 on 127.0.0.1; prints one line per round).
set -u
GROVE=${1:-bin/grove}
TOOL=${2:-/tmp/etcd-benchmark}
D=$(mktemp -d)
P=()
for i in 1 2 3; do
  c=$((23700+i)); p=$((23800+i))
  etcd --name e$i --data-dir $D/e$i --listen-client-urls http://127.0.0.1:$c --advertise-client-urls http://127.0.0.1:$c \
    --listen-peer-urls http://127.0.0.1:$p --initial-advertise-peer-urls http://127.0.0.1:$p \
    --initial-cluster e1=http://127.0.0.1:23801,e2=http://127.0.0.1:23802,e3=http://127.0.0.1:23803 \
    --initial-cluster-state new --log-level error > $D/e$i.log 2>&1 &
  P+=($!)
done
$GROVE up --data $D/g > $D/grove.out 2>&1 &
G=$!
for t in $(seq 1 120); do grep -q "^ready" $D/grove.out && break; sleep 0.5; done
grep "^ready" $D/grove.out || { echo "grove not ready"; cat $D/grove.out; }
E=127.0.0.1:23701,127.0.0.1:23702,127.0.0.1:23703
GE=127.0.0.1:7410,127.0.0.1:7420,127.0.0.1:7430
etcdctl --endpoints=$E put foo bar >/dev/null; etcdctl --endpoints=$GE put foo bar >/dev/null
rate() { grep "Requests/sec" | awk '{print $2}'; }
for C in 1 2 4 8; do
  for r in 1 2 3; do
    ep=$($TOOL --endpoints=$E --conns=$C --clients=$C put --key-size=10 --val-size=10 --sequential-keys --key-space-size=1000000 --total=$((1000*C)) 2>/dev/null | rate)
    gp=$($TOOL --endpoints=$GE --conns=$C --clients=$C put --key-size=10 --val-size=10 --sequential-keys --key-space-size=1000000 --total=$((1000*C)) 2>/dev/null | rate)
    er=$($TOOL --endpoints=$E --conns=$C --clients=$C range foo --consistency=l --total=$((2000*C)) 2>/dev/null | rate)
    gr=$($TOOL --endpoints=$GE --conns=$C --clients=$C range foo --consistency=l --total=$((2000*C)) 2>/dev/null | rate)
    echo "clients $C round $r etcd-put $ep grove-put $gp etcd-range $er grove-range $gr"
  done
done
kill $G; for p in "${P[@]}"; do kill $p; done; wait 2>/dev/null
rm -rf $D
