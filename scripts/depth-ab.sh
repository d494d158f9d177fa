#!/usr/bin/env bash
# STATE_PUT of a 1.2 GB mock state over TCP and Unix at 256 KiB and 2 MiB with
# --ring-depth 4, 8 and 16, one engine build, depths alternating 4 8 16 16 8 4.
#
#   scripts/depth-ab.sh DIR   # DIR holds hydra-engine, hydra-plugin-mock, hydractl
set -uo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 DIR" >&2; exit 2; }
D=$(cd "$1" && pwd) C=$D/hydractl
blob=/dev/shm/hydra-depth-$$.blob
trap 'rm -f "$blob"' EXIT
toks=$(python3 -c "print(','.join(str(3+(i*31)%250) for i in range(9200)))")
rate() { grep -o '([0-9.]* GB/s)' | tr -d '()GB/s '; }
for depth in 4 8 16 16 8 4; do
	sock=/tmp/hydra-d-$depth.sock port=$((39700 + RANDOM % 200)); rm -f "$sock"
	"$D/hydra-engine" --rpc "unix://$sock" --rpc "tcp://127.0.0.1:$port" --backend "$D/hydra-plugin-mock" \
		--backend-opt kv_bytes_per_token=131072 --slots 2 --log-level warn --ring-depth $depth >/tmp/hydra-depth.log 2>&1 &
	pid=$!
	for _ in $(seq 100); do "$C" --addr "unix://$sock" info >/dev/null 2>&1 && break; sleep 0.1; done
	"$C" --addr "unix://$sock" prefill --slot 0 --tokens "$toks" >/dev/null 2>&1 || exit 1
	[[ -f $blob ]] || "$C" --addr "unix://$sock" --no-progress state get --slot 0 -o "$blob" >/dev/null 2>&1
	for chunk in 262144 2097152; do
		"$C" --addr "unix://$sock" configure "{\"state_chunk_size\":$chunk}" >/dev/null
		for tr in "tcp://127.0.0.1:$port" "unix://$sock"; do
		echo "depth $depth chunk $chunk ${tr%%:*} PUT $(for _ in 1 2 3 4; do "$C" --addr "$tr" --no-progress state put --slot 1 -i "$blob" 2>&1 | rate; done | tr '\n' ' ')"
		done
	done
	kill $pid; wait $pid 2>/dev/null
done
