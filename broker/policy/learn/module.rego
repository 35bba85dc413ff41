# Drafted by `broker policy learn` from an audit log: it allows exactly what the agents in
# learned.json were seen doing, and denies everything else: on an endpoint whose MCP calls,
# GraphQL operations or JSON-RPC methods the broker reads, only those seen (GraphQL by
# operation type and top-level field, never by name). Review it before use: widen or
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

# _path_rules are the learned rules of the agent for this request's method, scheme, host, port
# and path; _matching are those of them whose learned protocol operations allow it.
_path_rules contains r if {
	input.phase == "request"
	some r in data.learned.agents[input.agent.id].requests
	r.method == input.request.method
	r.scheme == input.request.scheme
	r.host == input.request.host
	r.port == input.request.port
	_path_matches(r.path, input.request.path)
}

_matching contains r if {
	some r in _path_rules
	count(_unread(r)) == 0
	count(_unseen(r)) == 0
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

# _unread(r): the protocols rule r was learned reading (input.mcp, input.graphql,
# input.jsonrpc) that this input lacks: the broker no longer reads them on this endpoint, and
# what the request asks is unknown.
_unread(r) := {p | some p in object.get(r, "protocols", []); not input[p]}

# _unseen(r): what this request asks of a protocol that rule r was not seen asking. A rule
# learned without any (a recording that did not carry the protocol's meaning) allows none.
_unseen(r) := ({sprintf("MCP %s %s", [_get(m, "method"), _mcp_name(m)]) |
	some m in object.get(input, "mcp", [])
	not _mcp_call(m) in object.get(r, "mcp", [])
} | {sprintf("GraphQL %s %s", [_get(o, "type"), f]) |
	some o in object.get(input, "graphql", [])
	some f in _graphql_runs(o)
	not f in {_graphql_name(x) | some x in object.get(r, "graphql", []); x.type == _get(o, "type")}
}) | {sprintf("JSON-RPC %s", [_get(m, "method")]) |
	some m in object.get(input, "jsonrpc", [])
	not _get(m, "method") in object.get(r, "jsonrpc", [])
}

# _get(m, k): member k of m if it is a string, else "" (never undefined: an item missing a
# member is compared as "", not skipped).
_get(m, k) := _str(object.get(m, k, ""))

_mcp_call(m) := {"method": _get(m, "method"), "tool": _get(m, "tool"), "uri": _get(m, "uri"), "prompt": _get(m, "prompt")}

_mcp_name(m) := concat(" ", [x | some x in [_get(m, "tool"), _get(m, "uri"), _get(m, "prompt")]; x != ""])

# What a GraphQL operation runs: each top-level field, or a persisted query's hash. Its name
# does not count.
_graphql_runs(o) := {sprintf("#%s", [_get(o, "hash")])} if {
	_get(o, "type") == "persisted"
} else := {_str(f) | some f in object.get(o, "fields", [])} if {
	count(object.get(o, "fields", [])) > 0
} else := {""}

_graphql_name(x) := sprintf("#%s", [x.hash]) if {
	x.type == "persisted"
} else := x.field

_reason := sprintf("learned policy: agent %q was not seen connecting to %s:%v", [input.agent.id, input.request.host, input.request.port]) if {
	input.phase == "connect"
}

_reason := sprintf("learned policy: the broker does not read the %s of %s%s, which the draft was learned from: list it under protocols.%s in the broker's config", [
	concat(", ", sort(_unread_all)), input.request.host, input.request.path, concat(", protocols.", sort(_unread_all)),
]) if {
	input.phase == "request"
	count(_path_rules) > 0
	count(_unread_all) > 0
}

_reason := sprintf("learned policy: agent %q was not seen sending %s on %s %s://%s:%v%s", [
	input.agent.id, concat(", ", sort(_unseen_all)), input.request.method, input.request.scheme,
	input.request.host, input.request.port, input.request.path,
]) if {
	input.phase == "request"
	count(_path_rules) > 0
	count(_unread_all) == 0
}

_reason := sprintf("learned policy: agent %q was not seen sending %s %s://%s:%v%s", [
	input.agent.id, input.request.method, input.request.scheme,
	input.request.host, input.request.port, input.request.path,
]) if {
	input.phase == "request"
	count(_path_rules) == 0
}

_unread_all := {p | some r in _path_rules; some p in _unread(r)}

_unseen_all := {u | some r in _path_rules; some u in _unseen(r)}
