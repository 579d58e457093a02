# Protocol buffers: generated code for the provider plugin protocol.
# Included from the top-level Makefile; paths are relative to the repo root.
#
#   make proto        regenerate plugins/proto/**/*.pb.go (commit the result)
#   make proto-check  regenerate into a temp dir and fail if the committed code is stale
#   make proto-tools  install the pinned code generators
#
# The generators are pinned here and installed into versioned directories so
# regeneration is reproducible and never picks up whatever happens to be on
# PATH. plugins/proto/provider/v1's generate test reads these pins too.
# protoc itself only stamps its version into a header comment, which both
# checks ignore, so any protoc 3.x+ will do (CI and dev machines: 3.21.12).

PROTOC                     ?= protoc
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
PROTO_TOOLS_DIR            ?= $(shell go env GOPATH)/fleetd-tools
PROTOC_GEN_GO              := $(PROTO_TOOLS_DIR)/protoc-gen-go-$(PROTOC_GEN_GO_VERSION)/protoc-gen-go
PROTOC_GEN_GO_GRPC         := $(PROTO_TOOLS_DIR)/protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION)/protoc-gen-go-grpc

PROTO_ROOT  := plugins/proto
PROTO_FILES := provider/v1/provider.proto
PROTO_GO    := $(PROTO_FILES:.proto=.pb.go) $(PROTO_FILES:.proto=_grpc.pb.go)

# protoc_gen runs protoc with the pinned generators, writing under $(1).
define protoc_gen
$(PROTOC) -I $(PROTO_ROOT) \
	--plugin=protoc-gen-go=$(PROTOC_GEN_GO) \
	--plugin=protoc-gen-go-grpc=$(PROTOC_GEN_GO_GRPC) \
	--go_out=$(1) --go_opt=paths=source_relative \
	--go-grpc_out=$(1) --go-grpc_opt=paths=source_relative \
	$(PROTO_FILES)
endef

$(PROTOC_GEN_GO):
	GOBIN=$(dir $@) GOFLAGS=-buildvcs=false go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(PROTOC_GEN_GO_GRPC):
	GOBIN=$(dir $@) GOFLAGS=-buildvcs=false go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

.PHONY: proto proto-check proto-tools

proto-tools: $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC) ## Install the pinned protoc generators

proto: proto-tools ## Regenerate the plugin protocol Go code (commit the result)
	$(call protoc_gen,$(PROTO_ROOT))

# diff -I drops hunks that only differ in the "// protoc vX" header line.
proto-check: proto-tools ## Fail if the committed generated code is stale
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(call protoc_gen,$$tmp) && \
	status=0 && \
	for f in $(PROTO_GO); do \
		if ! diff -u -I '^//[[:space:]]*protoc[[:space:]]' "$(PROTO_ROOT)/$$f" "$$tmp/$$f"; then \
			echo "$(PROTO_ROOT)/$$f is stale: run 'make proto' and commit the result" >&2; status=1; \
		fi; \
	done; \
	exit $$status
