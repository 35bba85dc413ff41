#!/bin/sh
# The docker-compose demo's one-shot Vault job (hashicorp/vault image, against the dev server):
#   1. stores a new demo API key in KV v2 at secret/demo/api (field api_key), and in the file
#      the demo API checks keys against (the API "issued" it);
#   2. writes a policy that can read that one secret and nothing else;
#   3. creates the AppRole "capbroker" with that policy and writes its role_id and a
#      secret_id where the broker reads them (vault.auth.role_id_file, secret_id_file).
# It runs again on every `docker compose up`: a new key (the broker picks it up within its
# refresh interval) and a new secret_id (the broker reads it at its next login).
set -eu
: "${VAULT_ADDR:?set VAULT_ADDR}" "${VAULT_TOKEN:?set VAULT_TOKEN}"
APPROLE_DIR="${APPROLE_DIR:-/vault-approle}"
API_KEY_DIR="${API_KEY_DIR:-/demo-api-key}"
OWNER="${OWNER:-65532:65532}" # the user the broker and the demo API run as
umask 077
for dir in "$APPROLE_DIR" "$API_KEY_DIR"; do
	[ -d "$dir" ] || { echo "vault-seed: $dir is not a directory (mount the volume there)" >&2; exit 1; }
done

tries=0
until vault status >/dev/null 2>&1; do
	tries=$((tries + 1))
	if [ "$tries" -ge 60 ]; then
		echo "vault-seed: Vault at $VAULT_ADDR did not become ready" >&2
		exit 1
	fi
	sleep 1
done

# write_file PATH VALUE: atomically, owned by $OWNER, readable by that user only.
write_file() {
	printf '%s' "$2" >"$1.tmp"
	chown "$OWNER" "$1.tmp"
	chmod 0400 "$1.tmp"
	mv -f "$1.tmp" "$1"
}

# 1. The demo API key. It goes to Vault on standard input, never on a command line.
key="sk-demo-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
printf '%s' "$key" | vault kv put -mount=secret demo/api api_key=- >/dev/null
write_file "$API_KEY_DIR/api_key" "$key"

# 2. Least privilege: the broker's token may read this one secret. (Token lookup and renewal
#    come with Vault's default policy.)
vault policy write capbroker-demo - >/dev/null <<'HCL'
path "secret/data/demo/api" {
  capabilities = ["read"]
}
HCL

# 3. The broker's AppRole. Its tokens live an hour, are renewed by the broker, and end after
#    a day; the broker then logs in again with the secret_id, which it reads from the file.
if ! vault auth list | grep -q '^approle/'; then
	vault auth enable approle >/dev/null
fi
vault write auth/approle/role/capbroker token_policies=capbroker-demo \
	token_ttl=1h token_max_ttl=24h secret_id_ttl=0 >/dev/null
role_id="$(vault read -field=role_id auth/approle/role/capbroker/role-id)"
secret_id="$(vault write -f -field=secret_id auth/approle/role/capbroker/secret-id)"
write_file "$APPROLE_DIR/role_id" "$role_id"
write_file "$APPROLE_DIR/secret_id" "$secret_id"

echo "vault-seed: stored secret/demo/api (api_key $(printf %s "$key" | cut -c1-12)…); AppRole capbroker may read only secret/data/demo/api"
