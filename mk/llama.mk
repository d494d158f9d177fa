# The llama.cpp backend (plugins/cuda-llama): included by the Makefile.
#
# llama.cpp, ggml and ggml's CPU backend are compiled by cgo from the Go module
# github.com/ollama/ollama (version pinned in go.mod); our binding needs
# include paths into that module's directory. CGO_* variables are part of
# every cgo cache key, and so is -trimpath: build, vet and test use exactly
# LLAMA_ENV and LLAMA_GOFLAGS, or the ~2-minute llama.cpp compile is repeated.

LLAMA_MODULE := github.com/ollama/ollama
# Evaluated once, and only by targets that use them (make cuda can run where
# there is no Go, from an unpacked `make cuda-src` tarball).
OLLAMA_DIR    = $(eval OLLAMA_DIR := $(shell $(GO) mod download $(LLAMA_MODULE) && $(GO) list -m -f '{{.Dir}}' $(LLAMA_MODULE)))$(OLLAMA_DIR)
LLAMA_VERSION = $(eval LLAMA_VERSION := $(shell $(GO) list -m -f '{{.Version}}' $(LLAMA_MODULE)))$(LLAMA_VERSION)

LLAMA_ENV = CGO_ENABLED=1 \
	CGO_CPPFLAGS="-I$(OLLAMA_DIR)/llama/llama.cpp/include -I$(OLLAMA_DIR)/llama/llama.cpp/src -I$(OLLAMA_DIR)/ml/backend/ggml/ggml/include" \
	CGO_CFLAGS="-O2" CGO_CXXFLAGS="-O2"
LLAMA_GOFLAGS := -trimpath -tags llama

LLAMA_PKGS := ./plugins/cuda-llama/... ./cmd/hydra-plugin-cuda-llama

# make cuda: the ggml CUDA backend library, built with CMake from the same
# module source. CUDA_ARCHS is a CMake list ("90", "90;120", "60-real;90");
# sm_60/sm_70 need a CUDA 12 or older toolchain (CUDA 13 dropped them).
# CUDA_VARIANT names one of several builds: it goes to
# LLAMA_LIB_DIR/cuda/CUDA_VARIANT, and the plugin loads the one that fits the
# GPU's compute capability (deploy/CUDA.md); without it, LLAMA_LIB_DIR itself.
# CUDA_BUNDLE=1 copies the CUDA runtime (cudart, cuBLAS) beside the library,
# for builds of several toolkits in one package. OLLAMA_SRC: an unpacked
# `make cuda-src` tarball instead of the module (a GPU build box without Go).
CUDA_ARCHS    ?= 90
CUDA_VARIANT  ?=
CUDA_BUNDLE   ?=
CUDA_BUILD    ?= build/cuda$(if $(CUDA_VARIANT),-$(CUDA_VARIANT))
LLAMA_LIB_DIR ?= $(BIN)
CUDA_OUT       = $(LLAMA_LIB_DIR)$(if $(CUDA_VARIANT),/cuda/$(CUDA_VARIANT))
OLLAMA_SRC    ?=

# CPU variants: the cgo packages of the ollama module link one ggml CPU
# backend, compiled with CGO_CFLAGS, which apply to every cgo package of the
# binary; so the plugin is built whole once per x86-64 level of the psABI, as
# hydra-plugin-cuda-llama.LEVEL beside the baseline, and the engine runs the
# best one the CPU supports (host/pluginproc/resolve.go). The levels are named
# (never -march=native, which on an AMX CPU makes ggml-cpu call the AMX code
# that the module's cgo packages leave out: an undefined reference at link);
# x86-64-v4 is AVX-512 F/BW/CD/DQ/VL only, no AMX. GOAMD64 gives the Go code
# the same level, and Go's start-up check refuses a CPU below it. Each level
# is a cold llama.cpp compile of its own (~3-4 min on 2 cores), then cached.
LLAMA_LEVELS ?= x86-64-v2 x86-64-v3 x86-64-v4
# The build machine's own level, as glibc's loader reports it ("" where it
# reports none: not x86-64, glibc < 2.33, a CPU below x86-64-v2).
LLAMA_HOST_LEVEL = $(eval LLAMA_HOST_LEVEL := $(shell /lib64/ld-linux-x86-64.so.2 --help 2>/dev/null | grep -o 'x86-64-v[234] .supported' | head -1 | cut -d' ' -f1))$(LLAMA_HOST_LEVEL)
# The levels make build-llama builds beside the baseline: this machine's own.
LLAMA_BUILD_LEVELS ?= $(LLAMA_HOST_LEVEL)
LLAMA_LEVEL_CFLAGS = -O2 -march=$(1) -mtune=generic

# llama-level LEVEL: the command building BIN/hydra-plugin-cuda-llama.LEVEL.
define llama-level
	$(LLAMA_ENV) CGO_CFLAGS="$(call LLAMA_LEVEL_CFLAGS,$(1))" CGO_CXXFLAGS="$(call LLAMA_LEVEL_CFLAGS,$(1))" GOAMD64=$(patsubst x86-64-%,%,$(1)) \
		$(GO) build $(LLAMA_GOFLAGS) -ldflags '$(LDFLAGS)' -o $(BIN)/hydra-plugin-cuda-llama.$(1) ./cmd/hydra-plugin-cuda-llama

endef

.PHONY: build-llama build-llama-variants vet-llama test-llama bench-llama llama-env tiny-model cuda cuda-src

# bin/hydra-plugin-cuda-llama (cgo, dynamically linked against glibc, baseline
# x86-64), its build for this machine's x86-64 level (LLAMA_BUILD_LEVELS) and
# bin/gguf-gen. Variants of other levels in BIN are removed: they would be
# older builds, and a lower one runs where its level is the best present.
build-llama:
	@mkdir -p $(BIN)
	$(LLAMA_ENV) $(GO) build $(LLAMA_GOFLAGS) -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/hydra-plugin-cuda-llama
	$(foreach l,$(LLAMA_BUILD_LEVELS),$(call llama-level,$(l)))
	@for l in $(filter-out $(LLAMA_BUILD_LEVELS),$(LLAMA_LEVELS)); do f=$(BIN)/hydra-plugin-cuda-llama.$$l; \
		if [ -e $$f ]; then rm -f $$f && echo "removed $$f: not built now (make build-llama-variants builds every level)"; fi; done
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/gguf-gen

# The baseline and every level of LLAMA_LEVELS, for packages and images that
# run on any x86-64 machine.
build-llama-variants:
	@$(MAKE) --no-print-directory build-llama LLAMA_BUILD_LEVELS='$(LLAMA_LEVELS)'

# bin/tiny.gguf, the tests' random-weight model: make run BACKEND=cuda-llama MODEL=bin/tiny.gguf
tiny-model: $(BIN)/tiny.gguf
$(BIN)/tiny.gguf:
	@mkdir -p $(BIN)
	$(GO) run ./cmd/gguf-gen -o $(BIN)/tiny.gguf

vet-llama:
	$(LLAMA_ENV) $(GO) vet $(LLAMA_GOFLAGS) $(LLAMA_PKGS) ./tests/

# The plugin's tests on real llama.cpp (CPU; the restore tests run with K/V
# blocks held and streamed), then the end-to-end ones (tests/llama_test.go:
# engine + plugin processes over real sockets).
test-llama: vet-llama
	$(LLAMA_ENV) $(GO) test $(LLAMA_GOFLAGS) -count=1 -timeout 10m $(LLAMA_PKGS)
	$(LLAMA_ENV) $(GO) test $(LLAMA_GOFLAGS) -count=1 -timeout 10m -run '^TestLlama' ./tests/

# STATE_GET/STATE_PUT throughput of the plugin on CPU (a 32 MiB state).
bench-llama:
	$(LLAMA_ENV) $(GO) test $(LLAMA_GOFLAGS) -run '^$$' -bench . -benchtime $(BENCHTIME) ./plugins/cuda-llama/

# Prints the environment, for running go build/test/vet -tags llama by hand:
#   eval "$$(make -s llama-env)" && go test -trimpath -tags llama ./plugins/cuda-llama/
llama-env:
	@echo 'export $(LLAMA_ENV)'

# The sources make cuda needs (CMakeLists.txt, CMakePresets.json,
# ml/backend/ggml/ggml: ~9 MB, ~1.2 MB compressed) and their version stamp, to
# carry to a GPU build machine.
cuda-src:
	@mkdir -p $(BIN)
	@stage=$$(mktemp -d) && trap 'chmod -R u+w $$stage; rm -rf $$stage' EXIT && \
	  echo "$(LLAMA_MODULE) $(LLAMA_VERSION)" > $$stage/hydra-ggml.version && \
	  tar -czf $(BIN)/ollama-ggml-src.tar.gz --mode=u+w \
	    -C $(OLLAMA_DIR) CMakeLists.txt CMakePresets.json ml/backend/ggml/ggml \
	    -C $$stage hydra-ggml.version && \
	  echo "$(BIN)/ollama-ggml-src.tar.gz: ggml sources of $(LLAMA_MODULE) $(LLAMA_VERSION) (unpack, then make cuda OLLAMA_SRC=DIR)"

# libggml-cuda.so and libggml-base.so.0 ($$ORIGIN rpath) in CUDA_OUT, beside
# the plugin or in its cuda/ directory, with the version stamp and the build
# description (toolkit, architectures) the plugin checks at load. Needs CMake
# and the CUDA toolkit; not Go when OLLAMA_SRC is given.
ifneq ($(findstring /,$(CUDA_VARIANT)),)
$(error CUDA_VARIANT="$(CUDA_VARIANT)" is a directory name under LLAMA_LIB_DIR/cuda/, without "/")
endif
ifneq ($(OLLAMA_SRC),)
cuda:
	HYDRA_CUDA_BUNDLE=$(CUDA_BUNDLE) plugins/cuda-llama/build-cuda.sh "$(OLLAMA_SRC)" "$(CUDA_OUT)" "$(CUDA_ARCHS)" "$(CUDA_BUILD)" ""
else
cuda:
	HYDRA_CUDA_BUNDLE=$(CUDA_BUNDLE) plugins/cuda-llama/build-cuda.sh "$(OLLAMA_DIR)" "$(CUDA_OUT)" "$(CUDA_ARCHS)" "$(CUDA_BUILD)" "$(LLAMA_VERSION)"
endif

# gpu/hydra-gpu.tar.gz: everything bench/scripts/gpu-bench.sh needs on a GPU box
# without Go: the engine, the llama plugin, hydra-bench, gguf-gen, the plugin's
# and the end-to-end tests compiled, and the ggml sources for make cuda.
GPU_STAGE := gpu/stage
.PHONY: gpu-pack
gpu-pack: cuda-src
	@rm -rf $(GPU_STAGE) && mkdir -p $(GPU_STAGE)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(GPU_STAGE)/ ./cmd/hydra-engine ./cmd/hydra-plugin-mock ./cmd/gguf-gen ./cmd/hydractl
	cd bench && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(CURDIR)/$(GPU_STAGE)/ ./cmd/hydra-bench ./cmd/recv-bench
	$(LLAMA_ENV) $(GO) build $(LLAMA_GOFLAGS) -ldflags '$(LDFLAGS)' -o $(GPU_STAGE)/ ./cmd/hydra-plugin-cuda-llama
	$(LLAMA_ENV) $(GO) test $(LLAMA_GOFLAGS) -ldflags '-s -w' -c -o $(GPU_STAGE)/cuda-llama.test ./plugins/cuda-llama
	$(LLAMA_ENV) $(GO) test $(LLAMA_GOFLAGS) -ldflags '-s -w' -c -o $(GPU_STAGE)/tests.test ./tests
	cp $(BIN)/ollama-ggml-src.tar.gz $(GPU_STAGE)/
	tar -czf gpu/hydra-gpu.tar.gz -C $(GPU_STAGE) .
	@ls -la gpu/hydra-gpu.tar.gz

# gpu/cuda-variants.tar.xz: what bench/scripts/gpu-cuda-variants.sh needs on
# a GPU box without Go (sm_90 and sm_120 builds there, and the proof that the
# plugin picks the one for its GPU): the plugin's tests compiled with -tags
# llama, and the ggml sources for make cuda.
.PHONY: gpu-pack-cuda-variants
gpu-pack-cuda-variants: cuda-src
	@rm -rf gpu/cv-stage && mkdir -p gpu/cv-stage
	$(LLAMA_ENV) $(GO) test $(LLAMA_GOFLAGS) -ldflags '-s -w' -c -o gpu/cv-stage/cuda-llama.test ./plugins/cuda-llama
	cp $(BIN)/ollama-ggml-src.tar.gz gpu/cv-stage/
	tar -cf - -C gpu/cv-stage . | xz -T0 -9e > gpu/cuda-variants.tar.xz
	@ls -la gpu/cuda-variants.tar.xz

# gpu/hydra-gpu.tar.gz, bench modes only (bench, mock, variant-ab and the
# other A/Bs, recv): no test binaries, xz -9e (its large dictionary takes a
# third off the Go binaries, alike), so that it and gpu/libcache (a
# libggml-cuda an earlier call saved with SAVE_LIB=1, ~44 MB) fit in one
# device call's carry (64 MiB) and the call skips the ~3.5 min CUDA build.
.PHONY: gpu-pack-bench
gpu-pack-bench: cuda-src
	@rm -rf $(GPU_STAGE) && mkdir -p $(GPU_STAGE)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(GPU_STAGE)/ ./cmd/hydra-engine ./cmd/hydra-plugin-mock ./cmd/gguf-gen ./cmd/hydractl
	cd bench && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(CURDIR)/$(GPU_STAGE)/ ./cmd/hydra-bench ./cmd/recv-bench
	$(LLAMA_ENV) $(GO) build $(LLAMA_GOFLAGS) -ldflags '$(LDFLAGS)' -o $(GPU_STAGE)/ ./cmd/hydra-plugin-cuda-llama
	cp $(BIN)/ollama-ggml-src.tar.gz $(GPU_STAGE)/
	tar -cf - -C $(GPU_STAGE) . | xz -T0 -9e > gpu/hydra-gpu.tar.gz
	@ls -la gpu/hydra-gpu.tar.gz

# gpu/prof.tar.gz: bench/scripts/perf-recv.sh with what it needs on a GPU box
# without Go or perf: unstripped engine, mock plugin, hydractl and recv-bench
# (perf names their Go functions), and this machine's perf with its shared
# libraries and loader, run through that loader so the box's own libc does
# not matter.
PERF ?= $(shell command -v perf)
.PHONY: gpu-perf-pack
gpu-perf-pack:
	@test -n "$(PERF)" || (echo "gpu-perf-pack: no perf here (apt-get install linux-perf)" && exit 1)
	@rm -rf gpu/prof && mkdir -p gpu/prof/lib
	CGO_ENABLED=0 $(GO) build -trimpath -o gpu/prof/ ./cmd/hydra-engine ./cmd/hydra-plugin-mock ./cmd/hydractl
	cd bench && CGO_ENABLED=0 $(GO) build -trimpath -o $(CURDIR)/gpu/prof/ ./cmd/recv-bench
	cp bench/scripts/perf-recv.sh bench/scripts/perf-agg.awk $(PERF) gpu/prof/
	cp -L $$(ldd $(PERF) | awk '$$3 ~ /^\// {print $$3}') /lib64/ld-linux-x86-64.so.2 gpu/prof/lib/
	tar -czf gpu/prof.tar.gz -C gpu prof
	@ls -la gpu/prof.tar.gz

# gpu/perf-tools.tar.xz: the same perf, libraries and scripts without the
# binaries (~8 MB), to carry beside gpu-pack-bench's pack and gpu/libcache:
# bench/scripts/perf-recv.sh on the llama plugin (BIN, PLUGIN, PLUGIN_ARGS).
.PHONY: gpu-perf-tools
gpu-perf-tools: gpu-perf-pack
	tar -cf - -C gpu/prof perf lib perf-recv.sh perf-agg.awk | xz -T0 -9e > gpu/perf-tools.tar.xz
	@ls -la gpu/perf-tools.tar.xz
