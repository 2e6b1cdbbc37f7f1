# weir — build and test. `make test` is what CI runs (.ci/run).
GO         ?= go
GOBIN      := $(shell $(GO) env GOPATH)/bin
STATICCHECK := $(GOBIN)/staticcheck
# Peers the end-to-end tests drive; deps.sh installs what is missing.
export WEIR_DEPS_EXTRA ?= nginx caddy chromium

# Modules of their own (peer libraries stay out of weir's go.mod).
NESTED     := bench examples/gin examples/echo

.PHONY: all build test deps vet lint unit nested tidy bench bench-redis bench-serve fuzz fmt clean

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
bench-redis:
	./bench/redis/run.sh

# weir serve on Redis under weir bench over gRPC (STORE=memory for no Redis).
bench-serve:
	./bench/serve/run.sh

# Fuzzing: long runs live here, not in `make test` (which replays the seed corpus).
FUZZTIME ?= 60s
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParseLimit -fuzztime $(FUZZTIME) .
	$(GO) test -run '^$$' -fuzz FuzzKey -fuzztime $(FUZZTIME) .
	$(GO) test -run '^$$' -fuzz FuzzTake -fuzztime $(FUZZTIME) ./algorithm

clean:
	rm -rf bin
