# weir — build and test. `make test` is what CI runs (.ci/run).
GO         ?= go
GOBIN      := $(shell $(GO) env GOPATH)/bin
STATICCHECK := $(GOBIN)/staticcheck
# Peers the end-to-end tests drive; deps.sh installs what is missing.
export WEIR_DEPS_EXTRA ?= nginx caddy chromium

.PHONY: all build test deps vet lint unit bench bench-redis soak fuzz fmt clean

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

# The one command that runs every test: vet, staticcheck, then the race-enabled suite.
test: deps vet lint unit
	cd bench && $(GO) vet ./... && $(GO) test -count=1 -run . ./...

# Benchmarks: never part of `make test`; figures go to docs/benchmarks.md.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./store/memstore/
	cd bench && $(GO) test -run '^$$' -bench . -benchmem ./...

# Fuzzing: long runs live here, not in `make test` (which replays the seed corpus).
FUZZTIME ?= 60s
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParseLimit -fuzztime $(FUZZTIME) .
	$(GO) test -run '^$$' -fuzz FuzzKey -fuzztime $(FUZZTIME) .
	$(GO) test -run '^$$' -fuzz FuzzTake -fuzztime $(FUZZTIME) ./algorithm

clean:
	rm -rf bin
