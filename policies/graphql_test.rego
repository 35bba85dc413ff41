package graphql_test

import data.graphql

req(agent, ops) := {"phase": "request", "agent": {"id": agent, "labels": {}}, "request": {"method": "POST", "scheme": "https", "host": "api.github.com", "port": 443, "path": "/graphql"}, "graphql": ops}

settings := {"credential": "gh", "graphql": {"mutations": {"bot": ["addComment", "addReaction"]}}}

q(name, fields) := {"type": "query", "name": name, "fields": fields}

m(name, fields) := {"type": "mutation", "name": name, "fields": fields}

cases := {
	"query": {"input": req("a", [q("Viewer", ["viewer", "rateLimit"])]), "allow": true},
	"introspection": {"input": req("a", [q("IntrospectionQuery", ["__schema"])]), "allow": true},
	"listed mutation": {"input": req("bot", [m("Comment", ["addComment"])]), "allow": true},
	"two listed mutations": {"input": req("bot", [m("", ["addComment", "addReaction"])]), "allow": true},
	"mutation of another agent": {"input": req("a", [m("Comment", ["addComment"])]), "allow": false, "reason": "GraphQL mutation addComment is not allowed for agent a (policies/data.yaml settings.github.graphql.mutations)"},
	"unlisted field in a listed mutation's operation": {"input": req("bot", [m("AddComment", ["addComment", "deleteRepository"])]), "allow": false, "reason": "GraphQL mutation deleteRepository is not allowed for agent bot (policies/data.yaml settings.github.graphql.mutations)"},
	"the operation name does not count": {"input": req("bot", [m("addComment", ["deleteIssue"])]), "allow": false},
	"batch with a refused mutation": {"input": req("bot", [q("A", ["viewer"]), m("B", ["mergePullRequest"])]), "allow": false, "reason": "GraphQL mutation mergePullRequest is not allowed for agent bot (policies/data.yaml settings.github.graphql.mutations)"},
	"batch of queries": {"input": req("a", [q("A", ["viewer"]), q("B", ["repository"])]), "allow": true},
	"subscription": {"input": req("a", [{"type": "subscription", "name": "S", "fields": ["x"]}]), "allow": false, "reason": "GraphQL subscriptions are not allowed"},
	"persisted": {"input": req("a", [{"type": "persisted", "name": "Viewer", "fields": [], "hash": "abc"}]), "allow": false, "reason": "persisted GraphQL queries are not allowed: send the query document"},
	"no operation": {"input": req("a", []), "allow": false, "reason": "the request to the GitHub GraphQL API carries no GraphQL operation"},
	"unknown type": {"input": req("a", [{"type": "other", "name": "", "fields": []}]), "allow": false, "reason": "GraphQL operations of type other are not allowed"},
	"not configured": {"input": object.remove(req("a", []), ["graphql"]), "allow": false, "reason": "the GitHub GraphQL API needs api.github.com /graphql in the broker's protocols.graphql, so that the policy sees its operations"},
}

expected_credentials(true) := ["gh"]

expected_credentials(false) := []

# passing[name]: case name is decided as it says.
passing contains name if {
	some name, c in cases
	d := graphql.github_decision with input as c.input with data.settings.github as settings
	d.allow == c.allow
	object.get(d, "credentials", []) == expected_credentials(c.allow)
	object.get(c, "reason", d.reason) == d.reason
}

test_decisions if {
	failing := {name | some name, _ in cases} - passing
	count(failing) == 0
}

# An agent with no mutations listed (no graphql settings at all) may still query.
test_no_graphql_settings if {
	d := graphql.github_decision with input as req("a", [q("", ["viewer"])]) with data.settings.github as {"credential": "gh"}
	d.allow
	e := graphql.github_decision with input as req("a", [m("", ["addComment"])]) with data.settings.github as {"credential": "gh"}
	not e.allow
}

# Mutations that administer, merge, push or delete are refused even when an operator lists
# them for the agent: "write" on GraphQL is what it is on the REST API.
admin_mutations := [
	"updateRepository", "deleteRepository", "archiveRepository", "transferIssue",
	"createBranchProtectionRule", "updateBranchProtectionRule", "deleteBranchProtectionRule",
	"createRepositoryRuleset", "updateRepositoryRuleset", "updateRepositoryWebCommitSignoffSetting",
	"mergePullRequest", "enablePullRequestAutoMerge", "dismissPullRequestReview",
	"createCommitOnBranch", "createRef", "updateRef", "updateRefs", "deleteRef",
	"createEnvironment", "deleteEnvironment", "createDeployment", "deleteIssue",
	"updateTeamsRepository", "addUpvote", "cloneTemplateRepository", "createRepository",
]

listing_everything := {"credential": "gh", "graphql": {"mutations": {"bot": array.concat(admin_mutations, ["addComment"])}}}

test_admin_mutations_refused_even_when_listed[f] if {
	some f in admin_mutations
	d := graphql.github_decision with input as req("bot", [m("AddComment", [f])]) with data.settings.github as listing_everything
	not d.allow
	d.reason == sprintf("GraphQL mutation %s is not part of write (issues, comments, labels, pull requests, reviews): mutations that administer, merge, push or delete are never allowed (docs/policy.md, GitHub write)", [f])
}

test_listed_write_mutation_still_allowed if {
	d := graphql.github_decision with input as req("bot", [m("", ["addComment"])]) with data.settings.github as listing_everything
	d.allow
}

app_settings := object.union(settings, {"app": true})

test_app_scopes if {
	d := graphql.github_decision with input as req("a", [q("", ["viewer"])]) with data.settings.github as app_settings
	d.credentials == [{"name": "gh", "scope": {"permissions": {"contents": "read", "issues": "read", "pull_requests": "read"}}}]
	e := graphql.github_decision with input as req("bot", [m("", ["addComment"])]) with data.settings.github as app_settings
	e.credentials == [{"name": "gh", "scope": {"permissions": {"issues": "write", "pull_requests": "write"}}}]
}
