package mcp_test

import data.mcp

settings := {
	"servers": {
		"mcp.example.com": {"tools": ["echo", "search_issues"], "resources": ["test://static/"], "prompts": ["simple_prompt"], "credential": "mcp_token"},
		"open.example.com": {"tools": ["echo"]},
	},
	"arguments": {"repository": {"agent-1": ["acme/web"], "*": ["acme/docs"]}},
}

req(host, agent, msgs) := {"phase": "request", "agent": {"id": agent, "labels": {}}, "request": {"method": "POST", "scheme": "https", "host": host, "port": 443, "path": "/mcp"}, "mcp": msgs}

msg(method) := {"method": method, "tool": "", "arguments": {}, "uri": ""}

call(tool, args) := {"method": "tools/call", "tool": tool, "arguments": args, "uri": ""}

cases := {
	"initialize": {"input": req("mcp.example.com", "a", [object.union(msg("initialize"), {"client": {"name": "c", "version": "1"}, "protocol_version": "2025-06-18"})]), "allow": true},
	"list tools": {"input": req("mcp.example.com", "a", [msg("tools/list")]), "allow": true},
	"notification": {"input": req("mcp.example.com", "a", [msg("notifications/initialized")]), "allow": true},
	"no message (GET for the stream)": {"input": req("mcp.example.com", "a", []), "allow": true},
	"allowed tool": {"input": req("mcp.example.com", "a", [call("echo", {"message": "hi"})]), "allow": true},
	"tool not listed": {"input": req("mcp.example.com", "a", [call("delete_repository", {})]), "allow": false, "reason": "MCP tool delete_repository is not allowed on mcp.example.com: agents may call echo, search_issues"},
	"a batch with one refused call": {"input": req("mcp.example.com", "a", [call("echo", {}), call("delete_repository", {})]), "allow": false},
	"repository of the agent": {"input": req("mcp.example.com", "agent-1", [call("search_issues", {"repository": "acme/web"})]), "allow": true},
	"repository for every agent": {"input": req("mcp.example.com", "agent-1", [call("search_issues", {"repository": "acme/docs"})]), "allow": true},
	"repository of another agent": {"input": req("mcp.example.com", "agent-2", [call("search_issues", {"repository": "acme/web"})]), "allow": false, "reason": "MCP tool search_issues: argument repository acme/web is not allowed for agent agent-2"},
	"tool without the argument": {"input": req("mcp.example.com", "agent-2", [call("search_issues", {"query": "x"})]), "allow": true},
	"repository not a string": {"input": req("mcp.example.com", "agent-1", [call("search_issues", {"repository": ["acme/web"]})]), "allow": false},
	"resource under a prefix": {"input": req("mcp.example.com", "a", [object.union(msg("resources/read"), {"uri": "test://static/resource/1"})]), "allow": true},
	"resource elsewhere": {"input": req("mcp.example.com", "a", [object.union(msg("resources/read"), {"uri": "file:///etc/passwd"})]), "allow": false, "reason": "MCP resource file:///etc/passwd is not allowed on mcp.example.com"},
	"prompt listed": {"input": req("mcp.example.com", "a", [object.union(msg("prompts/get"), {"prompt": "simple_prompt"})]), "allow": true},
	"prompt not listed": {"input": req("mcp.example.com", "a", [object.union(msg("prompts/get"), {"prompt": "complex_prompt"})]), "allow": false},
	"unknown method": {"input": req("mcp.example.com", "a", [msg("sampling/createMessage")]), "allow": false, "reason": "MCP method sampling/createMessage is not allowed on mcp.example.com"},
	"answer to the server": {"input": req("mcp.example.com", "a", [msg("response")]), "allow": true},
	"no input.mcp": {"input": object.remove(req("mcp.example.com", "a", []), ["mcp"]), "allow": false, "reason": "the broker does not read this request's MCP messages: list mcp.example.com/mcp under protocols.mcp in the broker's config"},
	"server without a credential": {"input": req("open.example.com", "a", [call("echo", {})]), "allow": true, "credentials": []},
}

test_decisions[name] if {
	some name, c in cases
	d := mcp.decision with input as c.input with data.settings.mcp as settings
	d.allow == c.allow
	object.get(d, "credentials", []) == object.get(c, "credentials", expected_credentials(c.allow))
	object.get(c, "reason", d.reason) == d.reason
}

expected_credentials(true) := ["mcp_token"]

expected_credentials(false) := []

test_governs if {
	mcp.governs("mcp.example.com") with data.settings.mcp as settings
	not mcp.governs("evil.example.com") with data.settings.mcp as settings
}
