package github_test

import data.github

req(method, path) := {"phase": "request", "agent": {"id": "a", "labels": {}}, "request": {"method": method, "scheme": "https", "host": "api.github.com", "port": 443, "path": path}}

settings := {
	"credential": "gh",
	"repositories": {"read": ["octo/*", "acme/Docs"], "write": ["acme/app"]},
	"paths": ["/user", "/rate_limit"],
}

cases := {
	"read a listed repository": {"input": req("GET", "/repos/acme/docs/issues"), "allow": true},
	"read a repository by owner wildcard": {"input": req("GET", "/repos/octo/anything/pulls"), "allow": true},
	"read ignores case": {"input": req("HEAD", "/repos/ACME/Docs"), "allow": true},
	"read a writable repository": {"input": req("GET", "/repos/acme/app/contents/README.md"), "allow": true},
	"write a writable repository": {"input": req("POST", "/repos/acme/app/issues"), "allow": true},
	"PATCH a writable repository": {"input": req("PATCH", "/repos/acme/app/pulls/1"), "allow": true},
	"write a read-only repository": {"input": req("POST", "/repos/acme/docs/issues"), "allow": false, "reason": "repository acme/docs is read-only for agents: POST is not allowed"},
	"read an unlisted repository": {"input": req("GET", "/repos/evil/repo"), "allow": false, "reason": "repository evil/repo is not on the GitHub allow-list in policies/data.yaml"},
	"wildcard owner is not a prefix of another owner": {"input": req("GET", "/repos/octopus/x"), "allow": false, "reason": "repository octopus/x is not on the GitHub allow-list in policies/data.yaml"},
	"DELETE": {"input": req("DELETE", "/repos/acme/app"), "allow": false, "reason": "DELETE is not allowed on api.github.com"},
	"dot-dot escape": {"input": req("GET", "/repos/acme/app/../../evil/repo"), "allow": false, "reason": "the path /repos/acme/app/../../evil/repo is not in canonical form (empty, . or .. segments, ; or backslash, in any encoding); send /repos/OWNER/NAME/..."},
	"encoded slash after the repository": {"input": req("GET", "/repos/acme/docs/branches/feature%2Fx"), "allow": true},
	"encoded slash in the owner": {"input": req("GET", "/repos/octo%2Fx/y"), "allow": false},
	"encoded slash in the name": {"input": req("POST", "/repos/acme/app%2F..%2Fdocs/issues"), "allow": false},
	"encoded slash joining owner and name": {"input": req("POST", "/repos/acme%2Fapp/x/issues"), "allow": false},
	"double slash": {"input": req("GET", "/repos//acme/app"), "allow": false},
	"GraphQL, operations unseen": {"input": req("POST", "/graphql"), "allow": false, "reason": "the GitHub GraphQL API needs api.github.com /graphql in the broker's protocols.graphql, so that the policy sees its operations"},
	"GraphQL query": {"input": object.union(req("POST", "/graphql"), {"graphql": [{"type": "query", "name": "", "fields": ["viewer"]}]}), "allow": true},
	"GraphQL mutation": {"input": object.union(req("POST", "/graphql"), {"graphql": [{"type": "mutation", "name": "", "fields": ["deleteRepository"]}]}), "allow": false},
	"GraphQL under another path": {"input": req("POST", "/graphql/x"), "allow": false},
	"read the user": {"input": req("GET", "/user"), "allow": true},
	"write the user": {"input": req("PATCH", "/user"), "allow": false, "reason": "PATCH /user is not allowed on api.github.com: only /repos/OWNER/NAME/... for repositories on the allow-list, and reading /user, /rate_limit"},
	"an organisation": {"input": req("GET", "/orgs/acme/repos"), "allow": false},
	"create a repository": {"input": req("POST", "/user/repos"), "allow": false},
}

# Ways out of a writable repository into one that is not, in every spelling an upstream may
# resolve: each is refused as not canonical, even given the raw path.
escapes := {
	"dot-dot": "/repos/acme/app/../../evil/repo/issues",
	"encoded dot-dot": "/repos/acme/app/%2e%2e/%2E%2E/evil/repo/issues",
	"dot-dot behind encoded slashes": "/repos/acme/app/..%2F..%2Fevil/repo/issues",
	"double-encoded dot-dot": "/repos/acme/app/%252e%252e/%252e%252e/evil/repo/issues",
	"double slash": "/repos/acme/app//issues",
	"dot-dot with a path parameter": "/repos/acme/app/..;/..;/evil/repo/issues",
	"semicolon": "/repos/acme/app;x/issues",
	"backslash": "/repos/acme/app\\..\\..\\evil/repo/issues",
	"encoded backslash": "/repos/acme/app/..%5C..%5Cevil/repo/issues",
}

test_escapes_refused[name] if {
	some name, p in escapes
	d := github.decision with input as req("POST", p) with data.settings.github as settings
	not d.allow
	object.get(d, "credentials", []) == []
	startswith(d.reason, sprintf("the path %s is not in canonical form", [p]))
}

test_decisions[name] if {
	some name, c in cases
	d := github.decision with input as c.input with data.settings.github as settings
	d.allow == c.allow
	object.get(d, "credentials", []) == expected_credentials(c.allow)
	object.get(c, "reason", d.reason) == d.reason
}

expected_credentials(true) := ["gh"]

expected_credentials(false) := []

test_shipped_settings if {
	d := github.decision with input as req("GET", "/user")
	d.allow
	d.credentials == ["github"]
}
