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
	"dot-dot escape": {"input": req("GET", "/repos/acme/app/../../evil/repo"), "allow": false, "reason": "the path /repos/acme/app/../../evil/repo is not in canonical form (empty, . or .. segments); send /repos/OWNER/NAME/..."},
	"double slash": {"input": req("GET", "/repos//acme/app"), "allow": false},
	"GraphQL": {"input": req("POST", "/graphql"), "allow": false, "reason": "the GitHub GraphQL API (/graphql) is not allowed: it cannot be limited to repositories; use the REST API"},
	"read the user": {"input": req("GET", "/user"), "allow": true},
	"write the user": {"input": req("PATCH", "/user"), "allow": false, "reason": "PATCH /user is not allowed on api.github.com: only /repos/OWNER/NAME/... for repositories on the allow-list, and reading /user, /rate_limit"},
	"an organisation": {"input": req("GET", "/orgs/acme/repos"), "allow": false},
	"create a repository": {"input": req("POST", "/user/repos"), "allow": false},
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
