#!/usr/bin/env bash
# Same-run comparison of engine variants on the mock plugin: STATE_GET
# (hydractl writing to /dev/null) and STATE_PUT (from a blob in /dev/shm) of
# a 1.2 GB state, over a Unix socket and TCP, at 64 KiB, 256 KiB and 2 MiB
# chunks. Variants run forward, backward, forward, backward (two variants:
# a b b a a b b a), so drift on a shared machine hits all alike.
#
#   bench/scripts/engine-ab.sh VARIANT VARIANT... [get|put|both]
#
# A VARIANT is a directory holding hydra-engine and hydra-plugin-mock (e.g.
# built from two commits with `go build -o DIR/ ./cmd/hydra-engine
# ./cmd/hydra-plugin-mock`), optionally followed by engine flags in the same
# argument: "bin --socket-buffer -1". hydractl is taken from the last variant's
# directory. Prints one line per variant run, transport and chunk size with
# the GB/s of each transfer; variants are named a, b, c, ...
set -uo pipefail
OPS=both
case ${!#} in get|put|both) OPS=${!#}; set -- "${@:1:$#-1}" ;; esac
[[ $# -ge 2 ]] || { echo "usage: $0 VARIANT VARIANT... [get|put|both]" >&2; exit 2; }
names=(a b c d e f g h) dirs=() flags=()
for v in "$@"; do
	read -r d f <<<"$v"
	dirs+=("$(cd "$d" && pwd)") flags+=("${f:-}")
done
C=${dirs[-1]}/hydractl
blob=/dev/shm/hydra-ab-$$.blob
trap 'rm -f "$blob"' EXIT
toks=$(python3 -c "print(','.join(str(3+(i*31)%250) for i in range(9200)))")
rate() { grep -o '([0-9.]* GB/s)' | tr -d '()GB/s '; }
n=$# order=()
for _ in 1 2; do
	for ((i = 0; i < n; i++)); do order+=("$i"); done
	for ((i = n - 1; i >= 0; i--)); do order+=("$i"); done
done
for i in "${order[@]}"; do
	v=${names[i]} dir=${dirs[i]}
	sock=/tmp/hydra-ab-$$-$v.sock port=$((39700 + RANDOM % 200)); rm -f "$sock"
	# shellcheck disable=SC2086 # the variant's flags split into words
	"$dir/hydra-engine" --rpc "unix://$sock" --rpc "tcp://127.0.0.1:$port" --backend "$dir/hydra-plugin-mock" \
		--backend-opt kv_bytes_per_token=131072 --slots 2 --log-level warn ${flags[i]} >"/tmp/hydra-ab-$$-$v.log" 2>&1 &
	pid=$!
	for _ in $(seq 100); do "$C" --addr "unix://$sock" info >/dev/null 2>&1 && break; sleep 0.1; done
	"$C" --addr "unix://$sock" prefill --slot 0 --tokens "$toks" >/dev/null 2>&1 || { echo "engine $v: prefill failed" >&2; kill $pid; exit 1; }
	[[ -f $blob ]] || "$C" --addr "unix://$sock" --no-progress state get --slot 0 -o "$blob" >/dev/null 2>&1
	for chunk in 65536 262144 2097152; do
		"$C" --addr "unix://$sock" configure "{\"state_chunk_size\":$chunk}" >/dev/null
		for tr in "unix://$sock" "tcp://127.0.0.1:$port"; do
			line="$v ${tr%%:*} chunk $chunk"
			if [[ $OPS != put ]]; then
				line+=" GET $(for _ in 1 2 3 4; do "$C" --addr "$tr" --no-progress state get --slot 0 -o /dev/null 2>&1 | rate; done | tr '\n' ' ')"
			fi
			if [[ $OPS != get ]]; then
				line+=" PUT $(for _ in 1 2 3; do "$C" --addr "$tr" --no-progress state put --slot 1 -i "$blob" 2>&1 | rate; done | tr '\n' ' ')"
			fi
			echo "$line"
		done
	done
	kill $pid; wait $pid 2>/dev/null
done
