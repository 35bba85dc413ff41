package integration

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/capbroker/capbroker/credentials/oauth2/oauth2test"
)

// The attacks of this file are variants of the classes of issue 33's findings, run against the
// built broker as a hostile agent (and upstream) after each class was fixed at its root: other
// JSON member spellings, other content types, other rotation and reload paths. Each asserts
// what the agent got, what the upstream saw and what the audit says.

// TestRedteamStrictJSONCaseMappings: members that a server folds together by mapping case
// rune by rune, beyond Unicode's simple folding orbits, are refused like "name"/"Name": the
// dotless "ı" (U+0131), which .NET's OrdinalIgnoreCase (System.Text.Json's case-insensitive
// names) upper-cases to "I", and the dotted "İ" (U+0130), which a Turkish-locale toLowerCase
// (Jackson's case-insensitive properties) lower-cases to "i". Members no decoder takes for one
// another (ß and ss, a full-width letter, a zero-width joiner inside) are data and pass.
func TestRedteamStrictJSONCaseMappings(t *testing.T) {
	const readsBody = `package broker

default decision := {"allow": false, "reason": "purge is not allowed"}

decision := {"allow": true, "intercept": true} if input.phase == "connect"

decision := {"allow": true} if {
	input.phase == "request"
	input.request.body.action != "purge"
}
`
	e := newEnv(t, envOpts{policy: readsBody})
	c := e.broker.client(t, agentID, e.token)
	u := e.url("/jobs")
	for _, a := range []ambiguousAttack{
		{"dotless i, allowed first", "{\"action\":\"archive\",\"act\u0131on\":\"purge\"}", []string{`"action"`, "act\u0131on"}},
		{"dotless i, allowed last", "{\"act\u0131on\":\"purge\",\"action\":\"archive\"}", []string{`"action"`}},
		{"dotless i escaped", `{"action":"archive","act\u0131on":"purge"}`, []string{`"action"`}},
		{"dotted capital I", `{"action":"archive","act\u0130on":"purge"}`, []string{`"action"`}},
		{"dotless I upper", `{"action":"archive","ACT\u0131ON":"purge"}`, []string{`"action"`}},
		{"dotted capital I deep in an array", `{"action":"archive","targets":[{"id":"one","\u0130d":"all"}]}`, []string{`"id"`}},
	} {
		t.Run(a.name, func(t *testing.T) {
			before := len(e.received())
			status, body, id := postJSON(t, c, u, a.body)
			checkAmbiguousRefusal(t, e, a, false, status, body, id, before)
			if strings.Contains(body, "purge") || strings.Contains(body, "archive") {
				t.Errorf("the refusal quotes a value: %s", body)
			}
		})
	}
	for name, body := range map[string]string{
		"sharp s and ss":    "{\"action\":\"archive\",\"opts\":{\"stra\u00dfe\":1,\"strasse\":2}}",
		"full-width letter": "{\"action\":\"archive\",\"\uff41ction\":\"purge\"}",
		"zero-width joiner": "{\"action\":\"archive\",\"ac\u200dtion\":\"purge\"}",
	} {
		t.Run(name, func(t *testing.T) {
			before := len(e.received())
			status, resp, _ := postJSON(t, c, u, body)
			if status != http.StatusOK {
				t.Fatalf("%d %s, want 200: no decoder takes these members for one another", status, resp)
			}
			if got := e.received(); len(got) != before+1 {
				t.Errorf("the upstream saw %d requests, want 1", len(got)-before)
			}
		})
	}

	// The same on a JSON-RPC endpoint, where the refusal is a JSON-RPC error.
	r := newEnv(t, envOpts{
		policy: `package broker

default decision := {"allow": false, "reason": "method not allowed"}

decision := {"allow": true, "intercept": true} if input.phase == "connect"

decision := {"allow": true} if {
	input.phase == "request"
	every m in input.jsonrpc { startswith(m.method, "eth_get") }
}
`,
		extraConfig: "protocols:\n  jsonrpc: [{hosts: [127.0.0.1], path: /rpc}]\n",
	})
	rc := r.broker.client(t, agentID, r.token)
	for _, a := range []ambiguousAttack{
		{"id and dotless id", "{\"jsonrpc\":\"2.0\",\"id\":1,\"\u0131d\":2,\"method\":\"eth_getBalance\"}", []string{`"id"`}},
		{"dotted Id alone", `{"jsonrpc":"2.0","\u0130d":1,"method":"eth_getBalance"}`, []string{`"id"`}},
		{"in params, in a batch", `[{"jsonrpc":"2.0","id":1,"method":"eth_getBalance","params":{"address":"a"}},{"jsonrpc":"2.0","id":2,"method":"eth_getCode","params":{"addre\u017f\u017f":"a","ADDRESS":"b"}}]`, []string{`"ADDRESS"`}},
	} {
		t.Run("rpc "+a.name, func(t *testing.T) {
			before := len(r.received())
			status, body, id := postJSON(t, rc, r.url("/rpc"), a.body)
			checkAmbiguousRefusal(t, r, a, true, status, body, id, before)
		})
	}
}

// TestRedteamJSONMediaTypes: a body labelled with a media type that servers parse as JSON
// (ASP.NET's text/json, Rails' text/x-json and application/jsonrequest, application/x-json) is
// the policy's input.request.body like application/json: a policy that refuses "purge" refuses
// it under every label, and ambiguous members are refused under every label. A JSON body sent
// in UTF-16 (which Python's json.loads reads) is not valid JSON to the broker: refused.
func TestRedteamJSONMediaTypes(t *testing.T) {
	e := newEnv(t, envOpts{policy: `package broker

default decision := {"allow": true, "intercept": true}

decision := {"allow": false, "reason": "purge is not allowed"} if {
	input.phase == "request"
	input.request.body.action == "purge"
}
`})
	c := e.broker.client(t, agentID, e.token)
	u := e.url("/jobs")
	for _, ct := range []string{"application/json", "text/json", "Text/JSON; charset=utf-8", "text/x-json", "application/x-json", "application/jsonrequest", "application/vnd.api+json"} {
		t.Run(ct, func(t *testing.T) {
			before := len(e.received())
			status, body, id := postJSON(t, c, u, `{"action":"purge"}`, "Content-Type", ct)
			if status != http.StatusForbidden || !strings.Contains(body, "purge is not allowed") {
				t.Errorf("purge as %s: %d %s, want 403 purge is not allowed", ct, status, body)
			}
			if len(e.received()) != before {
				t.Errorf("purge as %s reached the upstream", ct)
			}
			if ev := e.broker.waitAudit(t, id); ev["decision"] != "deny" {
				t.Errorf("purge as %s: audit decision %v", ct, ev["decision"])
			}
			a := ambiguousAttack{ct + " duplicate", `{"action":"archive","action":"purge"}`, []string{`"action" appears twice`}}
			status, body, id = postJSON(t, c, u, a.body, "Content-Type", ct)
			checkAmbiguousRefusal(t, e, a, false, status, body, id, before)
			if status, body, _ := postJSON(t, c, u, `{"action":"archive"}`, "Content-Type", ct); status != http.StatusOK || len(e.received()) != before+1 {
				t.Errorf("archive as %s: %d %s", ct, status, body)
			}
		})
	}
	t.Run("byte order mark", func(t *testing.T) {
		// .NET's and Python's utf-8-sig readers skip a BOM; the broker does not read past it.
		before := len(e.received())
		status, body, _ := postJSON(t, c, u, "\ufeff{\"action\":\"archive\",\"action\":\"purge\"}")
		if status != http.StatusBadRequest || len(e.received()) != before {
			t.Errorf("BOM-prefixed JSON: %d %s, want 400 before the upstream", status, body)
		}
	})
	t.Run("UTF-16", func(t *testing.T) {
		before := len(e.received())
		var utf16 []byte
		for _, r := range `{"action":"purge"}` {
			utf16 = append(utf16, byte(r), 0)
		}
		status, body, _ := postJSON(t, c, u, string(utf16), "Content-Type", "application/json; charset=utf-16le")
		if status != http.StatusBadRequest || !strings.Contains(body, "not valid JSON") || len(e.received()) != before {
			t.Errorf("UTF-16 JSON: %d %s, want 400 not valid JSON before the upstream", status, body)
		}
	})
}

// streamStore is an upstream that answers /watch with a stream, and /ws with a WebSocket,
// left open, and writes on them the credential /store is later sent: responses that began
// before the secret existed.
type streamStore struct {
	once  sync.Once
	kept  string
	ready chan struct{} // closed once kept is set
}

func (s *streamStore) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/store":
		auth := r.Header.Get("Authorization")
		if i := strings.IndexByte(auth, ' '); i >= 0 {
			auth = auth[i+1:]
		}
		s.once.Do(func() { s.kept = auth; close(s.ready) })
		fmt.Fprintln(w, "kept")
	case "/watch":
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintln(w, "open")
		w.(http.Flusher).Flush()
		select {
		case <-s.ready:
			for name, f := range knownForms(s.kept) {
				fmt.Fprintf(w, "%s=%s\n", name, f)
			}
		case <-r.Context().Done():
		}
	case "/ws":
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
			wsAccept(r.Header.Get("Sec-WebSocket-Key")))
		rw.Write(wsFrame(true, 0x1, []byte("open"), false))
		rw.Flush()
		<-s.ready
		half := len(s.kept) / 2 // split across two fragments, too
		rw.Write(wsFrame(false, 0x1, []byte("token: "+s.kept[:half]), false))
		rw.Write(wsFrame(true, 0x0, []byte(s.kept[half:]+"\n"), false))
		rw.Flush()
		_, _, _ = readWSFrame(rw.Reader) // until the agent closes
	default:
		http.NotFound(w, r)
	}
}

// TestRedteamStreamOpenedBeforeMint: the agent opens a stream from an upstream before the
// broker has minted any token for it, then has a request granted the OAuth2 credential sent to
// the same upstream, which writes the token on the open stream. The token was minted after the
// stream's response began; it must reach the agent scrubbed all the same.
func TestRedteamStreamOpenedBeforeMint(t *testing.T) {
	pki := newUpstreamPKI(t)
	s := &streamStore{ready: make(chan struct{})}
	up := pki.serve(t, s, false, nil)
	e := &oauth2Env{t: t, srv: oauth2test.Start(t), token: randHex(16), secret: "oauth-client-secret-" + randHex(12)}
	e.srv.AddClient(oauth2test.Client{ID: "capbroker", Auth: "client_secret_basic", Secret: e.secret,
		Grants: []string{"client_credentials"}, Scopes: []string{"read"}})
	e.broker = startBroker(t, brokerOpts{
		policy: `package broker

default decision := {"allow": false, "reason": "not allowed by the test policy"}

decision := {"allow": true, "intercept": true} if input.phase == "connect"

decision := {"allow": true} if {
	input.phase == "request"
	input.request.path in {"/watch", "/ws"}
}

decision := {"allow": true, "credentials": ["api"]} if {
	input.phase == "request"
	input.request.path == "/store"
}
`,
		mode: "enforce",
		config: fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["127.0.0.1/32"]
agents:
  - {id: %s, token_env: CODER1_TOKEN}
credentials:
  - name: api
    hosts: ["127.0.0.1"]
    source: {env: OAUTH_CLIENT_SECRET}
    oauth2:
      token_url: %s
      client_id: capbroker
      scopes: [read]
`, bothCAs(t, pki.File, e.srv.CAFile), agentID, e.srv.TokenURL),
		env: []string{"CODER1_TOKEN=" + e.token, "OAUTH_CLIENT_SECRET=" + e.secret},
	})
	c := e.broker.client(t, agentID, e.token)

	resp, err := c.Get(up.URL + "/watch")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "open\n" {
		t.Fatalf("watch: %q %v", line, err)
	}
	ws := (&env{broker: e.broker, token: e.token}).dialTunnel(t, up.Listener.Addr().String())
	defer ws.Close()
	fmt.Fprintf(ws, "GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", up.Listener.Addr())
	wr := bufio.NewReader(ws)
	if resp, err := http.ReadResponse(wr, nil); err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	if _, first, err := readWSFrame(wr); err != nil || string(first) != "open" {
		t.Fatalf("ws: %q %v", first, err)
	}
	if status, body, id := agentGet(t, c, up.URL+"/store"); status != 200 {
		t.Fatalf("store: %d %s", status, body)
	} else {
		auditOf(t, e.broker, id, 200, "api")
	}
	rest, _ := io.ReadAll(br)
	issued := e.srv.Issued()
	if len(issued) != 1 {
		t.Fatalf("%d tokens issued, want 1", len(issued))
	}
	assertScrubbed(t, "the stream opened before the mint", string(rest), issued[0])
	var message []byte
	for fin := false; !fin; {
		op, payload, err := readWSFrame(wr)
		if err != nil {
			t.Fatal(err)
		}
		fin = op&0x80 != 0
		message = append(message, payload...)
	}
	if got := string(message); got != "token: [REDACTED]\n" {
		t.Errorf("the WebSocket opened before the mint sent the agent %q", got)
	}
	auditOf(t, e.broker, resp.Header.Get("X-Broker-Request-Id"), 200)
	ws.Close()
	e.checkLogs()
}
