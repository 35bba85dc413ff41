package integration

// The broker's own connections behind the corporate proxy (issue 35): the OAuth2 token
// endpoint, on an origin only squid may reach, is reached through squid; Vault, listed in
// no_proxy, is reached directly (squid's ACL would refuse it).

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/credentials/oauth2/oauth2test"
	"github.com/capbroker/capbroker/credentials/vaulttest"
)

// relay listens on originIP and forwards each connection to target, recording its peer.
func relay(t *testing.T, target string) (string, *peers) {
	t.Helper()
	l, err := net.Listen("tcp", originIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().String(), relayFrom(l, target)
}

// relayFrom forwards each connection l accepts to target, until l is closed, passing on each
// side's end of stream; it records the peers it accepted.
func relayFrom(l net.Listener, target string) *peers {
	p := &peers{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.add(c)
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); _ = up.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	return p
}

func TestUpstreamProxyOwnClients(t *testing.T) {
	password := "squid-pw-" + randHex(8)
	squid := startSquid(t, "broker", password)
	vault := vaulttest.Start(t)
	srv := oauth2test.Start(t)
	secret := "oauth-client-secret-" + randHex(12)
	srv.AddClient(oauth2test.Client{ID: "capbroker", Auth: "client_secret_basic", Secret: secret,
		Grants: []string{"client_credentials"}, Scopes: []string{"read", "write"}})
	if _, err := vault.Client().KVv2("secret").Put(t.Context(), "broker/oauth", map[string]any{"client_secret": secret}); err != nil {
		t.Fatal(err)
	}
	// The stand-in behind a relay on originIP, the only destination squid's ACL lets through:
	// the relay's peers show whether the broker came through squid.
	origin, originPeers := relay(t, strings.TrimPrefix(srv.URL, "https://"))
	token := randHex(16)
	b := startBroker(t, brokerOpts{
		policy: oauth2Policy,
		mode:   "enforce",
		config: fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["%s/32"]
  proxy:
    no_proxy: ["127.0.0.1/32"]
    proxies:
%s
agents:
  - {id: %s, token_env: CODER1_TOKEN}
vault:
  address: %s
  auth: {method: token, token_env: BROKER_VAULT_TOKEN}
credentials:
  - name: api
    hosts: ["%s"]
    source: {vault: {mount: secret, path: broker/oauth, field: client_secret}}
    oauth2:
      token_url: https://%s/token
      grant: client_credentials
      client_id: capbroker
      client_auth: client_secret_basic
      scopes: [read, write]
`, srv.CAFile, originIP, squidEntry("corp", squid.addr, "SQUID_PW"), agentID, vault.Addr, originIP, origin),
		env: []string{"CODER1_TOKEN=" + token, "SQUID_PW=" + password, "BROKER_VAULT_TOKEN=" + vault.RootToken},
	})
	e := &oauth2Env{t: t, srv: srv, broker: b, token: token, secret: secret}
	calls := srv.Calls()
	status, body := e.curl("https://" + origin + "/api/echo")
	if status != 200 || decodeAnswer(t, body).Token != "[REDACTED]" {
		t.Fatalf("request with a minted token: %d %s", status, body)
	}
	if srv.Calls() == calls {
		t.Fatal("no token was minted")
	}
	// The token request and the API request both came through squid; the client secret was
	// read from Vault, which squid would have refused (its ACL lets through originIP only):
	// Vault, in no_proxy, was reached directly.
	originPeers.onlyThroughSquid(t)
	e.checkLogs(password)
}
