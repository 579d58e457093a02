# Release binaries. Included from the top-level Makefile; paths are relative
# to the repo root.
#
#   make release   for every RELEASE_PLATFORMS entry, into dist/:
#                    fleetd-linux-ARCH              the daemon and CLI
#                    fleetd-agent-linux-ARCH        the slim node agent (what nodes download)
#                    fleetd-agent-node-linux-ARCH   the agent with the s3/gcs drivers, for
#                                                   fleets with checkpoint access = "node"
#                  plus dist/SHA256SUMS for `sha256sum -c`
#   make agents    the two agent builds for every platform into bin/, next
#                  to bin/fleetd where the daemon looks for them
#
# The binaries are static (CGO_ENABLED=0), stripped (-s -w: no symbol table
# or DWARF, a third smaller; panics still print file:line) and reproducible
# from the commit: -trimpath drops local paths, and the same toolchain,
# flags and commit give the same bytes (TestReleaseBinary builds twice).
# VERSION and COMMIT (top-level Makefile) are linked in for `fleetd
# version`; Go also stamps the VCS revision and whether the tree was
# modified (vcs.revision, vcs.modified: `go version -m
# dist/fleetd-linux-amd64`). -buildvcs=true on the command line wins over a
# GOFLAGS=-buildvcs=false, and building outside a git checkout fails rather
# than produce a binary nobody can trace to its source.

DIST              ?= dist
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64
RELEASE_LDFLAGS   := -s -w $(LDFLAGS)

# xbuild OUT, PLATFORM (os/arch), EXTRA go build flags, PACKAGE
define xbuild
	CGO_ENABLED=0 GOOS=$(word 1,$(subst /, ,$(2))) GOARCH=$(word 2,$(subst /, ,$(2))) \
		$(GO) build -trimpath -buildvcs=true $(3) -ldflags "$(RELEASE_LDFLAGS)" -o $(1) $(4)
endef

.PHONY: release
release: ## Cross-build static, stripped fleetd and agent binaries into dist/ with SHA256SUMS
	@mkdir -p $(DIST) && rm -f $(DIST)/fleetd-* $(DIST)/SHA256SUMS
	@echo "release $(VERSION) ($(COMMIT)) for $(RELEASE_PLATFORMS)"
	$(foreach p,$(RELEASE_PLATFORMS),\
		$(call xbuild,$(DIST)/fleetd-$(subst /,-,$(p)),$(p),,./cmd/fleetd) && \
		$(call xbuild,$(DIST)/fleetd-agent-$(subst /,-,$(p)),$(p),,./cmd/fleetd-agent) && \
		$(call xbuild,$(DIST)/fleetd-agent-node-$(subst /,-,$(p)),$(p),-tags nodestore,./cmd/fleetd-agent) && ) true
	cd $(DIST) && sha256sum fleetd-* > SHA256SUMS
	@cat $(DIST)/SHA256SUMS
	@ls -l $(DIST)

# The agents nodes download from the daemon, next to bin/fleetd where the
# daemon looks for them (agent_dir unset). `make build` makes the slim one
# for this machine's architecture; this makes both builds for every
# platform.
.PHONY: agents
agents: ## Cross-build the node agents (slim and node-store; linux/amd64, linux/arm64) into bin/
	@mkdir -p $(dir $(BIN))
	$(foreach p,$(RELEASE_PLATFORMS),\
		$(call xbuild,$(dir $(BIN))fleetd-agent-$(subst /,-,$(p)),$(p),,./cmd/fleetd-agent) && \
		$(call xbuild,$(dir $(BIN))fleetd-agent-node-$(subst /,-,$(p)),$(p),-tags nodestore,./cmd/fleetd-agent) && ) true
