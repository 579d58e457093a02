# Release binaries. Included from the top-level Makefile; paths are relative
# to the repo root.
#
#   make release   static fleetd binaries for every RELEASE_PLATFORMS entry
#                  in dist/ (fleetd-linux-amd64, fleetd-linux-arm64), plus
#                  dist/SHA256SUMS for `sha256sum -c`
#
# The binaries are static (CGO_ENABLED=0) and reproducible from the commit
# (-trimpath drops local paths). VERSION and COMMIT (top-level Makefile) are
# linked in for `fleetd version`; Go also stamps the VCS revision and whether
# the tree was modified (vcs.revision, vcs.modified: `go version -m
# dist/fleetd-linux-amd64`). -buildvcs=true on the command line wins over
# a GOFLAGS=-buildvcs=false, and building outside a git checkout fails
# rather than produce a binary nobody can trace to its source.

DIST              ?= dist
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64

.PHONY: release
release: ## Cross-build static fleetd binaries into dist/ with SHA256SUMS
	@mkdir -p $(DIST) && rm -f $(DIST)/fleetd-* $(DIST)/SHA256SUMS
	@set -e; for p in $(RELEASE_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; out=$(DIST)/fleetd-$$os-$$arch; \
		echo "build $$out ($(VERSION), $(COMMIT))"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch \
			$(GO) build -trimpath -buildvcs=true -ldflags "$(LDFLAGS)" -o $$out ./cmd/fleetd; \
	done
	cd $(DIST) && sha256sum fleetd-* > SHA256SUMS
	@cat $(DIST)/SHA256SUMS

# The agents nodes download from the daemon, next to bin/fleetd where the
# daemon looks for them (agent_dir unset): bin/fleetd-linux-amd64 and
# bin/fleetd-linux-arm64. Separate from `make build` to keep it fast; a
# daemon built for linux/amd64 or linux/arm64 serves its own platform
# without them.
.PHONY: agents
agents: ## Cross-build the node agents (linux/amd64, linux/arm64) into bin/
	@mkdir -p $(dir $(BIN))
	@set -e; for p in $(RELEASE_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; out=$(dir $(BIN))fleetd-$$os-$$arch; \
		echo "build $$out"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $$out ./cmd/fleetd; \
	done
