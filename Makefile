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
	./plugins/cuda-llama:FuzzReadStateHead \
	./plugins/cuda-llama:FuzzMaxRow \
	./plugins/cuda-llama:FuzzInPlace

.PHONY: all build run test vet staticcheck unit race fuzz-brief fuzz bench bench-test bench-go soak proto clean

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

test: vet staticcheck unit race fuzz-brief test-llama bench-test

vet:
	@test -z "$$(gofmt -l . | tee /dev/stderr)" || (echo "gofmt: files above need formatting" && exit 1)
	$(GO) vet ./...

# staticcheck from the module proxy, pinned; the llama plugin's cgo files too.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
staticcheck:
	$(GO) run $(STATICCHECK) ./...
	$(LLAMA_ENV) $(GO) run $(STATICCHECK) -tags llama ./plugins/cuda-llama/... ./cmd/hydra-plugin-cuda-llama ./tests/

unit:
	$(GO) test -count=1 -timeout 15m ./...

# All tests again under the race detector; the end-to-end tests then build
# the engine, the mock plugin and hydractl with it too (tests/race_on_test.go)
# and fail on a race report in the engine's or the plugin's output.
race:
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 30m ./...

# Each fuzz target briefly, from its checked-in corpus.
fuzz-brief:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "fuzz $$pkg $$name ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) $$pkg; \
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
