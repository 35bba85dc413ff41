#!/bin/sh
# The docker-compose demo's ca-init job: creates the broker's CA on first start and publishes
# its certificate (never the key) to the volume the agent mounts read-only. With ADMIN_DIR set
# (the transparent variant), it also creates the admin API's token there on first start: 256
# random bits in a file only the broker's user reads, on a volume the agent never mounts.
set -eu
CA_DIR="${CA_DIR:-/ca}"
PUBLIC_DIR="${PUBLIC_DIR:-/ca-public}"
if [ -e "$CA_DIR/ca.crt" ] && [ -e "$CA_DIR/ca.key" ]; then
	echo "ca-init: keeping the broker CA in $CA_DIR"
else
	broker ca init --out "$CA_DIR" # refuses, and says why, if only half a CA is there
	echo "ca-init: created the broker CA in $CA_DIR"
fi
cp "$CA_DIR/ca.crt" "$PUBLIC_DIR/ca.crt.tmp"
chmod 0644 "$PUBLIC_DIR/ca.crt.tmp"
mv -f "$PUBLIC_DIR/ca.crt.tmp" "$PUBLIC_DIR/ca.crt"
if [ -n "${ADMIN_DIR:-}" ]; then
	if [ -s "$ADMIN_DIR/token" ]; then
		echo "ca-init: keeping the admin token in $ADMIN_DIR"
	else
		umask 077
		head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$ADMIN_DIR/token.tmp"
		mv -f "$ADMIN_DIR/token.tmp" "$ADMIN_DIR/token"
		echo "ca-init: created the admin token in $ADMIN_DIR"
	fi
fi
