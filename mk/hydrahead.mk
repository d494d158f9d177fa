# hydra-head, the Hydra node agent, for the node-configuration tests
# (tests/hydrahead_test.go): included by the Makefile.
#
#   make hydra-head   bin/hydra-head, built from src/head of the Hydra repository
#                     at the commit the test's configurations come from
#                     (tests/testdata/hydra-head/ORIGIN), and that commit's
#                     infra/hydra-head/config beside its source
#
# HYDRA_VORTEX is the repository: its URL (default), or the path of a local
# clone, bare or not (make hydra-head HYDRA_VORTEX=/srv/git/hydra_vortex). From
# a URL, a partial clone with a sparse checkout of those two folders is kept:
# only their blobs are fetched. The agent's module dependencies come from the
# Go module proxy and are checked against its go.sum (-mod=readonly); nothing
# else is fetched. Its source is kept in HYDRA_HEAD_CACHE, outside this
# repository, whose gofmt, vet and staticcheck are not for it.

HYDRA_VORTEX       ?= https://github.com/ddvnguyen/hydra_vortex
HYDRA_VORTEX_REV   := $(shell sed -n 's/^commit //p' tests/testdata/hydra-head/ORIGIN)
HYDRA_HEAD_CACHE   ?= $(HOME)/.cache/hydra-engine
HYDRA_HEAD_SRC     := $(HYDRA_HEAD_CACHE)/hydra-vortex-$(HYDRA_VORTEX_REV)
HYDRA_VORTEX_CLONE := $(HYDRA_HEAD_CACHE)/hydra-vortex
HYDRA_HEAD_PATHS   := src/head infra/hydra-head/config
# What the test reads (make unit and race pass them on).
HYDRA_HEAD_ENV      = HYDRA_HEAD=$(CURDIR)/$(BIN)/hydra-head HYDRA_HEAD_CONFIG=$(HYDRA_HEAD_SRC)/infra/hydra-head/config

.PHONY: hydra-head hydra-head-maybe
hydra-head: $(BIN)/hydra-head

# hydra-head where its source can be had; CI, which reaches no GitHub, goes
# on without it, and tests/hydrahead_test.go skips, saying why.
hydra-head-maybe:
	@$(MAKE) --no-print-directory hydra-head 2>$(BIN)/hydra-head.log || \
		echo "hydra-head: not built, the Hydra repository is out of reach ($(BIN)/hydra-head.log); the node-configuration tests skip (make hydra-head HYDRA_VORTEX=PATH)"

$(BIN)/hydra-head: $(HYDRA_HEAD_SRC)/src/head/go.mod
	@mkdir -p $(BIN)
	cd $(HYDRA_HEAD_SRC)/src/head && CGO_ENABLED=0 GOFLAGS=-mod=readonly $(GO) build -trimpath -o $(CURDIR)/$(BIN)/hydra-head .

# The two folders at HYDRA_VORTEX_REV: archived from a local clone, or
# checked out in the sparse clone of the URL (the commit fetched when the
# clone lacks it). go.mod is touched: the archive gives it the commit's time.
$(HYDRA_HEAD_SRC)/src/head/go.mod: tests/testdata/hydra-head/ORIGIN
	@test -n '$(HYDRA_VORTEX_REV)' || (echo "tests/testdata/hydra-head/ORIGIN names no commit" && exit 1)
	@rm -rf $(HYDRA_HEAD_SRC) && mkdir -p $(HYDRA_HEAD_SRC)
	@set -e; if [ -d '$(HYDRA_VORTEX)' ]; then \
		git -C '$(HYDRA_VORTEX)' archive -o $(HYDRA_HEAD_SRC).tar '$(HYDRA_VORTEX_REV)' $(HYDRA_HEAD_PATHS); \
		tar -x -f $(HYDRA_HEAD_SRC).tar -C $(HYDRA_HEAD_SRC) && rm -f $(HYDRA_HEAD_SRC).tar; \
	else \
		if [ ! -d $(HYDRA_VORTEX_CLONE)/.git ]; then \
			git clone --quiet --filter=blob:none --no-checkout --sparse '$(HYDRA_VORTEX)' $(HYDRA_VORTEX_CLONE); \
			git -C $(HYDRA_VORTEX_CLONE) sparse-checkout set $(HYDRA_HEAD_PATHS); \
		fi; \
		git -C $(HYDRA_VORTEX_CLONE) cat-file -e '$(HYDRA_VORTEX_REV)^{commit}' 2>/dev/null || \
			git -C $(HYDRA_VORTEX_CLONE) fetch --quiet --filter=blob:none origin '$(HYDRA_VORTEX_REV)'; \
		git -C $(HYDRA_VORTEX_CLONE) -c advice.detachedHead=false checkout --quiet '$(HYDRA_VORTEX_REV)'; \
		tar -C $(HYDRA_VORTEX_CLONE) -cf - $(HYDRA_HEAD_PATHS) | tar -x -C $(HYDRA_HEAD_SRC); \
	fi
	@test -f $@ && touch $@
	@echo "$(HYDRA_HEAD_SRC): $(HYDRA_HEAD_PATHS) of $(HYDRA_VORTEX) at $(HYDRA_VORTEX_REV)"
