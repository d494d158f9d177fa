#!/usr/bin/env bash
# Issue 26 item 9 on the H200 box (CUDA 13 toolkit and CMake, no Go, no
# network): decode throughput at 1–32 concurrent streams, ours, Ollama and
# llama.cpp's batched decode, from binaries built on a Go machine with
# `make gpu-pack-decode` (gpu/decode-gpu.tar.xz: engine, llama plugin,
# llama-batched, ollama, gguf-gen, decode-bench and the ggml sources). Run
# it from a copy of the repository's working tree that carries that file
# (the script works from the repository's root, wherever it is called
# from); everything fits one 10-minute command:
#
#   bench/scripts/gpu-decode.sh
#
# Steps and their expected times on the H200 (16 cores):
#   unpack                                   ~10 s
#   libggml-cuda for sm_90 (make cuda's      ~3 min; the 2.43 GB model is
#   build-cuda.sh), model generated beside    generated meanwhile
#   decode-bench, SLOTS sequences            ~3 min: ours, Ollama (its
#                                             `ollama create` copies the
#                                             model, ~10 s), the ceiling twice
#   decode-bench, SLOTS2 sequences           ~1.5 min, throughput only; skipped
#                                             when less than SLOTS2_NEED s are left
#
# The library goes where each finds it: beside our plugin and llama-batched
# with hydra-ggml.version (the plugin refuses a library without the stamp),
# and into Ollama's layout, ROOT/bin/ollama with ROOT/lib/ollama/cuda_v13/
# (Ollama loads backends only from paths containing lib/ollama, and
# discovers GPUs by the libraries in lib/ollama's subdirectories).
#
# Variables (defaults): CONC (1,2,4,8,16,32), SLOTS (8), SLOTS2 (32; empty:
# no second run), N (128), P (512), CTX (4096: each sequence's context),
# REPS (1), JOINS (3), PREFIX_REPS (2), THREADS (8), CEILING_KV (both),
# MODEL_ARGS (the issue's 2.43 GB model), BUDGET (570: seconds the whole
# script may take), SLOTS2_NEED (120), DECODE_ARGS (more decode-bench
# flags). gpu/libcache/libggml-cuda.part-* (an earlier gpu-bench.sh
# SAVE_LIB=1) skips the CUDA build when the call can carry it.
#
# Results in $OUT (default out/): decode-h200.md/.svg/.json (and
# decode-h200-slotsSLOTS2.*), each run's log, the CUDA build log, and on a
# failure the servers' logs (NAME-*.log). The work directories (Ollama's
# store holds a copy of the model) stay in gpu/decode-run, out of $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.." # the repository's root: plugins/, gpu/
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
G=$PWD/gpu/decode-run
CONC=${CONC:-1,2,4,8,16,32}
SLOTS=${SLOTS:-8}
SLOTS2=${SLOTS2-32}
BUDGET=${BUDGET:-570}
SLOTS2_NEED=${SLOTS2_NEED:-120}
MODEL_ARGS=${MODEL_ARGS:--layers 24 -embd 2048 -heads 16 -kv-heads 4 -ff 5632 -vocab 32000 -ctx 8192 -f16}
t0=$(date +%s)
elapsed() { echo $(($(date +%s) - t0)); }
step() { echo; echo "=== $* ($(date -u +%T), +$(elapsed) s)"; }

step "unpack gpu/decode-gpu.tar.xz"
[[ -f gpu/decode-gpu.tar.xz ]] || { echo "no gpu/decode-gpu.tar.xz: run make gpu-pack-decode on a Go machine"; exit 1; }
rm -rf "$G" && mkdir -p "$G/src" && xz -dc gpu/decode-gpu.tar.xz | tar -x -C "$G" &&
	tar -xzf "$G/ollama-ggml-src.tar.gz" -C "$G/src" || exit 1

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nproc
nvcc --version 2>/dev/null | tail -1
ldd --version | head -1

step "model (in the background) and libggml-cuda for sm_90"
# shellcheck disable=SC2086 # MODEL_ARGS is a list of flags
("$G/gguf-gen" -o "$G/model.gguf" $MODEL_ARGS >"$OUT/gguf-gen.log" 2>&1; echo "exit $?" >>"$OUT/gguf-gen.log") &
gen=$!
if compgen -G "gpu/libcache/libggml-cuda.part-*" >/dev/null; then
	mkdir -p "$G/cuda" && cat gpu/libcache/libggml-cuda.part-* | xz -dc | tar -x -C "$G/cuda" || exit 1
	echo "libggml-cuda from gpu/libcache"
else
	start=$(date +%s)
	plugins/cuda-llama/build-cuda.sh "$G/src" "$G/cuda" 90 build/cuda90 "" >"$OUT/cuda90-build.log" 2>&1 ||
		{ tail -30 "$OUT/cuda90-build.log"; exit 1; }
	echo "sm_90 build: $(($(date +%s) - start)) s"
fi
wait "$gen"
cat "$OUT/gguf-gen.log"
grep -q "^exit 0" "$OUT/gguf-gen.log" || exit 1
ls -la "$G/model.gguf" "$G"/cuda/

# Beside our plugin and llama-batched, stamped; and Ollama's layout.
cp -P "$G"/cuda/libggml-cuda.so "$G"/cuda/libggml-base.so* "$G"/cuda/hydra-ggml.version "$G"/
R=$G/ollama-root
mkdir -p "$R/bin" "$R/lib/ollama/cuda_v13"
mv "$G/ollama" "$G/ollama.cflags" "$R/bin/"
cp -P "$G"/cuda/libggml-cuda.so "$G"/cuda/libggml-base.so* "$R/lib/ollama/cuda_v13/"
export OLLAMA_LIBRARY_PATH=$R/lib/ollama

# bench SLOTS NAME ARGS...: decode-bench on all of CONC with SLOTS
# sequences, the page and raw results as $OUT/NAME.*.
bench() {
	local slots=$1 name=$2
	shift 2
	step "decode-bench: $name, slots $slots, c $CONC"
	# shellcheck disable=SC2086 # DECODE_ARGS is a list of flags
	"$G/decode-bench" -bin "$G" -ollama "$R/bin/ollama" -model "$G/model.gguf" -c "$CONC" -slots "$slots" \
		-n "${N:-128}" -p "${P:-512}" -ctx "${CTX:-4096}" -reps "${REPS:-1}" -threads "${THREADS:-8}" \
		-out "$OUT" -name "$name" -raw "$OUT/$name.json" -work "$G/work-$name" "$@" ${DECODE_ARGS:-} 2>&1 |
		tee "$OUT/$name.log"
	local rc=${PIPESTATUS[0]} f
	if [[ $rc != 0 ]]; then
		for f in "$G/work-$name"/*.log; do [[ -f $f ]] && cp "$f" "$OUT/$name-$(basename "$f")"; done
	fi
	rm -rf "$G/work-$name" # Ollama's store: a 2.4 GB copy of the model
	return "$rc"
}

bench "$SLOTS" decode-h200 -joins "${JOINS:-3}" -prefix-reps "${PREFIX_REPS:-2}" -ceiling-kv "${CEILING_KV:-both}"
rc=$?
if [[ -n $SLOTS2 ]]; then
	if (($(elapsed) + SLOTS2_NEED <= BUDGET)); then
		bench "$SLOTS2" "decode-h200-slots$SLOTS2" -systems ours,ollama -joins 0 -prefix-reps 0 || rc=1
	else
		echo "skipping slots $SLOTS2: $(elapsed) s gone of $BUDGET, it needs ~$SLOTS2_NEED"
	fi
fi
step "done, rc $rc"
ls -la "$OUT"
exit "$rc"
