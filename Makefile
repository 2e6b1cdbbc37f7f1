# weir — build and test. `make test` is what CI runs (.ci/run).
GO         ?= go
GOBIN      := $(shell $(GO) env GOPATH)/bin
STATICCHECK := $(GOBIN)/staticcheck
# Peers the end-to-end tests drive; deps.sh installs what is missing.
export WEIR_DEPS_EXTRA ?= nginx caddy chromium

# Modules of their own (peer libraries stay out of weir's go.mod).
NESTED     := bench examples/gin examples/echo

.PHONY: all build test deps vet lint unit nested tidy bench bench-redis bench-serve bench-window fuzz same-long fmt clean

all: build

build:
	$(GO) build -o bin/weir ./cmd/weir

deps:
	@./scripts/deps.sh

fmt:
	gofmt -w $$(git ls-files '*.go')

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

lint: deps
	$(STATICCHECK) ./...

unit:
	$(GO) test -race -count=1 -timeout 14m ./...

# The nested modules: vet, staticcheck and their tests.
nested: deps
	@set -e; for m in $(NESTED); do echo "== $$m"; (cd $$m && $(GO) vet ./... && $(STATICCHECK) ./... && $(GO) test -race -count=1 ./...); done

# Keep the nested modules' go.sum in step with the root's dependencies.
tidy:
	@set -e; for m in $(NESTED); do (cd $$m && $(GO) mod tidy); done

# The one command that runs every test: vet, staticcheck, then the race-enabled suite.
test: deps vet lint unit nested

# Benchmarks: never part of `make test`; figures go to docs/benchmarks.md.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./store/memstore/
	cd bench && $(GO) test -run '^$$' -bench . -benchmem ./...

# Redis: decisions/s through redisstore against redis-benchmark's ceiling,
# and MEMORY USAGE per key; prints the tables in docs/benchmarks.md.
# Then a Redis Cluster node's CPU per decision against standalone's
# (CLUSTER_ONLY=1 for that table alone).
bench-redis:
	./bench/redis/run.sh

# sliding_window against the exact sliding_log on a seeded Poisson trace;
# prints the table in docs/algorithms.md. Flags: cd bench && go run ./window -h.
bench-window:
	cd bench && $(GO) run ./window

# weir serve on Redis under weir bench over gRPC (STORE=memory for no Redis).
bench-serve:
	./bench/serve/run.sh

# The Redis differential test, long: memstore and redisstore (standalone and
# a cluster, whose cross-slot batches refund) through SAME_STEPS random steps
# per algorithm, result for result; `make test` runs 1500 and 600.
# SAME_SEED picks another workload. Never part of `make test`.
SAME_STEPS ?= 30000
SAME_SEED ?= 99
same-long:
	WEIR_SAME_STEPS=$(SAME_STEPS) WEIR_SAME_SEED=$(SAME_SEED) $(GO) test -count=1 -timeout 60m \
	  -run 'TestSameAsMemstore|TestCluster/SameAsMemstore' ./store/redisstore/

# Fuzzing: long runs live here, not in `make test` (which replays the seed
# corpus). Every target runs for FUZZTIME in turn; docs/operations.md records
# a run. FUZZ=FuzzCheckBody runs one (by name).
FUZZTIME ?= 60s
FUZZ_TARGETS := \
	.:FuzzParseLimit .:FuzzKey ./algorithm:FuzzTake \
	./policy:FuzzParseConfig ./policy:FuzzParseHostAddr ./policy:FuzzPathPattern \
	./server:FuzzCheckBody ./server:FuzzAuthHeaders \
	./server/envoyrls:FuzzShouldRateLimit ./server/envoyrls:FuzzCheckJSON ./server/envoyrls:FuzzParse
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; name=$${t##*:}; \
	  if [ -n "$(FUZZ)" ] && [ "$(FUZZ)" != "$$name" ]; then continue; fi; \
	  echo "== $$name ($$pkg, $(FUZZTIME))"; \
	  $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg; done

clean:
	rm -rf bin
