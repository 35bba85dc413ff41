#!/bin/sh
# The docker-compose demo, seen from the agent. Run it inside the agent container:
#
#   docker compose exec agent sh /opt/demo/session.sh
#
# It shows that the agent's calls go out only through the broker, with the key added on the
# way, and that the agent holds no key. It exits 1 if anything is not as described.
# The defaults fit docker-compose.yml; integration/netns_test.go runs the same script in a
# network namespace with these variables set:
#   DEMO_API       the demo API, reached through the broker (https://api.demo.test:8443)
#   DEMO_DIRECT    the demo API's own address, to try without the broker (https://172.31.250.10:8443)
#   DEMO_DENIED    a host the policy does not allow (example.com)
#   DEMO_SCAN      folders searched for the key (/)
#   DEMO_SCAN_PROC 1: also search the environment of every process the agent can see (1)
set -u
API="${DEMO_API:-https://api.demo.test:8443}"
DIRECT="${DEMO_DIRECT:-https://172.31.250.10:8443}"
DENIED="${DEMO_DENIED:-example.com}"
SCAN="${DEMO_SCAN:-/}"
SCAN_PROC="${DEMO_SCAN_PROC:-1}"
# The demo key's prefix, assembled so that this file does not contain it.
prefix="sk""-demo-"
failures=0

say() { printf '\n# %s\n' "$*"; }
cmd() { printf '$ %s\n' "$*"; }
ok() { printf '=> as expected: %s\n' "$*"; }
bad() {
	printf '=> NOT AS EXPECTED: %s\n' "$*"
	failures=$((failures + 1))
}
out="$(mktemp)"
trap 'rm -f "$out"' EXIT

say "1. The agent calls the API through the broker (HTTPS_PROXY). It sends no key; the broker adds it."
cmd "curl -sS $API/v1/whoami"
code="$(curl -sS -o "$out" -w '%{http_code}' "$API/v1/whoami")"
cat "$out"
if [ "$code" = 200 ] && grep -q '"authenticated": true' "$out" && grep -q 'Bearer \[REDACTED\]' "$out"; then
	ok "200; the API received its key; the agent sees only [REDACTED] where the API echoed it"
else
	bad "HTTP $code"
fi
cmd "python3 -c 'urllib.request.urlopen(\"$API/v1/whoami\")'"
if python3 -c 'import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/v1/whoami", timeout=20) as r:
    body = json.load(r)
print(r.status, "authenticated:", body["authenticated"], "Authorization:", body["received_headers"].get("Authorization"))
sys.exit(0 if body["authenticated"] else 1)' "$API"; then
	ok "Python's standard library uses the broker the same way"
else
	bad "python3 urllib through the broker"
fi

say "2. The agent tries to reach the API directly, without the broker."
for url in "$API/v1/whoami" "$DIRECT/v1/whoami"; do
	cmd "curl --noproxy '*' -sS --max-time 5 $url"
	if curl --noproxy '*' -sS --max-time 5 -o /dev/null "$url" 2>"$out"; then
		bad "the API answered a direct call"
	else
		cat "$out"
		ok "the direct call fails: the agent has no resolver and no route but to the broker"
	fi
done

say "3. The policy denies what it does not allow, and says why."
cmd "curl -sS -X DELETE $API/v1/whoami"
code="$(curl -sS -o "$out" -w '%{http_code}' -X DELETE "$API/v1/whoami")"
cat "$out"
if [ "$code" = 403 ] && grep -q '"reason"' "$out"; then ok "403 with the policy's reason"; else bad "HTTP $code"; fi
cmd "curl -sS http://$DENIED/"
code="$(curl -sS -o "$out" -w '%{http_code}' "http://$DENIED/")"
cat "$out"
if [ "$code" = 403 ] && grep -q '"reason"' "$out"; then ok "403 with the policy's reason"; else bad "HTTP $code"; fi
cmd "curl -sS https://$DENIED/"
if curl -sS -o /dev/null "https://$DENIED/" 2>"$out"; then
	bad "https://$DENIED/ was reached"
else
	cat "$out"
	if grep -q 403 "$out"; then ok "the broker refused the CONNECT with 403"; else bad "not a 403 from the broker"; fi
fi

say "4. The key is nowhere in the agent: not in its environment, not in its files."
cmd "env | sort"
env | sort
cmd "grep -rlF '${prefix}' $SCAN (without /proc, /sys, /dev)"
# shellcheck disable=SC2086 # SCAN is a list of folders
found="$(grep -rlF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "$prefix" $SCAN 2>/dev/null)"
if [ "$SCAN_PROC" = 1 ]; then
	for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do
		if tr '\0' '\n' <"$f" 2>/dev/null | grep -qF "$prefix"; then found="$found $f"; fi
	done
fi
if [ -z "$found" ] && ! env | grep -qF "$prefix"; then
	ok "no file and no environment holds the key"
else
	bad "the key was found in: $found"
fi

if [ "$failures" -ne 0 ]; then
	printf '\n%d step(s) not as expected\n' "$failures"
	exit 1
fi
printf '\nAll as expected: the broker is the agent'\''s only way out, and the agent holds no key.\n'
