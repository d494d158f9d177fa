#!/usr/bin/env bash
# Issue 29 item 3 on a GPU box with CUDA 13 and CMake but no Go (the H200):
# builds libggml-cuda for sm_90 and for sm_120 as two builds of one plugin
# (cuda/sm90, cuda/sm120: plugins/cuda-llama/build-cuda.sh, as make cuda
# CUDA_VARIANT=… does), puts a described stand-in for the CUDA 11.8 build
# (cuda/sm60-90, compiled on the Go machine, too large to carry) beside them,
# and runs the plugin's tests there: the driver's compute capability, the
# choice (it must be cuda/sm90 on an H200) and the tiny model on the GPU
# through the chosen library. One command of at most ~9 minutes: sm_120 builds
# niced beside sm_90 and is given up at DEADLINE seconds (default 540).
# A carried sm_90 library (gpu/libcache-part-*, what gpu-decode.sh SAVE_LIB=1
# returned) is cuda/sm90 instead of a build, stamped with this nvcc's
# version. SWAP=1 also runs the plugin's SWAP_QUANT and combined-mode GPU
# tests (TestSwapQuantGPU, TestCombinedGPU: the latter needs two GPUs) and
# the state tests with slots decoding beside a STATE_GET through the chosen
# library while sm_120 compiles.
#
# On the Go machine first: make gpu-pack-cuda-variants (gpu/cuda-variants.tar.xz), then
#   bench/scripts/gpu-cuda-variants.sh      # WANT=cuda/sm90 by default
#
# Results in $OUT (default out/): cuda-variants.txt, the build logs.
set -uo pipefail
cd "$(dirname "$0")/../.." # the repository's root: plugins/, gpu/
OUT=${OUT:-out}
mkdir -p "$OUT"
G=$PWD/gpu/cv
WANT=${WANT:-cuda/sm90}
DEADLINE=${DEADLINE:-540}
t0=$(date +%s)
step() { echo; echo "=== $* (+$(($(date +%s) - t0)) s)"; }
exec > >(tee "$OUT/cuda-variants.txt") 2>&1

rm -rf "$G" && mkdir -p "$G/src" && tar -xJf gpu/cuda-variants.tar.xz -C "$G" && tar -xzf "$G/llama-cuda-src.tar.gz" -C "$G/src" || exit 1
step "machine"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv; nproc; nvcc --version | tail -2; cmake --version | head -1

# The CUDA 11.8 build as the Go machine made it, described but not loadable:
# the choice must pass it over on sm_90 for CUDA 13's own build.
mkdir -p "$G/cuda/sm60-90"
cp "$G/src/hydra-ggml.version" "$G/cuda/sm60-90/"
printf 'cuda 11.8\narchs 60-real;61-real;70-real;75-real;80-real;86-real;89-real;90\n' >"$G/cuda/sm60-90/hydra-cuda.build"
echo "stand-in, never loaded" >"$G/cuda/sm60-90/libggml-cuda.so"

cuda_ver=$(nvcc --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
parts=(gpu/libcache-part-*)
nice=10
[[ -e ${parts[0]} ]] && nice=0
step "build cuda/sm120 (in the background, nice $nice) and cuda/sm90"
# sm_120 in a process group of its own (setsid), so that giving it up stops
# cmake, make and every nvcc with it.
s120=$(date +%s)
setsid nice -n $nice plugins/cuda-llama/build-cuda.sh "$G/src" "$G/sm120-out" 120 build/cv-sm120 "" >"$OUT/cuda-sm120-build.log" 2>&1 &
sm120=$!
s=$(date +%s)
if [[ -e ${parts[0]} ]]; then
	mkdir -p "$G/cuda/sm90" && cat "${parts[@]}" | xz -dc | tar -x -C "$G/cuda/sm90" || exit 1
	printf 'cuda %s\narchs 90\n' "$cuda_ver" >"$G/cuda/sm90/hydra-cuda.build"
	echo "cuda/sm90: the sm_90 library carried in ${parts[*]} (built on this kind of box by build-cuda.sh), stamped CUDA $cuda_ver"
elif ! plugins/cuda-llama/build-cuda.sh "$G/src" "$G/cuda/sm90" 90 build/cv-sm90 "" >"$OUT/cuda-sm90-build.log" 2>&1; then
	tail -30 "$OUT/cuda-sm90-build.log"
	kill -- -$sm120 2>/dev/null
	exit 1
else
	echo "sm_90: $(($(date +%s) - s)) s"
fi
echo "sm_90: $(du -m "$G/cuda/sm90/libggml-cuda.so" | cut -f1) MB"; cat "$G/cuda/sm90/hydra-cuda.build"

# choice: the plugin's tests from $G, whose cuda/ directory is the plugin's.
choice() {
	(cd "$G" && HYDRA_TEST_REQUIRE_GPU=1 HYDRA_TEST_CUDA_WANT=$WANT HYDRA_TEST_LOG=info timeout 150 ./cuda-llama.test \
		-test.run '^(TestQueryGPUs|TestCUDABuildOnDevice|TestDevice)$' -test.count=1 -test.v 2>&1) |
		grep -E '^(=== RUN|--- |PASS|FAIL|ok)|gpuselect|CUDA build chosen|CUDA backend loaded|running on CPU|device' | cut -c1-600
}
step "the choice with cuda/sm90 and the CUDA 11.8 stand-in (cuda/sm120 still compiling)"
choice

if [[ ${SWAP:-} == 1 ]]; then
	step "SWAP_QUANT, combined mode and STATE_GET beside decoding slots on the GPU (cuda/sm90)"
	(cd "$G" && HYDRA_TEST_REQUIRE_GPU=1 HYDRA_TEST_LOG=info timeout 300 ./cuda-llama.test \
		-test.run '^(TestSwapQuantGPU|TestCombinedGPU|TestConcurrentSlots|TestStateBytesMatchLlama|TestRestoredJoinsBatch)$' -test.count=1 -test.v 2>&1) |
		grep -vE 'llama_|load_tensors|print_info|llm_load|ggml_cuda_init|graph_reserve|sched_reserve' | cut -c1-800 | tail -150
fi

step "wait for cuda/sm120 (until +$DEADLINE s)"
while kill -0 $sm120 2>/dev/null && (($(date +%s) - t0 < DEADLINE)); do sleep 5; done
if kill -0 $sm120 2>/dev/null; then
	kill -- -$sm120 2>/dev/null
	echo "sm_120 given up at +$DEADLINE s, after $(($(date +%s) - s120)) s: $(grep -c 'Building CUDA object' "$OUT/cuda-sm120-build.log") objects compiled"
	tail -3 "$OUT/cuda-sm120-build.log"
	exit 0
fi
wait $sm120
echo "sm_120 build: exit $? after $(($(date +%s) - s120)) s (niced while sm_90 built)"
tail -1 "$OUT/cuda-sm120-build.log"
if [[ -f $G/sm120-out/libggml-cuda.so ]]; then
	mv "$G/sm120-out" "$G/cuda/sm120"
	echo "sm_120: $(du -m "$G/cuda/sm120/libggml-cuda.so" | cut -f1) MB"; cat "$G/cuda/sm120/hydra-cuda.build"
	step "the choice with all three (cuda/sm60-90 stand-in, cuda/sm90, cuda/sm120)"
	choice
fi
step "done"
