# `make test` is the whole test suite: formatting, vet, the Rego tests and every Go test
# (unit and end-to-end) under the race detector. It installs the agent-side clients the
# end-to-end tests drive (curl, git, python3) when they are missing. At its end it says how
# many tests were skipped and why; a test skipped for want of a Vault binary fails the run
# unless CAPBROKER_ALLOW_SKIP=vault (a comma-separated list of kinds) accepts it.

GO ?= go

.PHONY: test tools fmt-check vet build bench bench-curves

test: tools fmt-check vet
	GO=$(GO) $(GO) run ./scripts/testsummary -race -count=1 ./...

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)

build:
	$(GO) build -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT)" -o bin/broker ./cmd/broker

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

tools:
	@./scripts/install-test-tools.sh

# `make bench` measures the broker against a direct connection on loopback (under 5 minutes):
# a table on stdout, the JSON summary in bench/results/latest.json. It first installs the peers
# measured beside the broker (mitmproxy, squid-openssl, smokescreen) when it can; the benchmark
# skips, with the reason, any it cannot run.
bench:
	@./scripts/install-bench-peers.sh
	$(GO) run ./bench

# `make bench-curves` measures how the broker's costs grow as a deployment grows (agents, policy
# data and rules, hosts, idle connections, credentials, concurrency; longer than `make bench`):
# bench/results/curves/*.json, and the charts under docs/benchmarks/.
bench-curves:
	$(GO) run ./bench -only curves -curves all
