#!/bin/bash
# On the GPU box: hydra-bench --targets-only tables (REPS=8) of variants in the
# order given, then bench/scripts/targets-summary.py over all of them, tables in
# $OUT/<n><variant>/. Variants (bench/notes.md 35, 36, 40, 41; the variants C,
# E, O and R of those notes set engine flags that are gone):
#   A  the defaults
#   B  hydra-bench (the client) on CPUs 0-1, the engines and a raw server process on 2-15
#   D  the client on CPU 3 alone (with its hyperthread siblings, if any, left empty), the rest as B
#   W  the defaults on a host with net.core.wmem_default 4194304 (the client's
#      send buffer, since it sets none; docs/operators.md), restored after
#   X  the same with net.core.wmem_default 8388608 (the window S gives: the
#      kernel doubles an SO_SNDBUF request, not the sysctl)
#   S  the client's Unix sockets ask for 4 MiB SO_SNDBUF/SO_RCVBUF (--client-sockbuf)
# e.g. bench/scripts/gpu-table-ab.sh A S S A A S S A   (~40 s a table after the pack is unpacked)
# Needs the bench pack (make gpu-pack-bench) and gpu/libcache, as gpu-bench.sh bench.
set -uo pipefail
cd "$(dirname "$0")/../.." # the repository's root: gpu/
S=bench/scripts
OUT=${OUT:-out}
if [ -f gpu/run/libggml-cuda.so ]; then tar -xf gpu/hydra-gpu.tar.gz -C gpu/run || exit 1; fi
# others: every CPU hydra-bench may use but CPU 3 and its hyperthread siblings.
others() {
	python3 -c "
import os
s = set()
for p in open('/sys/devices/system/cpu/cpu3/topology/thread_siblings_list').read().strip().split(','):
    a, _, b = p.partition('-')
    s.update(range(int(a), int(b or a) + 1))
print(','.join(str(c) for c in sorted(os.sched_getaffinity(0)) if c not in s))"
}
i=0
for v in "$@"; do
	i=$((i + 1))
	o=$(mktemp -d)
	case $v in
	A) args=() ;;
	B) args=(CLIENT_CPUS=0-1 BENCH_ARGS="--raw-server process --server-cpus 2-15") ;;
	D) args=(CLIENT_CPUS=3 BENCH_ARGS="--raw-server process --server-cpus $(others)") ;;
	S) args=(BENCH_ARGS="--client-sockbuf 4194304") ;;
	W) args=() size=4194304 ;;
	X) args=() size=8388608 ;;
	*) echo "unknown variant $v" >&2; exit 2 ;;
	esac
	echo "$i$v: ${args[*]}"
	wmem=$(cat /proc/sys/net/core/wmem_default)
	if [[ $v == [WX] ]]; then
		echo "$size" > /proc/sys/net/core/wmem_default || { echo "cannot set net.core.wmem_default" >&2; exit 1; }
	fi
	env OUT="$o" TARGETS_ONLY=1 REPS=8 "${args[@]}" "$S/gpu-bench.sh" bench > "$o/log" 2>&1
	echo "$wmem" > /proc/sys/net/core/wmem_default 2>/dev/null
	mkdir -p "$OUT/$i$v" && cp "$o"/*.md "$OUT/$i$v/" || { tail -20 "$o/log"; exit 1; }
	echo "$i$v: $(grep -o 'throughput target met in [0-9]* of [0-9]*' "$o"/*.md) ($(date -u +%T))"
done
python3 "$S/targets-summary.py" "$OUT"/*/*.md
