#!/usr/bin/env bash
# Speculative decoding on the 2-core dev box: ours and llama-server (the same
# llama.cpp tree, make llama-server), no draft, a q4_0 and a q8_0 copy of the
# target as draft models (draft_max 8), and ours drafting always.
# From the repository's root, after make gpu-pack-decode GPU_DECODE_OLLAMA=0:
#   bench/runs/2026-12-06/spec-cpu/run.sh [OUT]
set -eu
S=$PWD/gpu/decode-stage
OUT=${1:-$PWD/bench/runs/2026-12-06/spec-cpu}
M=$(mktemp -d)
A="-layers 8 -embd 512 -heads 8 -kv-heads 4 -ff 1408 -vocab 32000 -ctx 8192"
"$S/gguf-gen" -o "$M/model.gguf" $A -f16
"$S/gguf-gen" -o "$M/draft.gguf" $A -type q4_0
"$S/gguf-gen" -o "$M/draft8.gguf" $A -type q8_0
cd "$S"
B="./decode-bench -bin . -llama-server $PWD/../../bin/llama-server/llama-server -model $M/model.gguf -slots 4 -c 1,2,4 -n 64 -p 128 -threads 2 -joins 0 -prefix-reps 0 -systems ours,llama-server -out $OUT"
$B -name plain -raw "$OUT/plain.json"
$B -name draft-q4_0 -raw "$OUT/draft-q4_0.json" -draft-model "$M/draft.gguf" -draft-max 8
$B -name draft-q8_0 -raw "$OUT/draft-q8_0.json" -draft-model "$M/draft8.gguf" -draft-max 8
$B -name draft-q8_0-always -raw "$OUT/draft-q8_0-always.json" -draft-model "$M/draft8.gguf" -draft-max 8 -systems ours -ours-opt draft_rule=always
rm -rf "$M"
