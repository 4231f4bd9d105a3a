# kvindex build. Every target needs only Go: buf and the protoc plugins run
# through `go run` at pinned versions.

GO        ?= go
BUF       := $(GO) run github.com/bufbuild/buf/cmd/buf@v1.75.0
PKGS      := ./...
# The repository's Go modules: the main module, the generated API and the
# router's client library (which the main module uses through replace
# directives), the manifests' tests (deploy), the EPP plugin (router/gie)
# and its end-to-end tests and simulator (router/gie/e2e). test, lint and
# verify run in each; internal/doccheck checks this list against the
# go.mod files.
MODULES   := . proto client deploy router/gie router/gie/e2e
# A go.work file outside the repository must not change what each module
# resolves: every module builds from its own go.mod.
export GOWORK := off
# in-modules runs its argument in every module's directory, stopping at
# the first failure.
in-modules = set -e; for m in $(MODULES); do echo "== module $$m" >&2; (cd $$m && $(1)); done
FUZZTIME  ?= 60s
# The race detector needs cgo (a C compiler); without one the tests still
# run, without it, and say so.
RACE      := $(shell [ "$$($(GO) env CGO_ENABLED)" = 1 ] && echo -race)

.PHONY: run test test-short bench lint proto verify fuzz build

## run: start the whole pipeline in one process on embedded defaults
## (ARGS adds standalone flags, e.g. make run ARGS='--liveness-window 1h')
## (built first, then run, so Ctrl-C ends it with its own exit status:
## go run reports an interrupted child as a failure)
run:
	$(GO) build -o bin/kvindex ./cmd/kvindex
	bin/kvindex standalone $(ARGS)

## test: every test of every module, including e2e, with the race detector
test:
ifeq ($(RACE),)
	@echo "make test: no C compiler (go env CGO_ENABLED is 0), so no race detector; running the tests without -race" >&2
endif
	@$(call in-modules,$(GO) test $(RACE) -count=1 -timeout 20m $(PKGS))

## test-short: unit tests only, no race detector (quick local loop)
test-short:
	@$(call in-modules,$(GO) test -short $(PKGS))

## bench: the Go benchmarks of the hot paths
bench:
	@$(call in-modules,$(GO) test -run '^$$' -bench . -benchmem $(PKGS))

## build: the kvindex binary and the benchmark tool kvindex-bench into bin/
build:
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/kvindex ./cmd/kvindex
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/kvindex-bench ./cmd/kvindex-bench

## lint: go vet (every module), gofmt and buf lint
lint:
	@$(call in-modules,$(GO) vet $(PKGS))
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(BUF) lint

## proto: regenerate the Go code of proto/
proto:
	$(BUF) generate

## verify: fail when generated code or any module's go.mod/go.sum are
## stale, or lint fails
verify: lint
	@$(call in-modules,$(GO) mod tidy -diff)
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	  $(BUF) generate -o $$tmp && \
	  diff -r -x '*.proto' -x go.mod -x go.sum $$tmp/proto proto || { echo "generated code is stale: run make proto"; exit 1; }

## fuzz: run every fuzz target for FUZZTIME each
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./internal/events/
	$(GO) test -run '^$$' -fuzz '^FuzzParseKey$$' -fuzztime $(FUZZTIME) ./internal/keyspace/
	$(GO) test -run '^$$' -fuzz '^FuzzEndpointNames$$' -fuzztime $(FUZZTIME) ./internal/keyspace/
	$(GO) test -run '^$$' -fuzz '^FuzzApplyKey$$' -fuzztime $(FUZZTIME) ./internal/index/
	$(GO) test -run '^$$' -fuzz '^FuzzLookupRequest$$' -fuzztime $(FUZZTIME) ./indexd/
	cd client && $(GO) test -run '^$$' -fuzz '^FuzzTokenKeys$$' -fuzztime $(FUZZTIME) .
	$(GO) test -run '^$$' -fuzz '^FuzzPageToken$$' -fuzztime $(FUZZTIME) ./indexd/
	$(GO) test -run '^$$' -fuzz '^FuzzFrameLimiter$$' -fuzztime $(FUZZTIME) ./bridge/
