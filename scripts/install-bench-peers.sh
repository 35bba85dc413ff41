#!/usr/bin/env bash
# Installs the proxies `make bench` measures beside the broker, if they are missing:
# mitmproxy and squid-openssl with apt (as root on Debian), smokescreen with `go install`.
# It never fails: a peer it cannot install is reported here, and skipped by the benchmark.
set -uo pipefail

SMOKESCREEN=github.com/stripe/smokescreen@v0.1.0

say() { echo "install-bench-peers: $*" >&2; }

apt_missing=()
command -v mitmdump >/dev/null 2>&1 || apt_missing+=(mitmproxy)
squid=$(command -v squid || echo /usr/sbin/squid)
# Debian's plain squid package has no OpenSSL, so no ssl-bump; squid-openssl replaces it.
"$squid" -v 2>/dev/null | grep -q -- --with-openssl || apt_missing+=(squid-openssl)

if [ ${#apt_missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    say "not installed: ${apt_missing[*]} (needs root and apt-get); the benchmark skips them"
  else
    apt_install() {
      DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq \
        -o Acquire::http::Timeout=20 "${apt_missing[@]}" >/dev/null
    }
    # The package lists may be missing or stale: update once, and only then.
    if ! apt_install 2>/dev/null; then
      timeout 300 apt-get update -qq -o Acquire::http::Timeout=20 >/dev/null 2>&1
      apt_install || say "apt-get install ${apt_missing[*]} failed; the benchmark skips them"
    fi
  fi
fi

# go install puts smokescreen in GOBIN or GOPATH/bin, where the benchmark also looks.
gobin=$(go env GOBIN 2>/dev/null)
[ -n "$gobin" ] || gobin="$(go env GOPATH 2>/dev/null | cut -d: -f1)/bin"
if ! command -v smokescreen >/dev/null 2>&1 && [ ! -x "$gobin/smokescreen" ]; then
  if ! timeout 600 go install "$SMOKESCREEN" 2>/dev/null; then
    say "go install $SMOKESCREEN failed; the benchmark skips smokescreen"
  fi
fi
exit 0
