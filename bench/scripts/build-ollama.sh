#!/usr/bin/env bash
# Builds Ollama from its Go module, at the version bench/go.mod pins (the
# same llama.cpp and ggml sources bench/cmd/llama-batched compiles), into OUT:
#
#   bench/scripts/build-ollama.sh OUT [CFLAGS]     # e.g. bin/ollama "-O2 -march=native"
#
# CFLAGS become CGO_CFLAGS and CGO_CXXFLAGS, as mk/llama.mk's are for our
# plugin, so that a comparison compares the serving code and not the compiler
# flags (default -O2, the plugin's `make build-llama`). The build runs
# `go install github.com/ollama/ollama@VERSION`: the module cache stays
# untouched and read-only, and Ollama's own go.mod and go.sum choose its
# dependencies (fetched through the Go module proxy the first time).
#
# The module zip lacks llama/llama.cpp/vendor. Two of its headers come from
# Debian (apt-get install -y nlohmann-json3-dev libstb-dev: nlohmann/json.hpp
# and stb/stb_image.h on the system include path). The third, miniaudio.h,
# serves only mtmd-helper's decoding of audio input for multimodal models;
# a header of ours in build/ollama-shim declares the few calls that file makes
# and fails each one, so an audio input is refused and nothing else changes.
# OUT.cflags records CFLAGS (-trimpath keeps them out of Go's build info).
set -euo pipefail
cd "$(dirname "$0")/../.." # the repository's root; bench/go.mod pins the version

out=${1:?usage: build-ollama.sh OUT [CFLAGS]}
cflags=${2:-"-O2"}
GO=${GO:-go}
module=github.com/ollama/ollama

die() { echo "build-ollama: $*" >&2; exit 1; }

version=$(cd bench && GOWORK=off "$GO" list -m -f '{{.Version}}' "$module") || die "no $module in bench/go.mod"
GOWORK=off "$GO" mod download "$module@$version"

# The two Debian headers: refuse early with the fix rather than deep in cgo.
for h in nlohmann/json.hpp stb/stb_image.h; do
	echo "#include <$h>" | ${CXX:-c++} -std=c++17 -fsyntax-only -x c++ - 2>/dev/null ||
		die "<$h> not found: apt-get install -y nlohmann-json3-dev libstb-dev"
done

shim=$PWD/build/ollama-shim
mkdir -p "$shim/miniaudio"
cat >"$shim/miniaudio/miniaudio.h" <<'EOF'
/* hydra-engine bench: a stand-in for miniaudio.h, which Ollama's module zip
 * lacks. mtmd-helper.cpp uses it only to decode audio input; every call here
 * fails, so audio input is refused and the rest of the build is unchanged.
 * mtmd-helper.cpp defines MA_API as static before including it. */
#ifndef HYDRA_MINIAUDIO_SHIM_H
#define HYDRA_MINIAUDIO_SHIM_H
#include <stddef.h>
#include <stdint.h>
#ifndef MA_API
#define MA_API static
#endif
typedef int ma_result;
typedef uint32_t ma_uint32;
typedef uint64_t ma_uint64;
#define MA_SUCCESS 0
#define MA_NOT_IMPLEMENTED (-29)
typedef enum { ma_format_unknown = 0, ma_format_f32 = 5 } ma_format;
typedef struct { ma_format format; ma_uint32 channels; ma_uint32 sampleRate; } ma_decoder_config;
typedef struct { int unused; } ma_decoder;
MA_API ma_decoder_config ma_decoder_config_init(ma_format f, ma_uint32 channels, ma_uint32 rate) {
	ma_decoder_config c = {f, channels, rate};
	return c;
}
MA_API ma_result ma_decoder_init_memory(const void *data, size_t size, const ma_decoder_config *c, ma_decoder *d) {
	(void)data; (void)size; (void)c; (void)d;
	return MA_NOT_IMPLEMENTED;
}
MA_API ma_result ma_decoder_get_length_in_pcm_frames(ma_decoder *d, ma_uint64 *n) {
	(void)d; *n = 0;
	return MA_NOT_IMPLEMENTED;
}
MA_API ma_result ma_decoder_read_pcm_frames(ma_decoder *d, void *out, ma_uint64 n, ma_uint64 *read) {
	(void)d; (void)out; (void)n; *read = 0;
	return MA_NOT_IMPLEMENTED;
}
MA_API ma_result ma_decoder_uninit(ma_decoder *d) {
	(void)d;
	return MA_SUCCESS;
}
#endif
EOF

gobin=$(mktemp -d)
trap 'rm -rf "$gobin"' EXIT
echo "build-ollama: $module $version, CGO_CFLAGS/CGO_CXXFLAGS=\"$cflags\" -> $out"
start=$(date +%s)
GOWORK=off GOBIN=$gobin CGO_ENABLED=1 \
	CGO_CPPFLAGS="-I$shim" CGO_CFLAGS="$cflags" CGO_CXXFLAGS="$cflags" \
	"$GO" install -trimpath -ldflags "-s -w -X $module/version.Version=${version#v}" "$module@$version"
mkdir -p "$(dirname "$out")"
mv -f "$gobin/ollama" "$out"
echo "$cflags" >"$out.cflags" # decode-bench reports it (-trimpath keeps CGO_CFLAGS out of the build info)
echo "build-ollama: $out ($(( $(date +%s) - start )) s)"
