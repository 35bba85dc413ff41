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

# Write on a writable repository is its issues, comments, labels, pull requests and reviews:
# each allowed route, with the method a client sends.
write_allowed := {
	"create an issue": ["POST", "/repos/acme/app/issues"],
	"edit an issue": ["PATCH", "/repos/acme/app/issues/7"],
	"comment on an issue": ["POST", "/repos/acme/app/issues/7/comments"],
	"edit a comment": ["PATCH", "/repos/acme/app/issues/comments/99"],
	"label an issue": ["POST", "/repos/acme/app/issues/7/labels"],
	"set an issue's labels": ["PUT", "/repos/acme/app/issues/7/labels"],
	"assign an issue": ["POST", "/repos/acme/app/issues/7/assignees"],
	"react to an issue": ["POST", "/repos/acme/app/issues/7/reactions"],
	"react to a comment": ["POST", "/repos/acme/app/issues/comments/99/reactions"],
	"create a label": ["POST", "/repos/acme/app/labels"],
	"edit a label": ["PATCH", "/repos/acme/app/labels/bug"],
	"open a pull request": ["POST", "/repos/acme/app/pulls"],
	"edit a pull request": ["PATCH", "/repos/acme/app/pulls/3"],
	"comment on a pull request's diff": ["POST", "/repos/acme/app/pulls/3/comments"],
	"reply to a review comment": ["POST", "/repos/acme/app/pulls/3/comments/12/replies"],
	"edit a review comment": ["PATCH", "/repos/acme/app/pulls/comments/12"],
	"react to a review comment": ["POST", "/repos/acme/app/pulls/comments/12/reactions"],
	"review a pull request": ["POST", "/repos/acme/app/pulls/3/reviews"],
	"edit a review": ["PUT", "/repos/acme/app/pulls/3/reviews/5"],
	"submit a review": ["POST", "/repos/acme/app/pulls/3/reviews/5/events"],
	"request reviewers": ["POST", "/repos/acme/app/pulls/3/requested_reviewers"],
}

# What write never covers: administering the repository, pushing, merging.
write_refused := {
	"make the repository public": ["PATCH", "/repos/acme/app"],
	"rename or archive it (PUT)": ["PUT", "/repos/acme/app"],
	"add a webhook": ["POST", "/repos/acme/app/hooks"],
	"edit a webhook": ["PATCH", "/repos/acme/app/hooks/1"],
	"edit a webhook's config": ["PATCH", "/repos/acme/app/hooks/1/config"],
	"ping a webhook": ["POST", "/repos/acme/app/hooks/1/pings"],
	"add a deploy key": ["POST", "/repos/acme/app/keys"],
	"add a collaborator": ["PUT", "/repos/acme/app/collaborators/mallory"],
	"edit an invitation": ["PATCH", "/repos/acme/app/invitations/1"],
	"transfer the repository": ["POST", "/repos/acme/app/transfer"],
	"set an Actions secret": ["PUT", "/repos/acme/app/actions/secrets/NPM_TOKEN"],
	"set an Actions variable": ["POST", "/repos/acme/app/actions/variables"],
	"set Actions permissions": ["PUT", "/repos/acme/app/actions/permissions"],
	"register a runner": ["POST", "/repos/acme/app/actions/runners/registration-token"],
	"run a workflow": ["POST", "/repos/acme/app/actions/workflows/ci.yml/dispatches"],
	"set an environment secret": ["PUT", "/repos/acme/app/environments/prod/secrets/KEY"],
	"create an environment": ["PUT", "/repos/acme/app/environments/prod"],
	"set a Dependabot secret": ["PUT", "/repos/acme/app/dependabot/secrets/KEY"],
	"set a Codespaces secret": ["PUT", "/repos/acme/app/codespaces/secrets/KEY"],
	"protect a branch": ["PUT", "/repos/acme/app/branches/main/protection"],
	"relax required reviews": ["PATCH", "/repos/acme/app/branches/main/protection/required_pull_request_reviews"],
	"rename a branch": ["POST", "/repos/acme/app/branches/main/rename"],
	"create a ruleset": ["POST", "/repos/acme/app/rulesets"],
	"edit a ruleset": ["PUT", "/repos/acme/app/rulesets/1"],
	"replace the topics": ["PUT", "/repos/acme/app/topics"],
	"enable Pages": ["POST", "/repos/acme/app/pages"],
	"add an autolink": ["POST", "/repos/acme/app/autolinks"],
	"turn off vulnerability alerts": ["PUT", "/repos/acme/app/vulnerability-alerts"],
	"write a file": ["PUT", "/repos/acme/app/contents/README.md"],
	"move a branch": ["PATCH", "/repos/acme/app/git/refs/heads/main"],
	"create a ref": ["POST", "/repos/acme/app/git/refs"],
	"merge a branch": ["POST", "/repos/acme/app/merges"],
	"merge a pull request": ["PUT", "/repos/acme/app/pulls/3/merge"],
	"dismiss a review": ["PUT", "/repos/acme/app/pulls/3/reviews/5/dismissals"],
	"publish a release": ["POST", "/repos/acme/app/releases"],
	"create a deployment": ["POST", "/repos/acme/app/deployments"],
	"set a commit status": ["POST", "/repos/acme/app/statuses/abc1234"],
	"dispatch an event": ["POST", "/repos/acme/app/dispatches"],
	"fork": ["POST", "/repos/acme/app/forks"],
	"lock an issue": ["PUT", "/repos/acme/app/issues/7/lock"],
	"transfer through an issue path": ["POST", "/repos/acme/app/issues/transfer"],
	"issue number not a number": ["PATCH", "/repos/acme/app/issues/x"],
	"a route one segment deeper": ["POST", "/repos/acme/app/issues/7/comments/x"],
	"a route's method on another route": ["PATCH", "/repos/acme/app/issues"],
	"POST to an edit route": ["POST", "/repos/acme/app/pulls/3"],
	"write a writable repository's owner wildcard sibling": ["POST", "/repos/acme/other/issues"],
}

test_write_allowed[name] if {
	some name, c in write_allowed
	d := github.decision with input as req(c[0], c[1]) with data.settings.github as settings
	d.allow
	d.credentials == ["gh"]
}

test_write_refused[name] if {
	some name, c in write_refused
	d := github.decision with input as req(c[0], c[1]) with data.settings.github as settings
	not d.allow
	object.get(d, "credentials", []) == []
}

# The reason names what write covers, and the sub-resource refused.
test_write_refused_reason if {
	d := github.decision with input as req("POST", "/repos/acme/app/hooks") with data.settings.github as settings
	d.reason == "POST /repos/acme/app/hooks is not part of write on repository acme/app: agents may write issues, comments, labels, pull requests and reviews, never hooks; repository settings, hooks, keys, collaborators, transfer, Actions secrets and variables, branch protection and rulesets are never allowed (docs/policy.md, GitHub write)"
	e := github.decision with input as req("PATCH", "/repos/acme/app") with data.settings.github as settings
	contains(e.reason, "never the repository itself (its settings)")
}

# Reading stays as it was: any sub-resource of a readable repository.
test_read_unchanged if {
	github.decision.allow with input as req("GET", "/repos/acme/app/hooks") with data.settings.github as settings
	github.decision.allow with input as req("GET", "/repos/acme/app/contents/src/main.go") with data.settings.github as settings
}

app_settings := object.union(settings, {"app": true})

# With a GitHub App credential, each grant asks for the repository and the least permissions.
app_cases := {
	"comment": ["POST", "/repos/acme/app/issues/7/comments", {"name": "gh", "scope": {"repositories": ["app"], "permissions": {"issues": "write"}}}],
	"label": ["POST", "/repos/acme/app/labels", {"name": "gh", "scope": {"repositories": ["app"], "permissions": {"issues": "write"}}}],
	"pull request": ["POST", "/repos/acme/app/pulls", {"name": "gh", "scope": {"repositories": ["app"], "permissions": {"pull_requests": "write"}}}],
	"review": ["POST", "/repos/acme/app/pulls/3/reviews", {"name": "gh", "scope": {"repositories": ["app"], "permissions": {"pull_requests": "write"}}}],
	"read": ["GET", "/repos/ACME/Docs/issues", {"name": "gh", "scope": {"repositories": ["docs"], "permissions": {"contents": "read", "issues": "read", "pull_requests": "read"}}}],
	"read outside a repository": ["GET", "/rate_limit", {"name": "gh", "scope": {"permissions": {"metadata": "read"}}}],
}

test_app_scopes[name] if {
	some name, c in app_cases
	d := github.decision with input as req(c[0], c[1]) with data.settings.github as app_settings
	d.allow
	d.credentials == [c[2]]
}

# No write grant for an App asks for administration, secrets, hooks or contents.
test_app_write_permissions_are_least if {
	perms := {p | some r in github.write_routes; p := r.permission}
	perms == {"issues", "pull_requests"}
}

test_app_refusals_unchanged[name] if {
	some name, c in write_refused
	d := github.decision with input as req(c[0], c[1]) with data.settings.github as app_settings
	not d.allow
}
