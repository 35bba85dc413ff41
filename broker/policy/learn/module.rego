# Drafted by `broker policy learn` from an audit log: it allows exactly what the agents in
# learned.json were seen doing, and denies everything else. Review it before use: widen or
# narrow the lists in learned.json, not this module.
package broker

import rego.v1

default decision := {"allow": false, "reason": "learned policy: not seen in the learning run"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	some e in data.learned.agents[input.agent.id].connect
	e.host == input.request.host
	e.port == input.request.port
} else := {"allow": true, "credentials": sort(_credentials)} if {
	input.phase == "request"
	count(_matching) > 0
} else := {"allow": false, "reason": _reason}

# _matching are the learned rules of the agent that allow this request.
_matching contains r if {
	input.phase == "request"
	some r in data.learned.agents[input.agent.id].requests
	r.method == input.request.method
	r.scheme == input.request.scheme
	r.host == input.request.host
	r.port == input.request.port
	_path_matches(r.path, input.request.path)
	_mcp_ok(r)
	_graphql_ok(r)
}

_credentials contains c if {
	some r in _matching
	some c in r.credentials
}

# A pattern matches a path of as many segments, each equal or "*".
_path_matches(pattern, path) if {
	ps := split(pattern, "/")
	xs := split(path, "/")
	count(ps) == count(xs)
	every i, p in ps {
		p in {"*", xs[i]}
	}
}

_str(x) := x if is_string(x)

else := ""

# A rule learned with MCP calls allows only those (method and tool); one learned without
# them does not look at input.mcp.
_mcp_ok(r) if not r.mcp

_mcp_ok(r) if {
	r.mcp
	every m in object.get(input, "mcp", []) {
		{"method": _str(m.method), "tool": _str(object.get(m, "tool", ""))} in r.mcp
	}
}

# The same for GraphQL operations (type and name).
_graphql_ok(r) if not r.graphql

_graphql_ok(r) if {
	r.graphql
	every o in object.get(input, "graphql", []) {
		{"type": _str(o.type), "name": _str(object.get(o, "name", ""))} in r.graphql
	}
}

_reason := sprintf("learned policy: agent %q was not seen connecting to %s:%v", [input.agent.id, input.request.host, input.request.port]) if {
	input.phase == "connect"
}

_reason := sprintf("learned policy: agent %q was not seen sending %s %s://%s:%v%s", [
	input.agent.id, input.request.method, input.request.scheme,
	input.request.host, input.request.port, input.request.path,
]) if {
	input.phase == "request"
}
