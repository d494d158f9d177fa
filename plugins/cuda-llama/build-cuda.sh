#!/usr/bin/env bash
# Builds ggml's CUDA backend from the ollama module's sources (make cuda):
#   build-cuda.sh SRC OUT ARCHS BUILD VERSION
# SRC: the module directory or an unpacked `make cuda-src` tarball (which
# carries hydra-ggml.version, used when VERSION is empty). OUT receives
# libggml-cuda.so, libggml-base.so.0 and hydra-ggml.version, the stamp the
# plugin checks at load. ARCHS: CUDA architectures, e.g. "90" or "90 120".
set -euo pipefail

src=${1:?usage: build-cuda.sh SRC OUT ARCHS BUILD VERSION}
out=${2:?OUT}
archs=${3:-90}
build=${4:-build/cuda}
version=${5:-}

die() { echo "make cuda: $*" >&2; exit 1; }

[[ -f $src/CMakeLists.txt && -d $src/ml/backend/ggml/ggml ]] || die "$src holds no ollama ggml sources (CMakeLists.txt, ml/backend/ggml/ggml)"
if [[ -z $version ]]; then
	[[ -f $src/hydra-ggml.version ]] || die "no version: $src/hydra-ggml.version is missing (make cuda-src writes it)"
	stamp=$(<"$src/hydra-ggml.version")
else
	stamp="github.com/ollama/ollama $version"
fi
command -v cmake >/dev/null || die "cmake not found"

nvcc=${CUDACXX:-$(command -v nvcc || true)}
[[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
[[ -n $nvcc ]] || die "nvcc not found (set CUDACXX or put the CUDA toolkit's bin on PATH)"
cuda_ver=$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1.\2/p')
cuda_major=${cuda_ver%%.*}

# CUDA 13 dropped Maxwell, Pascal and Volta (sm_50 … sm_72).
list=()
for a in ${archs//[;,]/ }; do
	n=${a%%[!0-9]*}
	[[ -n $n ]] || die "bad CUDA architecture '$a' in CUDA_ARCHS=\"$archs\""
	if (( cuda_major >= 13 && n < 75 )); then
		die "sm_$n needs a CUDA 12 toolchain: CUDA $cuda_ver ($nvcc) supports sm_75 and newer"
	fi
	list+=("$a")
done
cmake_archs=$(IFS=';'; echo "${list[*]}")

echo "make cuda: ggml CUDA backend for sm_${cmake_archs//;/, sm_} with CUDA $cuda_ver, from $stamp"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release \
	-DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="$cmake_archs" \
	-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN'
cmake --build "$build" --target ggml-cuda -j "$(nproc)"

lib=$build/lib/ollama
[[ -f $lib/libggml-cuda.so ]] || die "no $lib/libggml-cuda.so after the build"
mkdir -p "$out"
cp -P "$lib"/libggml-cuda.so "$lib"/libggml-base.so* "$out"/
echo "$stamp" >"$out/hydra-ggml.version"
echo "make cuda: $out/libggml-cuda.so, libggml-base.so.0, hydra-ggml.version ($stamp)"
