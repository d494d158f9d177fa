#!/usr/bin/env bash
# Engine to engine on one host (issue 54 item 3), on the mock: a slot's
# state of about BYTES (default 1.2 GB) moved by hydractl migrate between two
# engines' Unix sockets through shared memory (STATE_EXPORT, STATE_IMPORT),
# beside the same migrate over the socket path (to the destination's TCP
# address) and the source's socket STATE_GET alone (hydractl bench), all in
# one run, ROUNDS (3) times each; prints one JSON line per measure and the
# medians. From the repository's root:
#   bench/scripts/migrate-shm.sh [OUT_DIR]
set -euo pipefail
BYTES=${BYTES:-1200000000}
ROUNDS=${ROUNDS:-3}
OUT=${1:-}
W=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; [[ -n ${KEEP_LOGS:-} ]] && grep -h "state transfer" "$W"/a.log "$W"/b.log | sed "s/.*state transfer: //" | cut -c1-200; rm -rf "$W"' EXIT
go build -o "$W" ./cmd/hydra-engine ./cmd/hydra-plugin-mock ./cmd/hydractl
PER_TOKEN=1048576
TOKENS=$((BYTES / PER_TOKEN))
for e in a b; do
	"$W/hydra-engine" --backend "$W/hydra-plugin-mock" --slots 2 --log-level info \
		--rpc "unix://$W/$e.sock" --rpc "tcp://127.0.0.1:0" --http "" \
		--backend-opt kv_bytes_per_token=$PER_TOKEN >"$W/$e.log" 2>&1 &
done
# Ready once each has said where it serves TCP (its Unix socket may come first).
for e in a b; do
	for _ in $(seq 100); do [[ -S $W/$e.sock ]] && grep -q 'serving Hydra RPC: url=tcp' "$W/$e.log" && break; sleep 0.1; done
done
tcp_b=tcp://$(grep 'serving Hydra RPC: url=tcp' "$W/b.log" | grep -o 'addr=[0-9.:]*' | head -1 | cut -d= -f2)
ctl() { "$W/hydractl" --json --no-progress "$@"; }
ctl --addr "unix://$W/a.sock" prefill --slot 0 --tokens "$(seq 1 "$TOKENS" | awk '{printf "%s%d", (NR > 1 ? "," : ""), $1 % 250 + 1}')" >/dev/null
size=$(ctl --addr "unix://$W/a.sock" meta --slot 0 | grep -o '"state_size":[0-9]*' | cut -d: -f2)
echo "state: $size bytes ($TOKENS tokens of $PER_TOKEN bytes), machine: $(nproc) cores, $(uname -r)"
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
gbps() { grep -o '"gbps":[0-9.e+-]*' | cut -d: -f2; }
get=$(ctl --addr "unix://$W/a.sock" bench --slot 0 --rounds "$ROUNDS" | grep -o '"get_gbps":[0-9.e+-]*' | cut -d: -f2 | median)
shm=$(for _ in $(seq "$ROUNDS"); do ctl migrate --from "unix://$W/a.sock" --to "unix://$W/b.sock" --slot 0 --to-slot 1 | tee -a "$W/runs.jsonl" | gbps; done | median)
sock=$(for _ in $(seq "$ROUNDS"); do ctl migrate --from "unix://$W/a.sock" --to "$tcp_b" --slot 0 --to-slot 1 | tee -a "$W/runs.jsonl" | gbps; done | median)
paths=$(grep -o '"path":"[a-z ]*"' "$W/runs.jsonl" | sort | uniq -c | tr '\n' ' ')
echo "socket STATE_GET (hydractl bench, Unix socket): $get GB/s"
echo "migrate through shared memory (unix → unix):   $shm GB/s ($(awk -v a="$shm" -v b="$get" 'BEGIN {printf "%.2f", a/b}')× the STATE_GET)"
echo "migrate over the socket path (unix → tcp):     $sock GB/s"
echo "paths hydractl named: $paths"
if [[ -n $OUT ]]; then
	mkdir -p "$OUT"
	cp "$W/runs.jsonl" "$OUT/migrate-runs.jsonl"
fi
