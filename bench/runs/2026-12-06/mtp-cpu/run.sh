#!/usr/bin/env bash
# draft-mtp on the 2-core dev box: ours and llama-server (the same llama.cpp
# tree), a qwen35moe with its MTP block (gguf-gen -mtp 1, random weights),
# without drafts and with --spec-type draft-mtp (draft_max 8), and ours
# drafting always. From the repository's root, after make gpu-pack-decode
# GPU_DECODE_OLLAMA=0:
#   bench/runs/2026-12-06/mtp-cpu/run.sh [OUT]
set -eu
S=$PWD/gpu/decode-stage
OUT=${1:-$PWD/bench/runs/2026-12-06/mtp-cpu}
M=$(mktemp -d)
"$S/gguf-gen" -o "$M/model.gguf" -arch qwen35moe -layers 8 -embd 512 -heads 8 -kv-heads 2 -head-dim 64 \
	-experts 16 -experts-used 4 -expert-ff 256 -shared-ff 256 -vocab 32000 -ctx 8192 -type q8_0 -mtp 1
cd "$S"
B="./decode-bench -bin . -llama-server $PWD/../../bin/llama-server/llama-server -model $M/model.gguf -slots 4 -c 1,2,4 -n 64 -p 128 -threads 2 -joins 0 -prefix-reps 0 -systems ours,llama-server -out $OUT"
$B -name plain -raw "$OUT/plain.json"
$B -name mtp -raw "$OUT/mtp.json" -spec-type draft-mtp -draft-max 8
$B -name mtp-always -raw "$OUT/mtp-always.json" -spec-type draft-mtp -draft-max 8 -systems ours -ours-opt draft_rule=always
rm -rf "$M"
