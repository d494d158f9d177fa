# hydra-engine — see README.md.
GO        ?= go
BIN       := bin
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
# Static where we can: the pure-Go binaries then run on any Linux (the GPU box too).
export CGO_ENABLED ?= 0

RPC       ?= tcp://127.0.0.1:9510
HTTP      ?= 127.0.0.1:8080
BACKEND   ?= mock
# A count, not a duration: with -fuzztime as a duration Go 1.26's fuzz
# coordinator can report its own deadline as a failure under CPU contention
# ("context deadline exceeded", no crasher; golang/go#75804, fixed in 1.27).
FUZZTIME  ?= 20000x
LONGFUZZ  ?= 10m
BENCHTIME ?= 3x

# Fuzz targets as package:Target.
FUZZ_TARGETS := \
	./transport:FuzzParseRequestHeader \
	./transport:FuzzParseResponseHeader \
	./transport:FuzzParseDecodeFrames \
	./transport:FuzzReadBlobHeader \
	./host:FuzzParseConfigure \
	./host:FuzzParsePrefill \
	./host:FuzzParseDecode \
	./host:FuzzParseSwapQuant \
	./host:FuzzConfigureInfo \
	./host:FuzzCountMessages \
	./host/combined:FuzzReadMessage \
	./host/httpapi:FuzzCompletionBody \
	./host/httpapi:FuzzMessagesBody \
	./host/httpapi:FuzzResponsesBody \
	./host/httpapi:FuzzNativeBody \
	./plugins/cuda-llama:FuzzReadStateHead \
	./plugins/cuda-llama:FuzzMaxRow \
	./plugins/cuda-llama:FuzzInPlace \
	./plugins/cuda-llama/internal/prompt:FuzzSplit \
	./plugins/cuda-llama/internal/prompt:FuzzProtectJSON

.PHONY: all build run test vet staticcheck unit race fuzz-brief fuzz bench bench-test otel-test bench-go soak proto clean

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/hydra-engine ./cmd/hydra-plugin-mock ./cmd/hydractl

# The engine on BACKEND (mock), Hydra RPC on RPC (tcp://127.0.0.1:9510), HTTP on
# HTTP (127.0.0.1:8080; make run HTTP=:9090, or HTTP= for none).
# make run BACKEND=cuda-llama builds the llama plugin first and, without a
# MODEL, runs the tests' tiny random-weight model (bin/tiny.gguf).
MODEL ?= $(if $(filter cuda-llama,$(BACKEND)),$(BIN)/tiny.gguf)
run: build $(if $(filter cuda-llama,$(BACKEND)),build-llama $(if $(filter $(BIN)/tiny.gguf,$(MODEL)),$(BIN)/tiny.gguf))
	$(BIN)/hydra-engine --rpc $(RPC) --http '$(HTTP)' --backend $(BACKEND) $(if $(MODEL),--model $(MODEL)) $(ARGS)

# The checks that need llama.cpp (test-llama, staticcheck-llama) come last;
# its fetch and CMake build (cold: minutes) run meanwhile at a lower
# priority, beside the checks that do not need it, whose tests leave a core
# idle much of the time. The race run is every test of ./... (make unit runs
# them without the detector, for the inner loop), and the brief fuzzing, one
# worker a target, takes the core its end-to-end tests leave idle.
# build/go.mod makes build/ a module of its own, which ./... then skips: vet,
# staticcheck and the tests walk the tree while CMake creates and removes
# directories in it (vet failed on a vanishing CMakeFiles/Progress).
test: test-fixtures
	@mkdir -p build; echo 'module build' > build/go.mod; log=build/llama-libs.log; flog=build/fuzz-brief.log; \
	nice -n 10 $(MAKE) --no-print-directory llama-libs >$$log 2>&1 & libs=$$!; \
	nice -n 5 $(MAKE) --no-print-directory fuzz-brief FUZZ_PARALLEL=1 >$$flog 2>&1 & fuzz=$$!; \
	$(MAKE) --no-print-directory vet staticcheck-go race; rc=$$?; \
	if wait $$fuzz; then echo "fuzz-brief: passed beside the checks above ($$flog)"; \
	else cat $$flog; echo "make test: fuzzing failed (above; $$flog)"; rc=1; fi; \
	if ! wait $$libs; then cat $$log; echo "make test: the llama.cpp build failed (above; $$log)"; exit 1; fi; \
	echo "llama.cpp: fetched and built beside the checks above ($$log)"; \
	[ $$rc = 0 ] || exit $$rc; \
	$(MAKE) --no-print-directory staticcheck-llama test-llama bench-test otel-test

vet:
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || (echo "gofmt: files above need formatting" && exit 1)
	$(GO) vet ./...

# staticcheck from the module proxy, pinned; the llama plugin's cgo files too,
# built (go list -export) with -trimpath as go build and go test build them,
# so that the plugin's C++ is compiled once for all three.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
.PHONY: staticcheck-go staticcheck-llama
staticcheck: staticcheck-go staticcheck-llama
staticcheck-go:
	$(GO) run $(STATICCHECK) ./...
staticcheck-llama: llama-libs
	$(LLAMA_ENV) GOFLAGS=-trimpath $(GO) run $(STATICCHECK) -tags llama ./plugins/cuda-llama/... ./cmd/hydra-plugin-cuda-llama ./tests/

unit: hydra-head-maybe
	@if [ -x $(BIN)/hydra-head ]; then export $(HYDRA_HEAD_ENV); fi; \
	$(GO) test -count=1 -timeout 15m ./...

# All tests again under the race detector; the end-to-end tests then build
# the engine, the mock plugin and hydractl with it too (tests/race_on_test.go)
# and fail on a race report in the engine's or the plugin's output.
race: hydra-head-maybe
	@if [ -x $(BIN)/hydra-head ]; then export $(HYDRA_HEAD_ENV); fi; \
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 30m ./...

# Each fuzz target briefly, from its checked-in corpus; FUZZ_PARALLEL caps
# its workers (default: one a CPU).
fuzz-brief:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$pkg $$name ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $(if $(FUZZ_PARALLEL),-parallel $(FUZZ_PARALLEL)) $$pkg; \
	done

# Longer fuzzing: make fuzz LONGFUZZ=1h
fuzz:
	@$(MAKE) --no-print-directory fuzz-brief FUZZTIME=$(LONGFUZZ)

# The state-transfer benchmark: raw socket vs both data planes, TCP and Unix;
# writes docs/benchmarks/state-transfer.{md,svg}. hydra-bench is built from
# the bench/ module. BENCH_ARGS=--quick for a smoke run,
# BENCH_ARGS="--targets-only --reps 8" for the targets' rows only.
bench: build
	cd bench && $(GO) build -trimpath -o $(CURDIR)/$(BIN)/ ./cmd/hydra-bench
	$(BIN)/hydra-bench --bin $(BIN) --out docs/benchmarks $(BENCH_ARGS)

# The bench/ module (a module of its own, outside ./... here): vet and tests.
bench-test:
	cd bench && $(GO) vet ./... && $(GO) test -count=1 ./...

# The traces against an OpenTelemetry Collector's OTLP receiver
# (tests/otelcol, a module of its own so the collector stays out of the
# product's go.mod and binaries): vet and tests.
otel-test:
	cd tests/otelcol && $(GO) vet ./... && $(GO) test -count=1 ./...

# Decode throughput at 1–32 concurrent streams, side by side in one run:
# ours (engine + llama plugin over HTTP), Ollama (bin/ollama, built by
# bench/scripts/build-ollama.sh from the module version bench/go.mod pins)
# llama-server built from the plugin's llama.cpp tree (make llama-server) and
# llama.cpp's own batched decode (bin/llama-batched, linked against the same
# tree), one after another on one gguf-gen model; writes
# docs/benchmarks/decode-cpu.{md,svg} (bench/cmd/decode-bench; DECODE_ARGS:
# more of its flags).
# BENCH_CFLAGS are the C flags of all three llama.cpp builds, so that the
# comparison is of the serving code, not of the compiler: -march=native,
# because our plugin's default build is baseline x86-64 (scalar f16 dot
# products, a third of the speed); -mno-amx-int8, because the ollama
# module's cgo packages leave out ggml-cpu/amx, which -march=native on an AMX
# CPU (this box's) makes ggml-cpu.cpp call: undefined reference at link. Our
# plugin gets them as the C flags of its ggml-cpu (CPU variant "bench",
# mk/llama.mk); it goes to DECODE_BIN, apart from make build-llama's. A new
# BENCH_CFLAGS is a cold compile of ggml-cpu for the plugin, of the Ollama
# module's llama.cpp for llama-batched and for Ollama (~2-4 minutes each
# here); bin/ollama is rebuilt only when its .cflags differ, the model only
# when DECODE_MODEL_ARGS do. On 2 cores concurrency above 4 says nothing:
# DECODE_CONC=1,2,4.
BENCH_CFLAGS      ?= -O2 -march=native -mno-amx-int8
LLAMA_CPU_CFLAGS_bench = $(BENCH_CFLAGS)
# The Ollama module (bench/go.mod) and the cgo environment of its llama.cpp,
# for bench/cmd/llama-batched.
OLLAMA_DIR         = $(eval OLLAMA_DIR := $(shell cd bench && $(GO) mod download github.com/ollama/ollama && $(GO) list -m -f '{{.Dir}}' github.com/ollama/ollama))$(OLLAMA_DIR)
OLLAMA_LLAMA_ENV   = CGO_ENABLED=1 CGO_CPPFLAGS="-I$(OLLAMA_DIR)/llama/llama.cpp/include -I$(OLLAMA_DIR)/llama/llama.cpp/src -I$(OLLAMA_DIR)/ml/backend/ggml/ggml/include"
BENCH_OLLAMA_ENV   = $(OLLAMA_LLAMA_ENV) CGO_CFLAGS="$(BENCH_CFLAGS)" CGO_CXXFLAGS="$(BENCH_CFLAGS)"
DECODE_BIN        ?= $(BIN)/decode
DECODE_CONC       ?= 1,2,4
DECODE_SLOTS      ?= 4
DECODE_MODEL      ?= $(BIN)/decode-cpu.gguf
DECODE_MODEL_ARGS ?= -layers 8 -embd 512 -heads 8 -kv-heads 4 -ff 1408 -vocab 32000 -ctx 8192 -f16
DECODE_ARGS       ?=
.PHONY: bench-decode
bench-decode: build llama-libs
	$(call llama-cpu,bench)
	$(MAKE) --no-print-directory build-llama BIN=$(DECODE_BIN) LLAMA_BUILD_LEVELS= LLAMA_ENV='$(call llama-cpu-env,bench)'
	echo '$(BENCH_CFLAGS)' > $(DECODE_BIN)/hydra-plugin-cuda-llama.cflags
	cd bench && $(call llama-cpu-env,bench) $(GO) build $(LLAMA_GOFLAGS) -ldflags '$(LDFLAGS)' -o $(CURDIR)/$(BIN)/ ./cmd/llama-batched
	echo '$(BENCH_CFLAGS)' > $(BIN)/llama-batched.cflags
	cd bench && $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(CURDIR)/$(BIN)/ ./cmd/decode-bench
	@if [ -x $(BIN)/ollama ] && [ "$$(cat $(BIN)/ollama.cflags 2>/dev/null)" = '$(BENCH_CFLAGS)' ]; then \
		echo "$(BIN)/ollama: built with $(BENCH_CFLAGS), kept"; \
	else bench/scripts/build-ollama.sh $(BIN)/ollama '$(BENCH_CFLAGS)'; fi
	@if [ ! -f $(DECODE_MODEL) ] || [ "$$(cat $(DECODE_MODEL).args 2>/dev/null)" != '$(DECODE_MODEL_ARGS)' ]; then \
		$(DECODE_BIN)/gguf-gen -o $(DECODE_MODEL) $(DECODE_MODEL_ARGS) && echo '$(DECODE_MODEL_ARGS)' > $(DECODE_MODEL).args; fi
	$(BIN)/decode-bench -bin $(BIN) -plugin $(DECODE_BIN)/hydra-plugin-cuda-llama -model $(DECODE_MODEL) \
		-c $(DECODE_CONC) -slots $(DECODE_SLOTS) -out docs/benchmarks $(DECODE_ARGS)

# gpu/decode-gpu.tar.xz (at most 60 MiB): what bench/scripts/gpu-decode.sh
# needs on the H200 box, which has no Go and no network: the engine, the llama
# plugin (its own baseline build: it runs on any host CPU, and with the model
# on the GPU the CPU only samples), llama-batched (the plugin's tree, so the
# CUDA library built from it serves both), llama-server (make llama-server,
# the same tree), Ollama built with GPU_BENCH_CFLAGS (default -O2; it runs
# its own module's ggml and CUDA build), gguf-gen, decode-bench, Qwen3's
# tokenizer (the agent measurement's chat template), and the ggml sources
# for make cuda. That Ollama is kept in $(BIN)/gpu.
GPU_BENCH_CFLAGS ?= -O2
GPU_OLLAMA_ENV    = $(OLLAMA_LLAMA_ENV) CGO_CFLAGS="$(GPU_BENCH_CFLAGS)" CGO_CXXFLAGS="$(GPU_BENCH_CFLAGS)"
GPU_DECODE_STAGE := gpu/decode-stage
.PHONY: gpu-pack-decode
# GPU_DECODE_OLLAMA=0 leaves Ollama out (a pack small enough to carry beside
# other files, for runs without it).
GPU_DECODE_OLLAMA ?= 1
gpu-pack-decode: cuda-src llama-libs llama-server tokenizers
	@rm -rf $(GPU_DECODE_STAGE) && mkdir -p $(GPU_DECODE_STAGE)
	cp -a $(LLAMA_SERVER_DIR) $(GPU_DECODE_STAGE)/llama-server
	cp -a $(TOKENIZER_DIR)/qwen3 $(GPU_DECODE_STAGE)/tokenizer-qwen3
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(GPU_DECODE_STAGE)/ ./cmd/hydra-engine ./cmd/gguf-gen
	cd bench && CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(CURDIR)/$(GPU_DECODE_STAGE)/ ./cmd/decode-bench
	$(LLAMA_ENV) $(GO) build $(LLAMA_GOFLAGS) -ldflags '$(LDFLAGS)' -o $(GPU_DECODE_STAGE)/ ./cmd/hydra-plugin-cuda-llama
	cd bench && $(LLAMA_ENV) $(GO) build $(LLAMA_GOFLAGS) -ldflags '$(LDFLAGS)' -o $(CURDIR)/$(GPU_DECODE_STAGE)/ ./cmd/llama-batched
	@if [ '$(GPU_DECODE_OLLAMA)' = 0 ]; then echo "Ollama left out (GPU_DECODE_OLLAMA=0)"; \
	elif [ -x $(BIN)/gpu/ollama ] && [ "$$(cat $(BIN)/gpu/ollama.cflags 2>/dev/null)" = '$(GPU_BENCH_CFLAGS)' ]; then \
		echo "$(BIN)/gpu/ollama: built with $(GPU_BENCH_CFLAGS), kept"; \
	else bench/scripts/build-ollama.sh $(BIN)/gpu/ollama '$(GPU_BENCH_CFLAGS)'; fi
	if [ '$(GPU_DECODE_OLLAMA)' != 0 ]; then cp $(BIN)/gpu/ollama $(BIN)/gpu/ollama.cflags $(GPU_DECODE_STAGE)/; fi
	cp $(LLAMA_CUDA_SRC) $(GPU_DECODE_STAGE)/
	for b in hydra-plugin-cuda-llama llama-batched; do echo '$(GPU_BENCH_CFLAGS)' > $(GPU_DECODE_STAGE)/$$b.cflags; done
	tar -cf - -C $(GPU_DECODE_STAGE) . | xz -T0 -9e > gpu/decode-gpu.tar.xz
	@ls -la gpu/decode-gpu.tar.xz
	@test $$(stat -c %s gpu/decode-gpu.tar.xz) -le 62914560 || (echo "gpu/decode-gpu.tar.xz is over 60 MiB" && exit 1)

# Go micro-benchmarks (the mock's state generator, the client).
bench-go:
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) ./plugins/mock/ ./transport/ ./iface/

# The fault, vanishing-client, shutdown and load tests, SOAK times over.
SOAK ?= 10
soak:
	$(GO) test -count=$(SOAK) -timeout 60m -v -run 'TestPluginCrash|TestPluginDiesWithEngine|TestStatePutClientVanishes|TestStateGetClientVanishes|TestStatePutFailuresEmptyTheSlot|TestGracefulShutdown|TestLoad' ./tests/ | grep -E '^(=== RUN|--- |ok|FAIL|PASS)|requests|goroutines'

proto:
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" protoc --go_out=. --go_opt=module=github.com/hydra-engine/hydra-engine \
		--go-grpc_out=. --go-grpc_opt=module=github.com/hydra-engine/hydra-engine \
		iface/proto/hydra/backend/v1/backend.proto

clean:
	rm -rf $(BIN) build

# The llama.cpp backend: build-llama, test-llama, bench-llama, tiny-model, cuda.
include mk/llama.mk
include mk/testmodels.mk
# hydra-head, the node agent, for the node-configuration tests: hydra-head.
include mk/hydrahead.mk
