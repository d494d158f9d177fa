#!/usr/bin/env bash
# Issue 5's GPU run, on a machine with the CUDA toolkit and CMake but no Go
# (the `device` H200 box), from a copy of the repository's working tree (the
# script works from the repository's root, wherever it is called from). Run
# `make gpu-pack` on a Go machine first: it puts the binaries (hydra-bench and
# recv-bench built from bench/), the test binaries and the ggml sources in
# gpu/hydra-gpu.tar.gz (`make gpu-pack-bench`: the bench modes' binaries only,
# small enough to carry beside gpu/libcache, a library saved by an earlier
# SAVE_LIB=1 call). The target tables, three of them with a verdict over all:
#
#   TARGETS_ONLY=1 REPS=8 RUNS=3 bench/scripts/gpu-bench.sh bench
#
#   bench/scripts/gpu-bench.sh build   # libggml-cuda for sm_90, GPU correctness tests, raw copy rate, sm_120 compile (SKIP_SM120=1: not; GPU_TESTS=REGEXP: those plugin tests only, verbose; E2E=0: no end-to-end tests; PLUGIN_BENCH=0: no plugin benchmarks)
#   bench/scripts/gpu-bench.sh bench   # hydra-bench on a 1.2 GB llama state (MODEL=qwen35moe: a hybrid one; builds the sm_90 library if missing; RUNS=N tables in a row; BENCH_OPTS=key=value: one more --backend-opt; BENCH_ARGS: more hydra-bench flags, e.g. "--client-sockbuf 4194304"; TARGETS_ONLY=1: only the rows the targets name, e.g. with REPS=8; with RUNS>1 bench/scripts/targets-summary.py sums the tables up; CLIENT_CPUS=LIST: hydra-bench under taskset, e.g. with BENCH_ARGS="--raw-server process --server-cpus 2-15")
#   bench/scripts/gpu-bench.sh mock    # hydra-bench on the mock plugin (no CUDA build): the host pipeline with 16 cores (RUNS, REPS, TARGETS_ONLY, BENCH_ARGS as for bench)
#   bench/scripts/gpu-bench.sh recv    # recv-bench on a 1.2 GB file, twice (no CUDA build): the host's receive loop against a raw one (VARIANTS; NET=unix: over a Unix socket; SOCKBUF=N: the sender asks for that SO_SNDBUF)
#   bench/scripts/gpu-bench.sh plugin-ab PLUGIN... # STATE_PUT with llama plugin binaries of different builds, same run (a b … b a, ROUNDS times; TCP and Unix; CHUNKS, default "262144 2097152")
#   bench/scripts/gpu-bench.sh variant-ab NAME=DIR[:FLAGS]... # STATE_PUT and STATE_GET (OPS) with engine and plugin builds from DIR and engine FLAGS, same run, debug logs in $OUT
#   SAVE_LIB=1 ...             # after building libggml-cuda, put it in $OUT/libcache (xz, 15 MiB parts); carried back as gpu/libcache, later calls skip the build
#   bench/scripts/gpu-bench.sh all     # both, in one command (~11 min on the H200; split it where a command is capped at 10)
#
# Results go to $OUT (default out/).
set -uo pipefail
cd "$(dirname "$0")/../.." # the repository's root: plugins/, gpu/
S=bench/scripts
OUT=${OUT:-out}
mkdir -p "$OUT"
G=$PWD/gpu/run
step() { echo; echo "=== $* ($(date -u +%T))"; }
# tables NAME WHAT REPS ARGS...: RUNS (default 1) hydra-bench tables
# NAME.md, NAME-2.md, … with ARGS, CLIENT_CPUS, TARGETS_ONLY and BENCH_ARGS,
# then, with RUNS > 1, bench/scripts/targets-summary.py over them.
tables() {
	local base=$1 what=$2 reps=$3 name run
	shift 3
	for ((run = 1; run <= ${RUNS:-1}; run++)); do
		name=$base
		((run > 1)) && name=$base-$run
		step "hydra-bench ($name), $what, TCP and Unix, STATE_GET and STATE_PUT"
		# shellcheck disable=SC2086 # CLIENT_CPUS is one word or none
		${CLIENT_CPUS:+taskset -c $CLIENT_CPUS} "$G/hydra-bench" --bin "$G" --out "$OUT" --name "$name" --reps "$reps" \
			"$@" ${TARGETS_ONLY:+--targets-only} ${BENCH_ARGS:-} 2>&1 | tee "$OUT/$name.log" | tail -60
		grep -h '^- \*\*shm\*\*' "$OUT/$name.md" 2>/dev/null
	done
	if ((${RUNS:-1} > 1)); then
		step "the targets over the $RUNS tables ($S/targets-summary.py)"
		python3 "$S/targets-summary.py" "$OUT/$base.md" "$OUT/$base"-[0-9]*.md | tee "$OUT/targets-summary.txt"
	fi
}

case ${1:-} in
all)
	"$0" build && "$0" bench
	;;
build)
	rm -rf "$G" && mkdir -p "$G/src" && tar -xf gpu/hydra-gpu.tar.gz -C "$G" && tar -xzf "$G/llama-cuda-src.tar.gz" -C "$G/src" || exit 1
	step "machine"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc; nvcc --version | tail -2; ldd --version | head -1
	step "build libggml-cuda, sm_90"
	start=$(date +%s)
	plugins/cuda-llama/build-cuda.sh "$G/src" "$G" 90 build/cuda90 "" > "$OUT/cuda90-build.log" 2>&1 || { tail -30 "$OUT/cuda90-build.log"; exit 1; }
	echo "sm_90 build: $(( $(date +%s) - start )) s"; ls -la "$G"/libggml-*
	if [[ ${SAVE_LIB:-} == 1 ]]; then
		# Back through $OUT in parts of 15 MiB, as the bench step's below.
		mkdir -p "$OUT/libcache" && (cd "$G" && tar -c libggml-cuda.so libggml-base.so* hydra-ggml.version | xz -T0 -6) \
			| split -b 15M -d - "$OUT/libcache/libggml-cuda.part-"
	fi
	# sm_120 compiles in the background (no such GPU here), niced, while the tests run.
	# SKIP_SM120=1 leaves it out (it competes with the tests for the cores).
	[[ ${SKIP_SM120:-} == 1 ]] || ( start=$(date +%s); nice -n 10 plugins/cuda-llama/build-cuda.sh "$G/src" "$G/sm120" 120 build/cuda120 "" > "$OUT/cuda120-build.log" 2>&1; \
	  echo "exit $? after $(( $(date +%s) - start )) s" >> "$OUT/cuda120-build.log" ) &
	step "raw GPU -> host copy, 1.206 GB pinned"
	python3 - <<'PY' 2>&1 | tee "$OUT/raw-copy.txt"
import torch, time
n = 1206 * 1000 * 1000 // 2
x = torch.randn(n, dtype=torch.float16, device="cuda")
for pinned in (True, False):
    h = torch.empty(n, dtype=torch.float16, pin_memory=pinned)
    best = 1e9
    for _ in range(3):
        torch.cuda.synchronize(); t = time.perf_counter(); h.copy_(x, non_blocking=pinned); torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    print(f"GPU->host {'pinned' if pinned else 'pageable'}: {2*n/best/1e9:.1f} GB/s")
PY
	step "plugin tests on the GPU (HYDRA_TEST_REQUIRE_GPU=1)"
	# GPU_TESTS=REGEXP: only those plugin tests (-test.run), with their logs.
	ntail=25; [[ -n ${GPU_TESTS:-} ]] && ntail=150
	(cd "$G" && HYDRA_TEST_REQUIRE_GPU=1 HYDRA_TEST_LLAMA_LIB_DIR="$G" timeout 240 ./cuda-llama.test -test.count=1 -test.timeout 230s \
		${GPU_TESTS:+-test.run "$GPU_TESTS" -test.v} 2>&1 | grep -v '^=== ' | tail -$ntail) | tee "$OUT/plugin-gpu-tests.txt"
	# E2E=0 and PLUGIN_BENCH=0 leave out the steps below up to the sm_120 compile.
	if [[ ${E2E:-1} != 0 ]]; then
		step "end-to-end llama tests on the GPU (engine + plugin processes)"
		HYDRA_TEST_BIN="$G" HYDRA_TEST_LLAMA_OPTS="lib_dir=$G n_gpu_layers=99" timeout 180 "$G/tests.test" -test.run '^TestLlama' -test.count=1 -test.v 2>&1 \
			| grep -E '^(=== RUN|--- |PASS|FAIL|ok)|device|CUDA|cuda' | tail -40 | tee "$OUT/e2e-gpu-tests.txt"
		grep -i "cuda\|gpu\|pinned" "$OUT/e2e-gpu-tests.txt" | head -3
	fi
	[[ ${PLUGIN_BENCH:-1} == 0 ]] && { wait; exit 0; }
	step "plugin STATE_GET/PUT on a 1.206 GB state (32 layers, 1024 dim, 8 KV heads, f16)"
	(cd "$G" && HYDRA_TEST_LLAMA_LIB_DIR="$G" HYDRA_BENCH_MODEL=32,1024,8,8,1024 HYDRA_BENCH_TOKENS=9200 timeout 200 ./cuda-llama.test -test.run '^$' -test.bench . -test.benchtime 3x 2>&1 | tail -20) | tee "$OUT/plugin-gpu-bench.txt"
	step "plugin STATE_GET/PUT on a 1.2 GB hybrid state (qwen35moe: 32 blocks, every 4th attention, 1024 dim, 8 KV heads, f16)"
	(cd "$G" && HYDRA_TEST_LLAMA_LIB_DIR="$G" HYDRA_BENCH_ARCH=qwen35moe HYDRA_BENCH_MODEL=32,1024,8,8,1024 HYDRA_BENCH_TOKENS=36800 timeout 200 ./cuda-llama.test -test.run '^$' -test.bench . -test.benchtime 3x 2>&1 | tail -20) | tee "$OUT/plugin-gpu-bench-qwen35moe.txt"
	step "sm_120 compile"
	wait; tail -3 "$OUT/cuda120-build.log"; ls -la "$G"/sm120/libggml-cuda.so 2>&1
	;;
mock)
	rm -rf "$G" && mkdir -p "$G" && tar -xf gpu/hydra-gpu.tar.gz -C "$G" || exit 1
	step "socket limits"; sysctl net.core.wmem_max net.core.rmem_max net.core.wmem_default net.ipv4.tcp_wmem 2>&1
	tables mock-h200 "mock plugin: 1.206 GB state" "${REPS:-3}"
	;;
recv)
	rm -rf "$G" && mkdir -p "$G" && tar -xf gpu/hydra-gpu.tar.gz -C "$G" || exit 1
	head -c 1206010394 /dev/zero > /tmp/recv-bench.blob && cat /tmp/recv-bench.blob > /dev/null
	for _ in 1 2; do "$G/recv-bench" ${NET:+-net "$NET"} ${SOCKBUF:+-sockbuf "$SOCKBUF"} ${VARIANTS:+-variants "$VARIANTS"} /tmp/recv-bench.blob; done 2>&1 | tee "$OUT/recv-bench.txt"
	rm -f /tmp/recv-bench.blob
	;;
plugin-ab|variant-ab|bench)
	if [[ ! -f $G/libggml-cuda.so ]]; then
		rm -rf "$G" && mkdir -p "$G/src" && tar -xf gpu/hydra-gpu.tar.gz -C "$G" && tar -xzf "$G/llama-cuda-src.tar.gz" -C "$G/src" || exit 1
		if compgen -G "gpu/libcache/libggml-cuda.part-*" >/dev/null; then
			# A library built by an earlier call (SAVE_LIB=1), carried back: the
			# ~3 min build is most of a short A/B's device time.
			step "libggml-cuda from gpu/libcache"
			cat gpu/libcache/libggml-cuda.part-* | xz -dc | tar -x -C "$G" || exit 1
		else
			step "build libggml-cuda, sm_90"
			plugins/cuda-llama/build-cuda.sh "$G/src" "$G" 90 build/cuda90 "" > "$OUT/cuda90-build.log" 2>&1 || { tail -30 "$OUT/cuda90-build.log"; exit 1; }
			if [[ ${SAVE_LIB:-} == 1 ]]; then
				# Back through $OUT in parts of 15 MiB (its per-file limit is 16).
				mkdir -p "$OUT/libcache" && (cd "$G" && tar -c libggml-cuda.so libggml-base.so* hydra-ggml.version | xz -T0 -6) \
					| split -b 15M -d - "$OUT/libcache/libggml-cuda.part-"
				ls -la "$G/libggml-cuda.so" "$OUT"/libcache/
			fi
		fi
	fi
	# MODEL=qwen35moe: the Hydra nodes' hybrid architecture (every 4th block
	# attention, the others gated DeltaNet), 32 KiB of KV per token, so the
	# state is 1.2 GB at 36,800 tokens; else the dense model below.
	if [[ ${MODEL:-} == qwen35moe ]]; then
		ntok=36800 nctx=74000 what="36,800 tokens → 1.2 GB hybrid (qwen35moe) state"
		step "synthetic model: qwen35moe, 32 blocks (8 attention), 1024 dim, 8 KV heads, 8 experts, f16"
		"$G/gguf-gen" -o "$G/synth.gguf" -arch qwen35moe -layers 32 -embd 1024 -heads 8 -kv-heads 8 -head-dim 128 -experts 8 -experts-used 2 \
			-expert-ff 256 -shared-ff 256 -vocab 1024 -ctx 40960 -f16 || exit 1
	else
		ntok=9200 nctx=18688 what="9,200 tokens → 1.206 GB state"
		step "synthetic model: 32 layers, 1024 dim, 8 heads, 8 KV heads, f16 (128 KiB of KV per token)"
		"$G/gguf-gen" -o "$G/synth.gguf" -layers 32 -embd 1024 -heads 8 -kv-heads 8 -ff 1024 -vocab 1024 -ctx 16384 -f16 || exit 1
	fi
	toks=$(python3 -c "print(','.join(str(3+(i*31)%250) for i in range($ntok)))")
	# llama_engine SOCK LOG ARGS...: a llama engine ($engine, default the
	# pack's, on $plugin, likewise) on unix://SOCK (and ARGS), logging to the
	# end of LOG, ready and with 9,200 tokens prefilled in slot 0; its pid in
	# $epid.
	llama_engine() {
		local sock=$1 log=$2; shift 2; rm -f "$sock"
		"${engine:-$G/hydra-engine}" --rpc "unix://$sock" --backend "${plugin:-$G/hydra-plugin-cuda-llama}" --model "$G/synth.gguf" "$@" >> "$log" 2>&1 &
		epid=$!
		for _ in $(seq 100); do "$G/hydractl" --addr "unix://$sock" info >/dev/null 2>&1 && break; sleep 0.2; done
		"$G/hydractl" --addr "unix://$sock" prefill --slot 0 --tokens "$toks" >/dev/null
	}
	# ab_order N: order=(0 1 … N-1 N-1 … 0), ROUNDS times (default once).
	ab_order() {
		order=()
		for ((r = 0; r < ${ROUNDS:-1}; r++)); do
			for ((i = 0; i < $1; i++)); do order+=("$i"); done
			for ((i = $1 - 1; i >= 0; i--)); do order+=("$i"); done
		done
	}
	# transfers NAME SOCK PORT BLOB OP...: for each of CHUNKS, over Unix and
	# TCP, a line of NAME's GB/s for 3 transfers of each OP (PUT of BLOB into
	# slot 1, or GET of slot 0), as hydractl timed them.
	transfers() {
		local name=$1 sock=$2 port=$3 blob=$4 chunk tr op; shift 4
		for chunk in ${CHUNKS:-262144 2097152}; do
			"$G/hydractl" --addr "unix://$sock" configure "{\"state_chunk_size\":$chunk}" >/dev/null
			for tr in "unix://$sock" "tcp://127.0.0.1:$port"; do
				for op in "$@"; do
					echo "$name ${tr%%:*} chunk $chunk $op $(for _ in 1 2 3; do
						if [[ ${op,,} == put ]]; then "$G/hydractl" --addr "$tr" --no-progress state put --slot 1 -i "$blob" 2>&1
						else "$G/hydractl" --addr "$tr" --no-progress state get --slot 0 -o /dev/null 2>&1; fi \
							| grep -o '([0-9.]* GB/s)' | tr -d '()GB/s '; done | tr '\n' ' ')"
				done
			done
		done
	}
	if [[ $1 == variant-ab ]]; then
		# Variants as arguments, NAME=DIR[:FLAGS]: DIR's hydra-engine and
		# hydra-plugin-cuda-llama where it has them (else the pack's), engine
		# FLAGS added; run a b … b a, ROUNDS times. Each engine logs at debug
		# level: the host's "state transfer" lines carry backend_wait_seconds,
		# the plugin's "state put" lines its prefetcher's waits.
		shift; specs=("$@")
		[[ ${#specs[@]} -ge 2 ]] || { echo "variant-ab: give two variants or more" >&2; exit 2; }
		ab_order ${#specs[@]}
		blob=/dev/shm/hydra-variant-ab.blob
		for v in "${order[@]}"; do
			spec=${specs[v]} name=${spec%%=*} rest=${spec#*=} dir=${rest%%:*} flags=
			[[ $rest == *:* ]] && flags=${rest#*:}
			engine=$G/hydra-engine plugin=$G/hydra-plugin-cuda-llama
			[[ -x $dir/hydra-engine ]] && engine=$(realpath "$dir/hydra-engine")
			[[ -x $dir/hydra-plugin-cuda-llama ]] && plugin=$(realpath "$dir/hydra-plugin-cuda-llama")
			sock=/tmp/hydra-variant-$v.sock port=$((39600 + RANDOM % 200))
			# shellcheck disable=SC2086 # FLAGS are words
			llama_engine "$sock" "$OUT/engine-$name.log" --rpc "tcp://127.0.0.1:$port" \
				--slots 2 --backend-opt lib_dir="$G" --backend-opt n_ctx=$nctx --log-level debug $flags
			[[ -f $blob ]] || "$G/hydractl" --addr "unix://$sock" --no-progress state get --slot 0 -o "$blob" >/dev/null
			# shellcheck disable=SC2086 # OPS are words
			transfers "$name" "$sock" "$port" "$blob" ${OPS:-put get}
			kill $epid; wait $epid
		done
		rm -f "$blob"
		step "where the time went ($S/variant-ab-summary.py)"
		python3 "$S/variant-ab-summary.py" "$OUT"
		exit 0
	fi
	if [[ $1 == plugin-ab ]]; then
		blob=/dev/shm/hydra-put-ab.blob
		# Plugin binaries as arguments, named a, b, ...: a b … b a.
		shift; plugins=("$@") names=(a b c d e f)
		[[ ${#plugins[@]} -ge 2 ]] || { echo "plugin-ab: give two plugin binaries or more" >&2; exit 2; }
		ab_order ${#plugins[@]}
		for ((i = 0; i < ${#plugins[@]}; i++)); do echo "${names[i]} = ${plugins[i]}"; done
		for v in "${order[@]}"; do
			name=${names[v]} plugin=$(realpath "${plugins[v]}") flag=(--backend-opt "lib_dir=$G" --log-level debug)
			sock=/tmp/hydra-put-$v.sock port=$((39600 + RANDOM % 200))
			: > "$OUT/engine-$name.log"
			llama_engine "$sock" "$OUT/engine-$name.log" --rpc "tcp://127.0.0.1:$port" \
				--slots 2 --backend-opt n_ctx=$nctx --log-level warn "${flag[@]}"
			[[ -f $blob ]] || "$G/hydractl" --addr "unix://$sock" --no-progress state get --slot 0 -o "$blob" >/dev/null
			transfers "$name" "$sock" "$port" "$blob" PUT
			kill $epid; wait $epid
		done
		rm -f "$blob"
		grep -ho 'ring_pinned=[a-z]*\|ring=[0-9]*' "$OUT"/engine-*.log 2>/dev/null | sort | uniq -c
		exit 0
	fi
	step "socket limits"; sysctl net.core.wmem_max net.core.wmem_default 2>&1
	# RUNS=N measures N tables after one build (gpu-h200.md, gpu-h200-2.md, …):
	# runs of one code on one machine differ by more than a target's margin
	# (bench/notes.md), and the build is most of a call's time.
	tables "gpu-h200${MODEL:+-$MODEL}" "$what" "${REPS:-2}" \
		--backend "$G/hydra-plugin-cuda-llama" --model "$G/synth.gguf" --prefill-tokens "$ntok" \
		--backend-opt lib_dir="$G" --backend-opt n_gpu_layers=99 --backend-opt n_ctx="$nctx" --backend-opt n_threads=8 \
		${BENCH_OPTS:+--backend-opt "$BENCH_OPTS"}
	;;
*)
	echo "usage: $0 build|bench|mock|recv|plugin-ab PLUGIN...|variant-ab NAME=DIR[:FLAGS]...|all" >&2; exit 2 ;;
esac
