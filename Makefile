# fleetd — run `make help` for the targets.
SHELL := /bin/bash
GO ?= go
BIN := bin/fleetd
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
TEST_TIMEOUT ?= 20m
TEST_PKGS ?= ./...
TEST_FLAGS ?=
# Skips `make test` accepts; any other skip fails the run (scripts/testsummary).
SKIPS_ALLOWED ?= .ci/skips-allowed.txt
# go test -json through the summarizer: package lines as they finish, failed
# tests' output, and every skip with its reason at the end. pipefail keeps
# go test's own exit status too (a crash of the go command itself).
define go_test_summarized
set -o pipefail; $(GO) build -o bin/testsummary ./scripts/testsummary && \
$(GO) test -json $(1) $(TEST_FLAGS) -timeout $(TEST_TIMEOUT) $(TEST_PKGS) 2>&1 | bin/testsummary -allow $(SKIPS_ALLOWED)
endef

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*?## "} /^[a-zA-Z_-]+:.*?## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

HOSTARCH := $(shell $(GO) env GOARCH)

.PHONY: build
build: ## Build bin/fleetd and the slim node agent for this architecture next to it
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/fleetd
	CGO_ENABLED=0 GOOS=linux GOARCH=$(HOSTARCH) $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" \
		-o $(dir $(BIN))fleetd-agent-linux-$(HOSTARCH) ./cmd/fleetd-agent

.PHONY: test
test: ## Run all tests (what CI runs); fails on a skip not in .ci/skips-allowed.txt
	@$(call go_test_summarized,)

.PHONY: test-race
test-race: ## Run all tests with the race detector
	@$(call go_test_summarized,-race)

.PHONY: lint
lint: ## gofmt check and go vet
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

.PHONY: demo
demo: build ## Run the demo: a local fleet surviving a spot interruption
	$(GO) run ./examples/demo -bin $(BIN)

.PHONY: bench
bench: build ## Run the benchmarks (bench/run.sh, about 25 min); fails on any missed target (BENCH_STRICT=0: report only)
	FLEETD_BIN=$(BIN) bench/run.sh

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 20s)
	@./scripts/fuzz.sh $${FUZZTIME:-20s}

.PHONY: chaos
chaos: ## Long chaos, partition, HA and load suites (CHAOS_RUNS, CHAOS_SEED, CHAOS_FAULTS, FLEETD_HA_CHAOS_ROUNDS)
	FLEETD_CHAOS_LONG=1 $(GO) test -count=1 -v -timeout 60m -run 'TestProviderOutage|TestLoad|TestLifecycleModel' ./fleet/
	FLEETD_CHAOS_LONG=1 $(GO) test -count=1 -v -timeout 60m -run 'TestChaos|TestPartition|TestHAChaos|TestProjectScalingE2E|TestBudgetPauseE2E' ./cmd/fleetd/ \
		-chaos.runs=$${CHAOS_RUNS:-0} -chaos.seed=$${CHAOS_SEED:-0} -chaos.faults=$${CHAOS_FAULTS:-0}

.PHONY: clean
clean: ## Remove build output
	rm -rf bin dist

-include mk/*.mk
