# The docker-compose demo's policy: the agent may read the demo API (GET and HEAD under /v1/)
# with the demo-api credential, over https, and nothing else. The API's hosts and ports are
# data, in data.yaml beside this file.
package broker

host := input.request.host

# under_v1: the path is below /v1/, segment by segment, and plain: the demo API needs no
# escape, ";" or backslash, and no "." or ".." segment. The broker sends the normalised path,
# but a policy granting a credential should not depend on it: given the raw path, this still
# refuses /v1/../admin, /v1/%2e%2e/admin and /v1/..;/admin.
under_v1 if {
	segments := split(input.request.path, "/")
	segments[0] == ""
	segments[1] == "v1"
	count(segments) > 2
	every s in segments {
		not s in {".", ".."}
	}
	not regex.match(`[%\\;#]`, input.request.path)
}

default decision := {"allow": false, "reason": "the policy does not know this kind of request (phase must be connect or request)"}

decision := {"allow": false, "reason": sprintf("host %s is not on the demo allow-list (deploy/broker/policies/data.yaml)", [host])} if {
	input.phase in {"connect", "request"}
	not host in data.demo.api_hosts
} else := {"allow": false, "reason": sprintf("port %v is not allowed for %s", [input.request.port, host])} if {
	input.phase in {"connect", "request"}
	not input.request.port in data.demo.api_ports
} else := {"allow": true, "intercept": true} if {
	input.phase == "connect"
} else := {"allow": false, "reason": sprintf("plain http:// is not allowed for %s; use https://", [host])} if {
	input.phase == "request"
	input.request.scheme != "https"
} else := {"allow": true, "reason": "demo API, read only", "credentials": ["demo-api"]} if {
	input.phase == "request"
	input.request.method in {"GET", "HEAD"}
	under_v1
} else := {"allow": false, "reason": sprintf("%s %s is not allowed on %s: the demo agent may only read (GET, HEAD) under /v1/, by a plain path", [input.request.method, input.request.path, host])} if {
	input.phase == "request"
}
