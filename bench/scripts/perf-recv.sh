#!/usr/bin/env bash
# Where the receiving side of a STATE_PUT spends its CPU: recv-bench's
# receive loops (no engine) and the engine on the mock plugin, each under a
# system-wide `perf record` (cpu-clock at 1999 Hz plus syscall tracepoints),
# reported as CPU seconds and system calls per GB for every process, and the
# symbols of each that take at least 1/3 % of its samples. Machine-wide but
# needs no CUDA; made from the ninth session's experiment
# (bench/notes.md, 23).
#
# On a Go machine: make gpu-perf-pack (gpu/prof.tar.gz: unstripped engine,
# mock plugin, hydractl and recv-bench, this script, and the local perf with
# its libraries). On the GPU box, root:
#   tar -xzf gpu/prof.tar.gz -C /tmp && /tmp/prof/perf-recv.sh
# VARIANTS="serve ring-4x2048 …" (recv-bench's), N=6 transfers each; GMP="0 4"
# (GOMAXPROCS of the engine, 0 = Go's default); NET=unix: over a Unix socket
# (recv-bench -net unix, the engine on unix://), else TCP loopback. Another
# plugin than the mock: BIN (a directory with hydra-engine, hydractl and
# recv-bench, e.g. a `make gpu-pack-bench` unpacked, stripped: kernel symbols
# only), PLUGIN (its path) and PLUGIN_ARGS (engine flags: --model, its
# --backend-opt). Scheduler switches count as sched_switch per process. Results
# in $OUT (default out/).
D=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$D}
PLUGIN=${PLUGIN:-$BIN/hydra-plugin-mock}
PLUGIN_ARGS=${PLUGIN_ARGS---backend-opt kv_bytes_per_token=131072}
OUT=${OUT:-out}; mkdir -p "$OUT"
if [[ -x $D/lib/ld-linux-x86-64.so.2 ]]; then
	P() { "$D/lib/ld-linux-x86-64.so.2" --library-path "$D/lib" "$D/perf" "$@"; } # the pack's perf
else
	P() { perf "$@"; }
fi
echo "perf_event_paranoid $(cat /proc/sys/kernel/perf_event_paranoid), kptr_restrict $(cat /proc/sys/kernel/kptr_restrict)"
# No write(2) tracepoint: perf's own writes would trace themselves.
EV="-e cpu-clock/freq=1999/ -e sched:sched_switch -e syscalls:sys_enter_read -e syscalls:sys_enter_epoll_pwait -e syscalls:sys_enter_futex -e syscalls:sys_enter_sendmsg -e syscalls:sys_enter_setsockopt -e syscalls:sys_enter_splice --exclude-perf"
B=/tmp/perf-recv.blob; head -c 1206010394 /dev/zero > $B; cat $B > /dev/null
# rep NAME TRANSFERS: $OUT/NAME.txt from $OUT/NAME.data.
rep() {
	P script -i "$OUT/$1.data" -F sw:comm,pid,ip,sym -F trace:comm,pid,event 2>/dev/null | awk -f "$D/perf-agg.awk" > "$OUT/$1.syms" 2> "$OUT/$1.procs"
	{ echo "== $1: CPU s/GB per process ($2 transfers of 1.206 GB; samples at 1999 Hz)"
	  sort -nr "$OUT/$1.procs" | awk -v n="$2" '{printf "%-28s %6d samples %.3f s/GB  syscalls/GB:", $2, $1, $1/1999/(n*1.206); for (i=3;i<=NF;i++) {split($i,a,"="); printf " %s %d", a[1], a[2]/(n*1.206)}; print ""}'
	  sort -k1,1 -k2,2nr "$OUT/$1.syms"; } > "$OUT/$1.txt"
	rm -f "$OUT/$1.data" "$OUT/$1.data.old" "$OUT/$1.syms" "$OUT/$1.procs"
}
for v in ${VARIANTS-serve ring-4x2048 ring-4x2048-nodl ring-4x2048-nomsg}; do
	P record -a $EV -o "$OUT/$v.data" -- "$BIN/recv-bench" -net "${NET:-tcp}" -n "${N:-6}" -variants "$v" $B 2>&1 | grep -v '^\['
	rep "$v" "${N:-6}"
done
H=$BIN/hydractl
A=tcp://127.0.0.1:9611
[[ ${NET:-tcp} == unix ]] && A=unix:///tmp/perf-recv-engine.sock && rm -f /tmp/perf-recv-engine.sock
toks=$(python3 -c "print(','.join(str(3+(i*31)%250) for i in range(9200)))")
for g in ${GMP:-0}; do
	ge=(); [[ $g != 0 ]] && ge=(GOMAXPROCS=$g)
	# shellcheck disable=SC2086 # PLUGIN_ARGS are words
	env "${ge[@]}" "$BIN/hydra-engine" --rpc "$A" --backend "$PLUGIN" $PLUGIN_ARGS \
		--slots 2 --log-level warn > "$OUT/engine-$g.log" 2>&1 &
	e=$!
	for _ in $(seq 150); do "$H" --addr $A info > /dev/null 2>&1 && break; sleep 0.2; done
	"$H" --addr $A prefill --slot 0 --tokens "$toks" > /dev/null
	"$H" --addr $A --no-progress state get --slot 0 -o /tmp/perf-recv-engine.blob 2>&1 | tail -1
	name=engine-gomaxprocs$g
	P record -a $EV -o "$OUT/$name.data" -- bash -c "for i in 1 2 3 4 5 6; do $H --addr $A --no-progress state put --slot 1 -i /tmp/perf-recv-engine.blob 2>&1 | tail -1; done"
	rep "$name" 6
	kill $e; wait $e
done
rm -f $B /tmp/perf-recv-engine.blob
for f in "$OUT"/*.txt; do sed -n '1,4p' "$f"; done
