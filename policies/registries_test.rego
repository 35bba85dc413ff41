package registries_test

import data.registries

req(method, host) := at(method, host, "/simple/requests/")

at(method, host, path) := {"phase": "request", "agent": {"id": "a", "labels": {}}, "request": {"method": method, "scheme": "https", "host": host, "port": 443, "path": path}}

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

path_cases := {
	"npm scoped package": {"path": "/@types%2Fnode", "allow": true},
	"double slash": {"path": "//simple/requests/", "allow": true},
	"dot-dot": {"path": "/simple/../admin", "allow": false},
	"encoded dot-dot": {"path": "/simple/%2e%2e/admin", "allow": false},
	"dot-dot behind an encoded slash": {"path": "/simple/..%2fadmin", "allow": false},
	"path parameter": {"path": "/simple/..;/admin", "allow": false},
	"backslash": {"path": "/simple\\..\\admin", "allow": false},
}

test_paths[name] if {
	some name, c in path_cases
	d := registries.decision with input as at("GET", "registry.npmjs.org", c.path)
	d.allow == c.allow
}

test_hosts_come_from_data if {
	registries.hosts["pypi.org"]
	not registries.hosts["example.org"]
	registries.hosts["example.org"] with data.settings.registries as {"example.org": true}
	not registries.hosts["pypi.org"] with data.settings.registries as {"pypi.org": false}
	registries.governs("example.org") with data.settings.registries as {"example.org": true}
	not registries.governs("pypi.org") with data.settings.registries as {"pypi.org": false}

	# A value other than true lists nothing.
	not registries.governs("pypi.org") with data.settings.registries as {"pypi.org": "yes"}
}

# A data.yaml from an earlier release lists the hosts; the list is still read.
test_list_form_of_earlier_releases if {
	registries.governs("pypi.org") with data.settings.registries as ["pypi.org", "registry.npmjs.org"]
	not registries.governs("evil.example") with data.settings.registries as ["pypi.org", "registry.npmjs.org"]
	registries.hosts == {"pypi.org", "registry.npmjs.org"} with data.settings.registries as ["pypi.org", "registry.npmjs.org"]
	not registries.governs("pypi.org") with data.settings.registries as {"pypi.org": false}
}
