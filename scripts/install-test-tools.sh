#!/usr/bin/env bash
# Installs the clients the end-to-end tests use as an agent would, if they are missing.
set -euo pipefail
missing=()
for tool in curl git python3; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "missing test tools: ${missing[*]} (install them, or run as root on Debian to install automatically)" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
