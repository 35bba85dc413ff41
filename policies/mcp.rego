# MCP servers, by what each message asks for (input.mcp; the broker fills it for the
# endpoints listed under protocols.mcp in its config, docs/mcp.md).
#
# data.settings.mcp (policies/data.yaml) lists, per server host, the tools agents may call,
# the resource URI prefixes they may read, the prompts they may get and the credential the
# server's requests carry (optional). Listing, initialising, pinging, notifications and the
# agent's answers to the server's own requests are always allowed. An argument named in
# settings.mcp.arguments (such as repository) must hold a value listed for the agent (by its
# id, or under "*" for every agent), whichever tool it is passed to.
package mcp

import data.settings

# governs(host): the host is one of the MCP servers in settings.mcp.servers.
governs(host) if settings.mcp.servers[host]

server := settings.mcp.servers[input.request.host]

always := {"initialize", "ping", "tools/list", "resources/list", "resources/templates/list", "prompts/list", "completion/complete", "logging/setLevel", "response"}

# refusal(m): why message m is not allowed, if it is not.
refusal(m) := sprintf("MCP method %s is not allowed on %s", [m.method, input.request.host]) if {
	not m.method in always
	not startswith(m.method, "notifications/")
	not m.method in {"tools/call", "resources/read", "prompts/get"}
} else := sprintf("MCP tool %s is not allowed on %s: agents may call %s", [m.tool, input.request.host, concat(", ", object.get(server, "tools", []))]) if {
	m.method == "tools/call"
	not m.tool in object.get(server, "tools", [])
} else := sprintf("MCP tool %s: argument %s %v is not allowed for agent %s", [m.tool, name, v, input.agent.id]) if {
	m.method in {"tools/call", "prompts/get"}
	some name, v in m.arguments
	settings.mcp.arguments[name]
	not argument_ok(name, v)
} else := sprintf("MCP resource %s is not allowed on %s", [m.uri, input.request.host]) if {
	m.method == "resources/read"
	not readable(m.uri)
} else := sprintf("MCP prompt %s is not allowed on %s", [m.prompt, input.request.host]) if {
	m.method == "prompts/get"
	not m.prompt in object.get(server, "prompts", [])
}

# argument_ok(name, v): agent may pass v as argument name.
argument_ok(name, v) if v in object.get(settings.mcp.arguments[name], input.agent.id, [])

argument_ok(name, v) if v in object.get(settings.mcp.arguments[name], "*", [])

readable(uri) if {
	some prefix in object.get(server, "resources", [])
	startswith(uri, prefix)
}

refusals := [r | some m in input.mcp; r := refusal(m)]

grant := {"allow": true, "credentials": [server.credential], "reason": "MCP"} if {
	server.credential
} else := {"allow": true, "reason": "MCP"}

decision := {"allow": false, "reason": sprintf("the broker does not read this request's MCP messages: list %s%s under protocols.mcp in the broker's config", [input.request.host, input.request.path])} if {
	not input.mcp
} else := {"allow": false, "reason": refusals[0]} if {
	count(refusals) > 0
} else := grant
