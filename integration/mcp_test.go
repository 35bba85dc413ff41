package integration

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// mcpData lets agents call echo (with message "hello" only) and the long-running operation on
// the test's MCP server, with the canary credential; get-sum is not listed.
const mcpData = `settings:
  mcp:
    servers:
      127.0.0.1:
        tools: [echo, trigger-long-running-operation]
        credential: canary
    arguments:
      message:
        "*": [hello]
`

const mcpPolicy = `package broker

import data.mcp

decision := {"allow": true, "intercept": true} if input.phase == "connect"

decision := mcp.decision if input.phase == "request"
`

// startMCPEverything runs @modelcontextprotocol/server-everything over streamable HTTP on
// 127.0.0.1 and returns its address.
func startMCPEverything(t *testing.T, modules string) string {
	t.Helper()
	for _, pkg := range []string{"@modelcontextprotocol/sdk", "@modelcontextprotocol/server-everything"} {
		if _, err := os.Stat(filepath.Join(modules, pkg, "package.json")); err != nil {
			requireTool(t, "the Node package "+pkg+" is missing from "+modules)
		}
	}
	dir := filepath.Dir(modules)
	cmd := exec.Command("node", "--import", "./mcp-loopback.mjs",
		filepath.Join(modules, "@modelcontextprotocol/server-everything/dist/index.js"), "streamableHttp")
	cmd.Dir = dir
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	listening := regexp.MustCompile(`^LISTENING (\d+)$`)
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if m := listening.FindStringSubmatch(sc.Text()); m != nil {
			go func() { // keep draining what the server logs
				for sc.Scan() {
				}
			}()
			return "127.0.0.1:" + m[1]
		}
	}
	t.Fatalf("the MCP server exited before listening: %v", sc.Err())
	return ""
}

// TestMCPThroughBroker drives the MCP TypeScript SDK's client through the built broker to
// server-everything behind a TLS front: listing tools, an allowed call, calls the policy
// refuses (a tool not listed, an argument value not allowed) with the reason in the SDK's
// error (a JSON-RPC error response, not a transport error), and a call whose response streams the server's progress notifications over SSE.
func TestMCPThroughBroker(t *testing.T) {
	modules := nodeModules(t)
	addr := startMCPEverything(t, modules)
	front := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: addr})
	front.FlushInterval = -1
	handler := http.StripPrefix("/api/custom", front)
	e := newEnv(t, envOpts{
		policy:      mcpPolicy,
		policyFiles: map[string]string{"mcp.rego": readShipped(t, "mcp.rego"), "data.yaml": mcpData},
		handler:     handler,
		extraConfig: "protocols:\n  mcp: [{hosts: [127.0.0.1], path: /api/custom/mcp}]\n",
	})
	mark := e.broker.auditLog.mark()
	done := make(chan string, 1)
	go func() {
		done <- e.run(filepath.Dir(modules), e.agentEnv(), "node", "mcp-client.mjs", e.url("/api/custom/mcp"))
	}()
	var got string
	select {
	case got = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the MCP client did not finish")
	}
	lines := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(got), "\n") {
		step, rest, _ := strings.Cut(l, " ")
		lines[step] = rest
	}
	checks := []struct{ step, want string }{
		{"tools", `"echo"`},
		{"tools", `"get-sum"`},
		{"echo", `Echo: hello`},
		{"echo-secret-error", `MCP tool echo: argument message secret-plan is not allowed for agent ` + agentID},
		{"sum-error", `MCP tool get-sum is not allowed on 127.0.0.1: agents may call echo, trigger-long-running-operation`},
		{"sum-error", `"-32000 MCP error -32000: capbroker denied: `},
		{"long", `Long running operation completed`},
		{"progress", `[1,2,3]`},
	}
	for _, c := range checks {
		if !strings.Contains(lines[c.step], c.want) {
			t.Errorf("%s: %q lacks %q\nclient output:\n%s", c.step, lines[c.step], c.want, got)
		}
	}
	e.broker.auditLog.waitFrom(t, mark, `"mcp":{"method":"tools/call","tool":"get-sum"}`)
	e.broker.auditLog.waitFrom(t, mark, `"mcp":{"method":"tools/call","tool":"echo"}`)
	e.broker.auditLog.waitFrom(t, mark, `"mcp":{"method":"initialize","tool":""}`)
}

// TestMCPSessionNeverCrossesAgents: a session server-everything issued to coder-1 through
// the broker serves coder-1, is refused to coder-2 (a JSON-RPC error naming why), and a
// made-up one is unknown (404).
func TestMCPSessionNeverCrossesAgents(t *testing.T) {
	modules := nodeModules(t)
	addr := startMCPEverything(t, modules)
	pki := newUpstreamPKI(t)
	up := pki.serve(t, httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: addr}), false, nil)
	tok1, tok2 := randHex(16), randHex(16)
	b := startBroker(t, brokerOpts{
		policy: mcpPolicy,
		files:  map[string]string{"mcp.rego": readShipped(t, "mcp.rego"), "data.yaml": mcpData},
		config: canaryConfig(pki.File, []string{"coder-1", "coder-2"}, "protocols:\n  mcp: [{hosts: [127.0.0.1], path: /mcp}]\n"),
		env:    []string{tokenEnv("coder-1") + "=" + tok1, tokenEnv("coder-2") + "=" + tok2, "CANARY_SECRET=sk-canary-" + randHex(8)},
	})
	var last string // the body of the last response
	post := func(c *http.Client, body, session string) *http.Response {
		t.Helper()
		r, _ := http.NewRequest(http.MethodPost, up.URL+"/mcp", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Accept", "application/json, text/event-stream")
		r.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		if session != "" {
			r.Header.Set("Mcp-Session-Id", session)
		}
		resp, err := c.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = string(b)
		return resp
	}
	c1, c2 := b.client(t, "coder-1", tok1), b.client(t, "coder-2", tok2)
	resp := post(c1, `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`, "")
	session := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || session == "" {
		t.Fatalf("initialize: %d, session %q", resp.StatusCode, session)
	}
	list := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	if resp := post(c1, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, session); resp.StatusCode != 202 {
		t.Errorf("coder-1 initialized: %d", resp.StatusCode)
	}
	if resp := post(c1, list, session); resp.StatusCode != 200 {
		t.Errorf("coder-1 in its own session: %d", resp.StatusCode)
	}
	if resp := post(c2, list, session); resp.StatusCode != 200 || !strings.Contains(last, `"id":1,"error":{"code":-32000,"message":"capbroker denied: this MCP session was issued to another agent`) {
		t.Errorf("coder-2 in coder-1's session: %d %s", resp.StatusCode, last)
	}
	if resp := post(c2, list, "made-up-"+randHex(8)); resp.StatusCode != 404 {
		t.Errorf("a session never issued: %d", resp.StatusCode)
	}
}
