#!/usr/bin/env bash
# Builds ggml's CUDA backend from the pinned llama.cpp tree (make cuda):
#   build-cuda.sh SRC OUT ARCHS BUILD COMMIT
# SRC: the fetched tree or an unpacked `make cuda-src` tarball (which carries
# hydra-ggml.version, used when COMMIT is empty); its ggml/ is configured
# with only the CUDA backend, as a subproject of plugins/cuda-llama/cuda. OUT
# receives libggml-cuda.so, libggml-base.so.0, hydra-ggml.version (the stamp
# the plugin checks at load) and hydra-cuda.build (the toolkit and
# architectures, which the plugin matches against the GPU's compute
# capability before loading).
# ARCHS: CMake CUDA architectures, e.g. "90", "90 120" or
# "60-real;61-real;90" (no suffix: SASS and PTX; -real: SASS only).
# CUDAHOSTCXX: nvcc's host compiler (default: g++-11 for CUDA 11, when g++ is
# newer than CUDA 11 accepts). HYDRA_CUDA_BUNDLE=1: the CUDA runtime libraries
# libggml-cuda.so links (cudart, cuBLAS) go into OUT too.
set -euo pipefail

src=${1:?usage: build-cuda.sh SRC OUT ARCHS BUILD COMMIT}
out=${2:?OUT}
archs=${3:-90}
build=${4:-build/cuda}
commit=${5:-}

die() { echo "make cuda: $*" >&2; exit 1; }

[[ -f $src/ggml/CMakeLists.txt && -d $src/ggml/src/ggml-cuda ]] || die "$src holds no ggml CUDA sources (ggml/CMakeLists.txt, ggml/src/ggml-cuda)"
if [[ -z $commit ]]; then
	[[ -f $src/hydra-ggml.version ]] || die "no version: $src/hydra-ggml.version is missing (make cuda-src writes it)"
	stamp=$(<"$src/hydra-ggml.version")
else
	stamp="llama.cpp $commit"
fi
command -v cmake >/dev/null || die "cmake not found"

nvcc=${CUDACXX:-$(command -v nvcc || true)}
[[ -z $nvcc && -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc
[[ -n $nvcc ]] || die "nvcc not found (set CUDACXX or put the CUDA toolkit's bin on PATH)"
cuda_ver=$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1.\2/p')
[[ -n $cuda_ver ]] || die "cannot read the CUDA version from $nvcc --version"
cuda_major=${cuda_ver%%.*}
cuda_num=$((cuda_major * 100 + ${cuda_ver#*.})) # 11.8 → 1108

# min_cuda SM: the oldest CUDA release (major*100+minor) that compiles for SM.
min_cuda() {
	case $1 in
	86) echo 1101 ;;
	87 | 89 | 90) echo 1108 ;;
	100 | 101 | 120) echo 1208 ;;
	103 | 121) echo 1209 ;;
	110) echo 1300 ;;
	*) echo 0 ;;
	esac
}

# Architectures: CUDA 13 dropped Maxwell, Pascal and Volta (sm_50 … sm_72);
# newer ones need a recent enough toolkit. Suffixes: a/f (arch-specific),
# -real (SASS only), -virtual (PTX only).
list=()
for a in ${archs//[;,]/ }; do
	[[ $a =~ ^([0-9]+)[af]?(-real|-virtual)?$ ]] || die "bad CUDA architecture '$a' in CUDA_ARCHS=\"$archs\" (e.g. 90, 90a, 90-real)"
	n=${BASH_REMATCH[1]}
	if ((cuda_major >= 13 && n < 75)); then
		die "sm_$n needs a CUDA 12 or older toolchain: CUDA $cuda_ver ($nvcc) supports sm_75 and newer"
	fi
	need=$(min_cuda "$n")
	if ((cuda_num < need)); then
		die "sm_$n needs CUDA $((need / 100)).$((need % 100)) or newer: $nvcc is CUDA $cuda_ver"
	fi
	list+=("$a")
done
((${#list[@]})) || die "no CUDA architectures in CUDA_ARCHS=\"$archs\""
cmake_archs=$(IFS=';'; echo "${list[*]}")

# CUDA 11's nvcc refuses g++ newer than 11 (Debian bookworm's is 12).
host_cxx=()
if [[ -z ${CUDAHOSTCXX:-} ]] && ((cuda_major < 12)) && command -v g++-11 >/dev/null; then
	gxx=$(g++ -dumpversion 2>/dev/null || echo 0)
	if ((${gxx%%.*} > 11)); then
		host_cxx=(-DCMAKE_CUDA_HOST_COMPILER="$(command -v g++-11)")
		echo "make cuda: CUDA $cuda_ver with g++-11 as nvcc's host compiler (g++ is $gxx)"
	fi
fi

# A backend library ggml_backend_load can open (GGML_BACKEND_DL) and the
# shared ggml-base it links, as llama.cpp builds them for itself (CUDA
# graphs on); no CPU backend (the plugin links its own), no NCCL (the
# runtime bundled below is cudart and cuBLAS).
echo "make cuda: ggml CUDA backend for ${cmake_archs//;/, } with CUDA $cuda_ver, from $stamp"
cmake -S "$(dirname "$0")/cuda" -B "$build" -DHYDRA_GGML_DIR="$(realpath "$src/ggml")" -DCMAKE_BUILD_TYPE=Release \
	-DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_CPU=OFF -DGGML_OPENMP=OFF \
	-DGGML_CUDA=ON -DGGML_CUDA_GRAPHS=ON -DGGML_CUDA_NCCL=OFF \
	-DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="$cmake_archs" "${host_cxx[@]}" \
	-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN'
cmake --build "$build" --target ggml-cuda -j "$(nproc)"

# ggml writes the backend module to bin/ and ggml-base to src/ of the build.
cuda_so=$(find "$build" -name libggml-cuda.so -print -quit)
base_so=$(find "$build" -name libggml-base.so -print -quit)
[[ -n $cuda_so && -n $base_so ]] || die "no libggml-cuda.so and libggml-base.so in $build after the build"
mkdir -p "$out"
cp -P "$cuda_so" "$(dirname "$base_so")"/libggml-base.so* "$out"/
# Bundled, the runtime is found beside the library through its $ORIGIN rpath,
# so builds of different toolkits run side by side where only the driver is
# installed.
if [[ ${HYDRA_CUDA_BUNDLE:-} == 1 ]]; then
	while read -r soname arrow path _; do
		[[ $arrow == "=>" && $path == /* ]] || die "bundling the CUDA runtime: $soname not found (ldd $out/libggml-cuda.so)"
		cp -L "$path" "$out/$soname"
		echo "make cuda: bundled $soname from $path"
	done < <(ldd "$out/libggml-cuda.so" | awk '$1 ~ /^lib(cudart|cublas|cublasLt)\.so/')
fi
echo "$stamp" >"$out/hydra-ggml.version"
printf 'cuda %s\narchs %s\n' "$cuda_ver" "$cmake_archs" >"$out/hydra-cuda.build"
echo "make cuda: $out/libggml-cuda.so ($(du -m "$out/libggml-cuda.so" | cut -f1) MB), libggml-base.so.0, hydra-ggml.version ($stamp), hydra-cuda.build (CUDA $cuda_ver: $cmake_archs)"
