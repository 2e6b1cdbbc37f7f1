# weir — build and test. `make test` is what CI runs (.ci/run).
GO         ?= go
GOBIN      := $(shell $(GO) env GOPATH)/bin
STATICCHECK := $(GOBIN)/staticcheck
# Peers the end-to-end tests drive; deps.sh installs what is missing.
export WEIR_DEPS_EXTRA ?= nginx caddy chromium prometheus

# Modules of their own (peer libraries stay out of weir's go.mod).
NESTED     := bench examples/gin examples/echo

.PHONY: all build release release-check image compose-images demo test-fleet test deps vet lint unit nested promtool-test test-helm tidy bench bench-debt bench-redis bench-overload bench-serve bench-serve-ab bench-peer test-peer bench-resp bench-flood bench-sizing bench-lease bench-window bench-replay fuzz same-long test-gateway-full fmt clean

all: build

build:
	$(GO) build -buildvcs=auto -o bin/weir ./cmd/weir

# Release binaries: static, reproducible, for linux amd64/arm64 and darwin
# arm64, with SHA256SUMS, into dist/ (scripts/release.sh).
release:
	GO=$(GO) ./scripts/release.sh

# Two builds of the release binary, in two build caches, must be
# byte-identical (run by CI after `make test`).
release-check:
	GO=$(GO) ./scripts/release.sh --check

# The container image (deploy/image/Dockerfile): the static linux binary for
# this machine's architecture, FROM scratch (the build pulls nothing), as
# weir:<version> and weir:latest; IMAGE=name:tag for another name.
image:
	GO=$(GO) ./scripts/image.sh

# Compose v2's plugin where it exists, else Compose v1.
COMPOSE = $(shell docker compose version >/dev/null 2>&1 && echo "docker compose" || echo docker-compose)

# The Compose demo's images (weir, Redis, nginx, the app), each FROM scratch
# from this machine's files (deploy/compose/build.sh); WEIR_DEMO_TAG, default demo.
compose-images:
	GO=$(GO) ./deploy/compose/build.sh

# The Compose demo: nginx on localhost:8000 in front of an app, two weir
# instances on one Redis, weir-1's dashboard on localhost:8080.
demo: compose-images
	cd deploy/compose && $(COMPOSE) up

# The container, Compose and fault tests on this machine's Docker (deploy/,
# build tag fleet): weir and Redis each in a container, on private networks,
# cut off, failed over, split and restarted (docs/operations.md, "Faults
# across hosts"); and the Helm chart's tests (test-helm). Never part of
# `make test`. CI runs it after `make test`.
test-fleet: test-helm
	$(GO) test -tags fleet -count=1 -timeout 14m -v ./deploy/

deps:
	@./scripts/deps.sh

fmt:
	gofmt -w $$(git ls-files '*.go')

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags bench ./cmd/weir/

# -tags bench: weir bench's lean gRPC client, left out of the product binary.
# apicount bounds the exported identifiers of the public packages and of
# the root package (scripts/apicount).
lint: deps
	$(STATICCHECK) ./...
	$(STATICCHECK) -tags bench ./cmd/weir/
	$(GO) run ./scripts/apicount -max 560 -max-root 70

unit:
	$(GO) test -race -count=1 -timeout 14m ./...
	$(GO) test -race -count=1 -tags bench -run 'Bench|NoHandWritten' ./cmd/weir/

# The nested modules: vet, staticcheck and their tests.
nested: deps
	@set -e; for m in $(NESTED); do echo "== $$m"; (cd $$m && $(GO) vet ./... && $(STATICCHECK) ./... && $(GO) test -race -count=1 ./...); done

# Keep the nested modules' go.sum in step with the root's dependencies.
tidy:
	@set -e; for m in $(NESTED); do (cd $$m && $(GO) mod tidy); done

# The example alerting and recording rules: syntax, then promtool's unit
# tests (every alert firing and not firing). Debian's prometheus package
# brings promtool (deps.sh).
promtool-test: deps
	promtool check rules examples/prometheus/recording.yml examples/prometheus/alerts.yml
	cd examples/prometheus && promtool test rules tests.yml

# The Helm chart (deploy/helm/weir): its test module renders it for every
# values file in its ci directory, decodes every object strictly, runs weir
# serve as the Deployment describes it, and keeps deploy/kubernetes in step.
test-helm: deps
	cd deploy/helmtest && $(GO) vet ./... && $(STATICCHECK) ./... && $(GO) test -count=1 ./...

# The one command that runs every test: vet, staticcheck, then the race-enabled suite.
test: deps vet lint unit nested promtool-test

# Benchmarks: never part of `make test`; figures go to docs/benchmarks.md.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./store/memstore/
	$(GO) test -run '^$$' -bench . -benchmem ./store/denycache/
	cd bench && $(GO) test -run '^$$' -bench . -benchmem ./...

# Debit and Settle against Take, memstore and Redis (docs/benchmarks.md, "Layers above the store").
bench-debt:
	$(GO) test -run '^$$' -bench BenchmarkDebt -benchtime 200000x -count 5 ./store/memstore/
	$(GO) test -run '^$$' -bench BenchmarkDebt -benchtime 20000x -count 3 ./store/redisstore/

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

# weir under a flood on a private redis-server, with and without the deny
# cache: through redisstore (abusive keys) and weir serve over gRPC; PARTS
# picks parts (bench/flood/run.sh says which). Figures in docs/benchmarks.md.
bench-flood:
	./bench/flood/run.sh

# Sizing: decisions/s per core of weir serve over gRPC and POST /v1/check,
# from each process's CPU time (STORE=memory for memstore); the figures in
# docs/operations.md, "Sizing".
bench-sizing:
	./bench/sizing/run.sh

# Overload protection: a backend of fixed capacity offered 3× and 5× it,
# with no protection, concurrency: adaptive with priorities and a reserve,
# and an ideal critical-only queue; simulated on a virtual clock over 20
# seeds (the table in docs/benchmarks.md), then on the wall clock through
# policy.Middleware.
bench-overload:
	cd bench && $(GO) run ./overload -seeds 20
	cd bench && $(GO) run ./overload -real

# weir serve's RESP listener: redis-benchmark CL.THROTTLE against a local
# redis-server's INCR, interleaved, and CPU per decision over RESP against
# HTTP /v1/check (N, ROUNDS); the table in docs/benchmarks.md.
bench-resp:
	./bench/resp/run.sh

# weir serve on Redis under weir bench over gRPC (STORE=memory for no Redis).
bench-serve:
	./bench/serve/run.sh

# weir serve's CPU per call, the work tree against commit REV, interleaved
# (Envoy gRPC with 1 and 5 descriptors, /v1/check, /v1/auth; memory and
# Redis): the table in docs/benchmarks.md. CASES, ROUNDS, CALLS: see the script.
REV ?= HEAD
bench-serve-ab:
	./bench/serve/ab.sh $(REV)

# weir serve against envoyproxy/ratelimit, alternated round by round; the
# peer is built from PEER_SRC (a git URL or a clone) in a temporary
# directory: the "vs envoyproxy/ratelimit" table in docs/benchmarks.md.
PEER_SRC ?= https://github.com/envoyproxy/ratelimit
bench-peer:
	PEER_SRC=$(PEER_SRC) ./bench/peer/run.sh

# envoyproxy/ratelimit's own cases against weir serve and the peer, side by
# side, the peer built from PEER_SRC in a temporary directory (docs/envoy.md,
# Differences).
test-peer:
	PEER_SRC=$(PEER_SRC) ./scripts/test-peer.sh

# One hot key at 10,000/s with lease: 100 and without: Redis time per
# decision (INFO commandstats); the hot-key part of the flood figures.
bench-lease:
	./bench/lease/run.sh

# weir replay over a generated 10M-line nginx log with three rules: lines/s
# and peak memory (LINES=1000000 for a tenth); the log stays in /tmp.
bench-replay:
	./bench/replay/run.sh

# The Redis differential test, long: memstore and redisstore (standalone and
# a cluster, whose cross-slot batches refund) through SAME_STEPS random steps
# per algorithm, result for result; `make test` runs 1500 and 600.
# SAME_SEED picks another workload. Never part of `make test`.
SAME_STEPS ?= 30000
SAME_SEED ?= 99
same-long:
	WEIR_SAME_STEPS=$(SAME_STEPS) WEIR_SAME_SEED=$(SAME_SEED) $(GO) test -count=1 -timeout 60m \
	  -run 'TestSameAsMemstore|TestCluster/SameAsMemstore' ./store/redisstore/

# The LLM gateway's budgets at the full size: 100 tenants, each sending
# GATEWAY_STREAMS concurrent requests (streamed and JSON, some hanging up),
# over memstore and through two gateways sharing one Redis; `make test`
# runs 4 per tenant. docs/budgets.md records a run. Never part of `make test`.
GATEWAY_STREAMS ?= 64
test-gateway-full:
	WEIR_GATEWAY_STREAMS=$(GATEWAY_STREAMS) $(GO) test -count=1 -timeout 30m -v \
	  -run 'TestConcurrentTenants' ./examples/llm-gateway/

# Fuzzing: long runs live here, not in `make test` (which replays the seed
# corpus). Every target runs for FUZZTIME in turn; docs/operations.md records
# a run. FUZZ=FuzzCheckBody runs one (by name). scripts/fuzz.sh fails on a
# finding only: a run that Go's fuzzing coordinator ends with a bare
# "context deadline exceeded" and no input written is retried once.
FUZZTIME ?= 60s
FUZZ_TARGETS := \
	.:FuzzParseLimit .:FuzzKey ./algorithm:FuzzTake \
	./policy:FuzzParseConfig ./clientip:FuzzParseHostAddr ./policy:FuzzPathPattern \
	./internal/resp:FuzzReadCommand ./internal/server:FuzzCheckBody ./internal/server:FuzzAuthHeaders ./internal/server:FuzzAuthClientIP \
	./internal/server/envoyrls:FuzzShouldRateLimit ./internal/server/envoyrls:FuzzCheckJSON ./internal/server/envoyrls:FuzzParse \
	./internal/server/envoyrls:FuzzCodecDecode ./internal/server/envoyrls:FuzzCodecEncode ./internal/server:FuzzTopKeys \
	./internal/replay:FuzzParseLine
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) FUZZ=$(FUZZ) ./scripts/fuzz.sh '$(FUZZ_TARGETS)'

clean:
	rm -rf bin
