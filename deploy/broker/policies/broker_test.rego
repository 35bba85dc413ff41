package broker_test

import data.broker

connect(host, port) := {"phase": "connect", "agent": {"id": "demo-agent"}, "request": {"method": "CONNECT", "host": host, "port": port}}

req(method, scheme, host, path) := {"phase": "request", "agent": {"id": "demo-agent"}, "request": {"method": method, "scheme": scheme, "host": host, "port": 8443, "path": path}, "credentials": ["demo-api"]}

cases := {
	"connect to the demo API": {"input": connect("api.demo.test", 8443), "allow": true, "credentials": []},
	"connect to another host": {"input": connect("example.com", 443), "allow": false, "credentials": []},
	"connect to another port": {"input": connect("api.demo.test", 22), "allow": false, "credentials": []},
	"read the API": {"input": req("GET", "https", "api.demo.test", "/v1/whoami"), "allow": true, "credentials": ["demo-api"]},
	"HEAD the API": {"input": req("HEAD", "https", "api.demo.test", "/v1/whoami"), "allow": true, "credentials": ["demo-api"]},
	"delete on the API": {"input": req("DELETE", "https", "api.demo.test", "/v1/whoami"), "allow": false, "credentials": []},
	"post to the API": {"input": req("POST", "https", "api.demo.test", "/v1/whoami"), "allow": false, "credentials": []},
	"outside /v1/": {"input": req("GET", "https", "api.demo.test", "/admin"), "allow": false, "credentials": []},
	"/v1 itself": {"input": req("GET", "https", "api.demo.test", "/v1"), "allow": false, "credentials": []},
	"a prefix of /v1/": {"input": req("GET", "https", "api.demo.test", "/v1x/whoami"), "allow": false, "credentials": []},
	"dot-dot out of /v1/": {"input": req("GET", "https", "api.demo.test", "/v1/../admin"), "allow": false, "credentials": []},
	"encoded dot-dot out of /v1/": {"input": req("GET", "https", "api.demo.test", "/v1/%2e%2e/admin"), "allow": false, "credentials": []},
	"encoded slash": {"input": req("GET", "https", "api.demo.test", "/v1/..%2fadmin"), "allow": false, "credentials": []},
	"path parameter": {"input": req("GET", "https", "api.demo.test", "/v1/..;/admin"), "allow": false, "credentials": []},
	"backslash": {"input": req("GET", "https", "api.demo.test", "/v1/..\\admin"), "allow": false, "credentials": []},
	"double slash": {"input": req("GET", "https", "api.demo.test", "/v1//whoami"), "allow": true, "credentials": ["demo-api"]},
	"plain http": {"input": req("GET", "http", "api.demo.test", "/v1/whoami"), "allow": false, "credentials": []},
	"another host": {"input": req("GET", "https", "example.com", "/v1/whoami"), "allow": false, "credentials": []},
	"unknown phase": {"input": {"phase": "other", "request": {"host": "api.demo.test", "port": 8443}}, "allow": false, "credentials": []},
}

test_decisions[name] if {
	some name, c in cases
	d := broker.decision with input as c.input
	d.allow == c.allow
	object.get(d, "credentials", []) == c.credentials
}

denials := {name: c | some name, c in cases; not c.allow}

test_denials_have_reasons[name] if {
	some name, c in denials
	d := broker.decision with input as c.input
	count(d.reason) > 0
}
