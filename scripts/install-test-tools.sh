#!/usr/bin/env bash
# Installs the clients the end-to-end tests use as an agent would, if they are missing: curl,
# git, python3, node, redis-server (the budget tests' shared store), nft (nftables: transparent
# mode's rules, checked and applied in network namespaces) and the AWS CLI (Debian's
# awscli, which brings botocore: the AWS tests' S3 stand-in checks signatures with it) from the
# system's packages, chromium for the console's browser tests (integration/console_test.go),
# and the Node packages the client tests drive (openai, @anthropic-ai/sdk, undici;
# integration/testdata/node/package-lock.json) into
# integration/testdata/node/node_modules.
# nft (nftables) writes the transparent-mode test's redirect rules (integration/transparent_test.go).
# haproxy is the Service in front of three brokers in integration/fleet_test.go.
# sshd (Debian's openssh-server) is the git host of integration/ssh_test.go, serving bare
# repositories through git-shell (/usr/sbin/sshd; the test runs its own, never the system's);
# faketime runs one an hour ahead, to whom the broker's certificates have expired.
# promtool (Debian's prometheus) checks and unit-tests the shipped alerting rules (deploy/prometheus).
# squid is the corporate proxy of integration/upstream_proxy_test.go (/usr/sbin/squid, with
# /usr/lib/squid/basic_ncsa_auth); Debian's squid-openssl, since the ssl-bump test
# (integration/upstream_proxy_more_test.go) needs OpenSSL, which the plain squid package lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for tool in curl git python3 node npm aws chromium redis-server nft promtool; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
# /usr/sbin is not on every user's PATH.
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
squid=$(command -v squid || echo /usr/sbin/squid)
"$squid" -v 2>/dev/null | grep -q -- --with-openssl || missing+=(squid)
[ -x /usr/sbin/sshd ] || missing+=(sshd)
command -v faketime >/dev/null 2>&1 || missing+=(faketime)
if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import botocore' >/dev/null 2>&1; then
  missing+=(botocore)
fi
# The Postgres front door's tests (integration/postgres_test.go): Debian's server (initdb,
# postgres), psql and pgbench, and Python's psycopg2.
command -v psql >/dev/null 2>&1 && command -v pgbench >/dev/null 2>&1 || missing+=(postgresql-client)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing+=(postgresql)
if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import psycopg2' >/dev/null 2>&1; then
  missing+=(python3-psycopg2)
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "missing test tools: ${missing[*]} (install them, or run as root on Debian to install automatically)" >&2
    exit 1
  fi
  pkgs=()
  for tool in "${missing[@]}"; do
    case "$tool" in
      node) pkgs+=(nodejs) ;;
      aws | botocore) pkgs+=(awscli) ;;
      nft) pkgs+=(nftables) ;;
      squid) pkgs+=(squid-openssl) ;; # replaces plain squid: ssl-bump needs OpenSSL
      promtool) pkgs+=(prometheus) ;; # checks deploy/prometheus/capbroker-rules.yml
      sshd) pkgs+=(openssh-server) ;;
      *) pkgs+=("$tool") ;;
    esac
  done
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}"
fi
# undici 7 (the proxy agent Node's fetch needs) wants Node 20.18 or later.
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" -lt 20 ]; then
  echo "node $(node --version) is too old for the client tests (integration/clients_test.go): install Node 20 or later" >&2
fi
# The Node packages, exactly as locked; again only when the lock changed.
node_dir=integration/testdata/node
stamp="$node_dir/node_modules/.installed-package-lock.json"
if ! cmp -s "$node_dir/package-lock.json" "$stamp"; then
  npm ci --prefix "$node_dir" --no-audit --no-fund --ignore-scripts --loglevel=error
  cp "$node_dir/package-lock.json" "$stamp"
fi
# The OpenTelemetry Collector of integration/otel_test.go is built from its Go modules
# (integration/testdata/otelcol, a module of its own) by the tests, once, into the user cache;
# downloading its modules here means a first test run needs only the build (about a minute).
(cd integration/testdata/otelcol && GOFLAGS=-mod=mod GOWORK=off go mod download)
# h2spec (integration/h2spec_test.go, the agent-facing HTTP/2 server's conformance) is built
# the same way from its Go module (integration/testdata/h2spec).
(cd integration/testdata/h2spec && GOFLAGS=-mod=mod GOWORK=off go mod download)
