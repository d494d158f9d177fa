#!/usr/bin/env bash
# Issue 26 item 9 on the H200 box (CUDA 13 toolkit and CMake, no Go, no
# network): decode throughput at 1–32 concurrent streams, ours, Ollama and
# llama.cpp's batched decode, and ours decoding beside STATE_GETs of a 1.2 GB
# slot (issue 26's "≥ 0.8 of the aggregate without"), from binaries built on
# a Go machine with `make gpu-pack-decode` (gpu/decode-gpu.tar.xz: engine,
# llama plugin, llama-batched, ollama, gguf-gen, decode-bench and the ggml
# sources). Run it from a copy of the repository's working tree that carries
# that file (the script works from the repository's root, wherever it is
# called from); everything fits one 10-minute command:
#
#   bench/scripts/gpu-decode.sh
#
# Steps and their expected times on the H200 (16 cores):
#   unpack                                   ~10 s
#   libggml-cuda for sm_90 (make cuda's      ~3 min, or seconds when carried
#   build-cuda.sh), model generated beside    (below); the 2.43 GB model is
#                                             generated meanwhile
#   decode-bench, SLOTS sequences            ~3 min: ours, Ollama (its
#                                             `ollama create` copies the
#                                             model, ~10 s), the ceiling twice
#     and decode beside STATE_GETs           ~1 min (an estimate: two more
#                                             engine starts, a 24k-token
#                                             prefill, 2 × STATE_REPS rounds)
#   decode-bench, SLOTS2 sequences           ~1.5 min, throughput only; skipped
#                                             when less than SLOTS2_NEED s are left
#
# The library goes where each finds it: beside our plugin and llama-batched
# with hydra-ggml.version (the plugin refuses a library without the stamp),
# and into Ollama's layout, ROOT/bin/ollama with ROOT/lib/ollama/cuda_v13/
# (Ollama loads backends only from paths containing lib/ollama, and
# discovers GPUs by the libraries in lib/ollama's subdirectories). The
# library is built from the plugin's llama.cpp tree (mk/llama-pin.mk), while
# llama-batched and Ollama are built from the Ollama module's (bench/go.mod):
# llama-batched refuses it by its stamp and runs on the CPU, and Ollama's
# ggml does not match it, so their rows need a library of their own tree.
#
# Variables (defaults): CONC (1,2,4,8,16,32), SLOTS (8), SLOTS2 (32; empty:
# no second run), N (128), P (512), CTX (4096: each sequence's context),
# REPS (1), JOINS (3), PREFIX_REPS (2), THREADS (8), CEILING_KV (both),
# MODEL_ARGS (the issue's 2.43 GB model), BUDGET (570: seconds the whole
# script may take), SLOTS2_NEED (120), DECODE_ARGS (more decode-bench flags
# for both runs), AB_OPT (empty; k=v,...: after the first run, ours alone
# again at SLOTS with -ours-opt AB_OPT, as decode-h200-ab, so that an option
# is measured beside the default on one machine), DRAFT (empty; a gguf-gen
# weight type such as q4_0: the model at that type as both servers' draft
# model; mtp, with PRESET=qwen35moe: the model with its MTP block, both
# servers' --spec-type draft-mtp; DRAFT_MAX (8) tokens a draft; PLAIN_TOO=1: then the same run
# without drafts, the page decode-h200-plain.md), LONG_P (empty; N: after the
# first run, the prefill of an N-token prompt, one stream in one slot, ours
# and llama-server, LONG_REPS (2) times), CACHE_P (empty; N: after the first
# run, the time to first token of a request whose N-token prefix left its one
# slot, ours with the host-memory prompt cache (CACHE_RAM MiB, 8192) and
# without, CACHE_REPS (3) rounds each: the page decode-h200-cache.md),
# CKPT_P (empty; N[,N…]: after the first run, one slot holding an N-token
# prompt and 4 generated, then a prompt that parts from it (A + 64, A again,
# A cut 200 + 64), ours and llama-server, CKPT_REPS (2) times: prompt tokens
# each evaluated and the times, the page decode-h200-ckpt.md), AGENT_P
# (empty; N[,N…]: after the first run, an agent's conversation of AGENT_TURNS
# (9) turns on /v1/chat/completions from a system prompt of about N tokens,
# one slot, ours and llama-server, AGENT_REPS (2) conversations: each turn's
# prompt tokens evaluated and time to first token, the page
# decode-h200-agent.md; the model gets the pack's Qwen3 tokenizer and chat
# template, tokenizer-qwen3/, for it and CKPT_P alike), MAIN (1; 0:
# leave out the first run and the SLOTS2 run, e.g. CACHE_P alone).
# The state measurement, in the first run: STATE_GET_BYTES
# (1200000000; 0 or empty: off), STATE_C (8: slot 0 and 7 streams), STATE_N
# (512 tokens a stream, so that a round spans many transfers), STATE_REPS (2
# pairs of rounds). SAVE_LIB=1: after building libggml-cuda here, return it
# in $OUT as libcache-part-NN (xz, 15 MiB parts); a later call that carries
# them as gpu/libcache-part-* (or gpu/libcache/libggml-cuda.part-*, an
# earlier gpu-bench.sh SAVE_LIB=1) skips the build.
#
# Results: the device returns at most 8 files, so everything is written in
# gpu/decode-out and only these are copied into $OUT (default out/), in this
# order while they fit: decode-h200.md, decode-h200-ab.md, libcache-part-*
# (SAVE_LIB=1), the two pages' .json, decode-h200.svg,
# decode-h200-slotsSLOTS2.md/.json/.svg, and always gpu-decode.log: the whole
# output, the model's and the CUDA build's logs, on a failure the servers'
# logs, and any page that did not fit, in full. The work directories
# (Ollama's store holds a copy of the model) stay in gpu/decode-run.
set -uo pipefail
cd "$(dirname "$0")/../.." # the repository's root: plugins/, gpu/
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
G=$PWD/gpu/decode-run
W=$PWD/gpu/decode-out
LOG=$W/gpu-decode.log
MAX_FILES=8 # what the device returns
CONC=${CONC:-1,2,4,8,16,32}
SLOTS=${SLOTS:-8}
SLOTS2=${SLOTS2-32}
BUDGET=${BUDGET:-570}
SLOTS2_NEED=${SLOTS2_NEED:-120}
STATE_GET_BYTES=${STATE_GET_BYTES-1200000000}
# PRESET=qwen35moe: the Hydra nodes' architecture at production width (40
# blocks, every 4th attention with 2 KV heads of 256, the others gated
# DeltaNet, 2048 wide), 64 experts of 512 (8 used) and a shared one, Q4_0:
# ~5 GB, generated within a call (the production model has 256 experts).
case ${PRESET:-} in
qwen35moe) MODEL_ARGS=${MODEL_ARGS:--arch qwen35moe -layers 40 -embd 2048 -heads 16 -kv-heads 2 -head-dim 256 -experts 64 -experts-used 8 -expert-ff 512 -shared-ff 512 -vocab 32000 -ctx 131072 -type q4_0} ;;
esac
MODEL_ARGS=${MODEL_ARGS:--layers 24 -embd 2048 -heads 16 -kv-heads 4 -ff 5632 -vocab 32000 -ctx 8192 -f16}
# DRAFT=mtp: the model carries its MTP block (qwen35moe only).
[[ ${DRAFT:-} == mtp ]] && MODEL_ARGS="$MODEL_ARGS -mtp 1"
# An agent's conversation needs a chat template: Qwen3's, with its tokenizer,
# whose vocabulary (151,669) replaces the generated one's size.
if [[ -n ${AGENT_P:-}${CKPT_P:-} ]]; then
	MODEL_ARGS="$(sed -E 's/(^| )-vocab [0-9]+/ /' <<<"$MODEL_ARGS") -tokenizer $G/tokenizer-qwen3"
fi
t0=$(date +%s)
elapsed() { echo $(($(date +%s) - t0)); }
step() { echo; echo "=== $* ($(date -u +%T), +$(elapsed) s)"; }

# carriedLib lists the parts of a library an earlier call returned, in order:
# under the names the device returns them with, or gpu-bench.sh's.
carriedLib() {
	if compgen -G "gpu/libcache-part-*" >/dev/null; then
		printf '%s\n' gpu/libcache-part-*
	elif compgen -G "gpu/libcache/libggml-cuda.part-*" >/dev/null; then
		printf '%s\n' gpu/libcache/libggml-cuda.part-*
	fi
}

# cudaLib puts libggml-cuda and its stamps in $G/cuda: unpacked from a
# carried library, else built (and with SAVE_LIB=1 packed into $W for $OUT).
cudaLib() {
	local parts start
	mapfile -t parts < <(carriedLib)
	# A library gpu-bench.sh built on this machine (a warm one: the call
	# before), from the same sources.
	if [[ -f gpu/run/libggml-cuda.so && -f gpu/run/hydra-ggml.version && -f $G/src/hydra-ggml.version &&
		"$(<gpu/run/hydra-ggml.version)" == "$(<"$G/src/hydra-ggml.version")" ]]; then
		mkdir -p "$G/cuda" && cp -P gpu/run/libggml-cuda.so gpu/run/libggml-base.so* gpu/run/hydra-* "$G/cuda/" || return 1
		echo "libggml-cuda from gpu/run (built by an earlier call on this machine): $(cat gpu/run/hydra-ggml.version)"
		return 0
	fi
	# This script's own, kept by the call before on this (warm) machine.
	if [[ -f gpu/decode-libkeep/hydra-ggml.version && -f $G/src/hydra-ggml.version &&
		"$(<gpu/decode-libkeep/hydra-ggml.version)" == "$(<"$G/src/hydra-ggml.version")" ]]; then
		mkdir -p "$G/cuda" && cp -P gpu/decode-libkeep/* "$G/cuda/" || return 1
		echo "libggml-cuda from gpu/decode-libkeep (built by an earlier call on this machine): $(cat gpu/decode-libkeep/hydra-ggml.version)"
		return 0
	fi
	if ((${#parts[@]})); then
		mkdir -p "$G/cuda" && cat "${parts[@]}" | xz -dc | tar -x -C "$G/cuda" || return 1
		echo "libggml-cuda from ${parts[*]}"
		[[ ${SAVE_LIB:-} == 1 ]] && echo "SAVE_LIB=1: the library was carried, nothing to save"
		return 0
	fi
	start=$(date +%s)
	plugins/cuda-llama/build-cuda.sh "$G/src" "$G/cuda" 90 build/cuda90 "" >"$W/cuda90-build.log" 2>&1 ||
		{ echo "--- CUDA build log (last 80 lines)"; tail -80 "$W/cuda90-build.log"; return 1; }
	tail -3 "$W/cuda90-build.log"
	echo "sm_90 build: $(($(date +%s) - start)) s"
	rm -rf gpu/decode-libkeep && cp -a "$G/cuda" gpu/decode-libkeep # for the next call while the machine stays warm
	if [[ ${SAVE_LIB:-} == 1 ]]; then
		# Parts of 15 MiB: the device returns files of up to 16.
		(cd "$G/cuda" && tar -c libggml-cuda.so libggml-base.so* hydra-*) | xz -T0 -6 |
			split -b 15M -d - "$W/libcache-part-" || return 1
		ls -la "$W"/libcache-part-*
	fi
}

# bench SLOTS NAME ARGS...: decode-bench on all of CONC with SLOTS
# sequences, the page and raw results as $W/NAME.*; on a failure the tails
# of the servers' logs follow in the output.
bench() {
	local slots=$1 name=$2 rc f
	shift 2
	step "decode-bench: $name, slots $slots, c $CONC"
	# shellcheck disable=SC2086 # DECODE_ARGS is a list of flags
	"$G/decode-bench" -bin "$G" -ollama "$R/bin/ollama" -llama-server "$G/llama-server/llama-server" -model "$G/model.gguf" -c "$CONC" -slots "$slots" \
		-n "${N:-128}" -p "${P:-512}" -ctx "${CTX:-4096}" -reps "${REPS:-1}" -threads "${THREADS:-8}" \
		-out "$W" -name "$name" -raw "$W/$name.json" -work "$G/work-$name" "$@" ${DECODE_ARGS:-} 2>&1
	rc=$?
	if [[ $rc != 0 ]]; then
		for f in "$G/work-$name"/*.log; do
			[[ -f $f ]] && { echo "--- $name: $(basename "$f") (last 300 lines)"; tail -300 "$f"; }
		done
	fi
	rm -rf "$G/work-$name" # Ollama's store: a 2.4 GB copy of the model
	return "$rc"
}

main() {
	local gen rc state=() draft_args=""
	step "unpack gpu/decode-gpu.tar.xz"
	[[ -f gpu/decode-gpu.tar.xz ]] || { echo "no gpu/decode-gpu.tar.xz: run make gpu-pack-decode on a Go machine"; return 1; }
	rm -rf "$G" && mkdir -p "$G/src" && xz -dc gpu/decode-gpu.tar.xz | tar -x -C "$G" || return 1
	# The ggml sources build the library; a pack for a carried library may leave them out.
	if [[ -f $G/llama-cuda-src.tar.gz ]]; then
		tar -xzf "$G/llama-cuda-src.tar.gz" -C "$G/src" || return 1
	fi

	step "machine"
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	nproc
	nvcc --version 2>/dev/null | tail -1
	ldd --version | head -1

	step "model (in the background) and libggml-cuda for sm_90"
	# shellcheck disable=SC2086 # MODEL_ARGS is a list of flags
	("$G/gguf-gen" -o "$G/model.gguf" $MODEL_ARGS >"$W/gguf-gen.log" 2>&1; echo "exit $?" >>"$W/gguf-gen.log") &
	gen=$!
	cudaLib || { wait "$gen"; return 1; }
	wait "$gen"
	cat "$W/gguf-gen.log"
	grep -q "^exit 0" "$W/gguf-gen.log" || return 1
	ls -la "$G/model.gguf" "$G"/cuda/
	if [[ ${DRAFT:-} == mtp ]]; then
		# The target's own multi-token-prediction block (gguf-gen -mtp 1,
		# in MODEL_ARGS): both servers draft with --spec-type draft-mtp.
		draft_args="-spec-type draft-mtp -draft-max ${DRAFT_MAX:-8} "
		DECODE_ARGS="$draft_args${DECODE_ARGS:-}"
	elif [[ -n ${DRAFT:-} ]]; then
		# The target's weights (gguf-gen's seed) at another type: a draft
		# whose acceptance is high, for ours and llama-server alike.
		# shellcheck disable=SC2086 # MODEL_ARGS is a list of flags
		"$G/gguf-gen" -o "$G/draft.gguf" $(sed -E 's/(^| )-f16( |$)/ /; s/(^| )-type [a-z0-9_]+/ /' <<<"$MODEL_ARGS") -type "$DRAFT" || return 1
		draft_args="-draft-model $G/draft.gguf -draft-max ${DRAFT_MAX:-8} "
		DECODE_ARGS="$draft_args${DECODE_ARGS:-}"
	fi

	# Beside our plugin and llama-batched, stamped; beside llama-server (it
	# loads the backends in its directory, its own libggml-base from the same
	# tree); and Ollama's layout, when the pack has Ollama.
	cp -P "$G"/cuda/libggml-cuda.so "$G"/cuda/libggml-base.so* "$G"/cuda/hydra-* "$G"/ || return 1
	cp "$G"/cuda/libggml-cuda.so "$G/llama-server/" || return 1
	R=$G/ollama-root
	if [[ -x $G/ollama ]]; then
		mkdir -p "$R/bin" "$R/lib/ollama/cuda_v13"
		mv "$G/ollama" "$G/ollama.cflags" "$R/bin/"
		cp -P "$G"/cuda/libggml-cuda.so "$G"/cuda/libggml-base.so* "$R/lib/ollama/cuda_v13/"
		export OLLAMA_LIBRARY_PATH=$R/lib/ollama
	else
		echo "no Ollama in the pack (make gpu-pack-decode GPU_DECODE_OLLAMA=0): ours, llama-server and the ceiling"
		DECODE_ARGS="-systems ${SYSTEMS:-ours,llama-server,ceiling} ${DECODE_ARGS:-}"
	fi

	if [[ -n $STATE_GET_BYTES && $STATE_GET_BYTES != 0 ]]; then
		state=(-state-get-bytes "$STATE_GET_BYTES" -state-get-c "${STATE_C:-8}" -state-get-n "${STATE_N:-512}" -state-get-reps "${STATE_REPS:-2}")
	fi
	rc=0
	if [[ ${MAIN:-1} != 0 ]]; then
		bench "$SLOTS" decode-h200 -joins "${JOINS:-3}" -prefix-reps "${PREFIX_REPS:-2}" -ceiling-kv "${CEILING_KV:-both}" "${state[@]}"
		rc=$?
	fi
	if [[ -n ${DRAFT:-} && ${PLAIN_TOO:-} == 1 ]]; then
		# The same systems and streams without drafts, on the same machine:
		# the baseline a draft's speedup is a ratio to.
		DECODE_ARGS=${DECODE_ARGS/"$draft_args"/} bench "$SLOTS" decode-h200-plain -joins 0 -prefix-reps 0 || rc=1
	fi
	if [[ -n ${CACHE_P:-} ]]; then
		# Ours alone, one slot, with the prompt cache and without.
		DECODE_ARGS= bench 1 decode-h200-cache -systems "" -prompt-cache-tokens "$CACHE_P" -prompt-cache-reps "${CACHE_REPS:-3}" \
			-prompt-cache-ram "${CACHE_RAM:-8192}" -joins 0 -prefix-reps 0 || rc=1
	fi
	if [[ -n ${CKPT_P:-} ]]; then
		# One slot, ours and llama-server: context checkpoints.
		DECODE_ARGS= bench 1 decode-h200-ckpt -systems "" -checkpoint-tokens "$CKPT_P" -checkpoint-reps "${CKPT_REPS:-2}" \
			-joins 0 -prefix-reps 0 || rc=1
	fi
	if [[ -n ${AGENT_P:-} ]]; then
		# One slot, ours and llama-server: an agent's turns.
		DECODE_ARGS= bench 1 decode-h200-agent -systems "" -agent-tokens "$AGENT_P" -agent-turns "${AGENT_TURNS:-9}" \
			-agent-reps "${AGENT_REPS:-2}" -joins 0 -prefix-reps 0 || rc=1
	fi
	if [[ -n ${AB_OPT:-} ]]; then
		bench "$SLOTS" decode-h200-ab -systems ours -ours-opt "$AB_OPT" -joins "${JOINS:-3}" -prefix-reps "${PREFIX_REPS:-2}" || rc=1
	fi
	if [[ -n ${LONG_P:-} ]]; then
		# One stream, one slot: the prefill of a long prompt, ours and
		# llama-server (TTFT is the prefill's time).
		DECODE_ARGS= bench 1 decode-h200-long -systems ours,llama-server -c 1 -p "$LONG_P" -n 16 -ctx $((LONG_P + 64)) \
			-reps "${LONG_REPS:-2}" -joins 0 -prefix-reps 0 || rc=1
	fi
	if [[ -n $SLOTS2 && ${MAIN:-1} != 0 ]]; then
		if (($(elapsed) + SLOTS2_NEED <= BUDGET)); then
			bench "$SLOTS2" "decode-h200-slots$SLOTS2" -systems ours,ollama -joins 0 -prefix-reps 0 || rc=1
		else
			echo "skipping slots $SLOTS2: $(elapsed) s gone of $BUDGET, it needs ~$SLOTS2_NEED"
		fi
	fi
	step "done, rc $rc"
	return "$rc"
}

# say prints a line and adds it to the log.
say() { echo "$*"; echo "$*" >>"$LOG"; }

# collect copies into $OUT what fits in MAX_FILES, in order of need, the log
# last; a page left out goes into the log in full, so its tables come back.
collect() {
	local f want=() files=() left=()
	want=("$W/decode-h200.md" "$W/decode-h200-plain.md" "$W/decode-h200-cache.md" "$W/decode-h200-ckpt.md" "$W/decode-h200-agent.md" "$W/decode-h200-long.md" "$W/decode-h200-ab.md")
	mapfile -t -O "${#want[@]}" want < <(compgen -G "$W/libcache-part-*" | sort)
	want+=("$W/decode-h200.json" "$W/decode-h200-cache.json" "$W/decode-h200-ckpt.json" "$W/decode-h200-agent.json" "$W/decode-h200-ab.json" "$W/decode-h200.svg")
	[[ -n $SLOTS2 ]] && want+=("$W/decode-h200-slots$SLOTS2".{md,json,svg})
	for f in "${want[@]}"; do
		[[ -f $f ]] || continue
		if ((${#files[@]} < MAX_FILES - 1)); then files+=("$f"); else left+=("$f"); fi
	done
	for f in "${left[@]}"; do
		say "not copied into \$OUT (at most $MAX_FILES files come back): $(basename "$f")"
		[[ $f == *.md ]] && { echo; echo "=== $(basename "$f"), in full (not copied into \$OUT)"; cat "$f"; } >>"$LOG"
	done
	((${#files[@]})) && cp "${files[@]}" "$OUT"/
	say "into $OUT: $(for f in "${files[@]}" "$LOG"; do printf '%s ' "$(basename "$f")"; done)"
	cp "$LOG" "$OUT"/
}

rm -rf "$W" && mkdir -p "$W"
main 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
collect
ls -la "$OUT"
exit "$rc"
