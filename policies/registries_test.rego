package registries_test

import data.registries

req(method, host) := {"phase": "request", "agent": {"id": "a", "labels": {}}, "request": {"method": method, "scheme": "https", "host": host, "port": 443, "path": "/simple/requests/"}}

cases := {
	"GET pypi.org": {"input": req("GET", "pypi.org"), "allow": true},
	"HEAD registry.npmjs.org": {"input": req("HEAD", "registry.npmjs.org"), "allow": true},
	"GET proxy.golang.org": {"input": req("GET", "proxy.golang.org"), "allow": true},
	"POST pypi.org (upload)": {"input": req("POST", "pypi.org"), "allow": false, "reason": "POST is not allowed on pypi.org: package registries are read-only (GET, HEAD)"},
	"PUT registry.npmjs.org (publish)": {"input": req("PUT", "registry.npmjs.org"), "allow": false, "reason": "PUT is not allowed on registry.npmjs.org: package registries are read-only (GET, HEAD)"},
	"DELETE registry.npmjs.org": {"input": req("DELETE", "registry.npmjs.org"), "allow": false, "reason": "DELETE is not allowed on registry.npmjs.org: package registries are read-only (GET, HEAD)"},
}

test_decisions[name] if {
	some name, c in cases
	d := registries.decision with input as c.input
	d.allow == c.allow
	object.get(d, "credentials", []) == []
	object.get(c, "reason", d.reason) == d.reason
}

test_hosts_come_from_data if {
	registries.hosts["pypi.org"]
	not registries.hosts["example.org"]
	registries.hosts["example.org"] with data.settings.registries as ["example.org"]
}
