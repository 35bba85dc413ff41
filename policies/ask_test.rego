package ask_test

import data.ask

req(method, host, path, query) := {"phase": "request", "agent": {"id": "a1", "labels": {}}, "request": {"method": method, "scheme": "https", "host": host, "port": 443, "path": path, "query": query}}

conn(host) := {"phase": "connect", "agent": {"id": "a1", "labels": {}}, "request": {"method": "CONNECT", "host": host, "port": 443}}

approved_delete := [{"agent": "a1", "method": "DELETE", "scheme": "https", "host": "api.example.com", "port": 443, "path_prefix": "/v1/things/"}]

approved_host := [{"agent": "a1", "method": "", "scheme": "", "host": "new.example.org", "port": 443, "path_prefix": ""}]

# Entries that differ from the request in port or scheme, or were written without them.
approved_elsewhere := [
	{"agent": "a1", "method": "DELETE", "scheme": "https", "host": "api.example.com", "port": 8443, "path_prefix": "/v1/things/"},
	{"agent": "a1", "method": "DELETE", "scheme": "http", "host": "api.example.com", "port": 443, "path_prefix": "/v1/things/"},
	{"agent": "a1", "method": "DELETE", "host": "api.example.com", "path_prefix": "/v1/things/"},
	{"agent": "a1", "method": "", "host": "new.example.org", "path_prefix": ""},
]

cases := {
	"push ref discovery": {"input": req("GET", "github.com", "/acme/prod-config.git/info/refs", {"service": ["git-receive-pack"]}), "ask": "git push to github.com/acme/prod-config needs a person's approval"},
	"push pack": {"input": req("POST", "github.com", "/acme/prod-config.git/git-receive-pack", {}), "ask": "git push to github.com/acme/prod-config needs a person's approval"},
	"delete": {"input": req("DELETE", "api.example.com", "/v1/things/7", {}), "ask": "DELETE /v1/things/7 on api.example.com needs a person's approval"},
	"unlisted host": {"input": conn("new.example.org"), "ask": "new.example.org is on no list: a first connection needs a person's approval"},
}

test_asks[name] if {
	some name, c in cases
	d := ask.decision with input as c.input
	d.ask.reason == c.ask
	not object.get(d, "allow", false)
}

test_not_asked[name] if {
	some name, i in {
		"fetch of a protected repo": req("POST", "github.com", "/acme/prod-config.git/git-upload-pack", {}),
		"push to another repo": req("POST", "github.com", "/acme/other.git/git-receive-pack", {}),
		"GET on an API": req("GET", "api.example.com", "/v1/things/7", {}),
		"DELETE elsewhere": req("DELETE", "pypi.org", "/x", {}),
		"listed host": conn("api.github.com"),
	}
	not ask.decision with input as i
}

test_always_approval_stops_asking if {
	not ask.decision with input as req("DELETE", "api.example.com", "/v1/things/7", {}) with data.approved as approved_delete
	ask.decision.ask with input as req("DELETE", "api.example.com", "/v2/other/7", {}) with data.approved as approved_delete
	not ask.decision with input as conn("new.example.org") with data.approved as approved_host
	ask.decision.ask with input as conn("other.example.org") with data.approved as approved_host
}

test_always_approval_covers_its_port_and_scheme_only if {
	ask.decision.ask with input as req("DELETE", "api.example.com", "/v1/things/7", {}) with data.approved as approved_elsewhere
	ask.decision.ask with input as conn("new.example.org") with data.approved as approved_elsewhere
}

test_push_scopes_exclude_always if {
	d := ask.decision with input as req("POST", "github.com", "/acme/prod-config.git/git-receive-pack", {})
	d.ask.scopes == ["once", "agent"]
}
