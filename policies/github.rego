# The GitHub REST API, with the broker's `github` credential, scoped to repositories.
#
# data.settings.github (policies/data.yaml) lists the repositories an agent may read and
# those it may also write, and the few paths outside /repos/ it may read. DELETE is never
# allowed. POST /graphql is decided by its operations (graphql.rego).
#
# Write is not repository administration: on a writable repository POST, PATCH and PUT are
# allowed only on the sub-resources listed in write_routes (issues, comments, labels, pull
# requests, reviews; docs/policy.md, GitHub write). The repository itself (PATCH
# /repos/o/r: visibility, default branch, archiving), hooks, deploy keys, collaborators,
# transfer, Actions (secrets, variables, runners), environments, branch protection and
# rulesets, contents and git refs, merging a pull request and dismissing a review are
# refused. With settings.github.app (a github_app credential) each grant is narrowed to the
# repository and to the least permissions the request needs (permissions below).
package github

import data.graphql
import data.paths
import data.settings

hosts := {"api.github.com"}

# governs(host): the host is the GitHub API.
governs(host) if host in hosts

read_methods := {"GET", "HEAD"}

write_methods := {"POST", "PATCH", "PUT"}

method := input.request.method

path := input.request.path

segments := split(trim_prefix(path, "/"), "/")

# A canonical path starts with / and has no empty, "." or ".." segments, in any spelling a
# server may resolve (paths.canonical: %2e%2e, ..%2F, ..;, backslashes), so the repository
# named in it is the one GitHub serves. An escaped "/" after the repository stays in it
# (Octokit sends branch names so); in the owner or name, see repo.
canonical if {
	paths.canonical(path)
	every s in segments {
		not s in {"", ".", ".."}
	}
}

# The repository a /repos/OWNER/NAME/... path names, lower-case. Owners and names are made
# of letters, digits, "-", "_" and "."; anything else (an escaped "/", say) names none.
repo := lower(concat("/", [segments[1], segments[2]])) if {
	segments[0] == "repos"
	count(segments) >= 3
	regex.match(`^[A-Za-z0-9_.-]+$`, segments[1])
	regex.match(`^[A-Za-z0-9_.-]+$`, segments[2])
}

# listed(patterns): the repository matches "owner/name" or "owner/*" in patterns.
listed(patterns) if {
	some p in patterns
	lower(p) == repo
}

listed(patterns) if {
	some p in patterns
	endswith(p, "/*")
	startswith(repo, lower(trim_suffix(p, "*")))
}

readable if listed(settings.github.repositories.read)

readable if writable

writable if listed(settings.github.repositories.write)

# write_routes: what write adds to read, under /repos/OWNER/NAME/: the path after the
# repository, by segments ("#" is a number, "*" any one segment), the methods allowed on it
# and the GitHub App permission the request needs (written at the write level).
write_routes := [
	{"path": ["issues"], "methods": {"POST"}, "permission": "issues"},
	{"path": ["issues", "#"], "methods": {"PATCH"}, "permission": "issues"},
	{"path": ["issues", "#", "comments"], "methods": {"POST"}, "permission": "issues"},
	{"path": ["issues", "comments", "#"], "methods": {"PATCH"}, "permission": "issues"},
	{"path": ["issues", "#", "labels"], "methods": {"POST", "PUT"}, "permission": "issues"},
	{"path": ["issues", "#", "assignees"], "methods": {"POST"}, "permission": "issues"},
	{"path": ["issues", "#", "reactions"], "methods": {"POST"}, "permission": "issues"},
	{"path": ["issues", "comments", "#", "reactions"], "methods": {"POST"}, "permission": "issues"},
	{"path": ["labels"], "methods": {"POST"}, "permission": "issues"},
	{"path": ["labels", "*"], "methods": {"PATCH"}, "permission": "issues"},
	{"path": ["pulls"], "methods": {"POST"}, "permission": "pull_requests"},
	{"path": ["pulls", "#"], "methods": {"PATCH"}, "permission": "pull_requests"},
	{"path": ["pulls", "#", "comments"], "methods": {"POST"}, "permission": "pull_requests"},
	{"path": ["pulls", "#", "comments", "#", "replies"], "methods": {"POST"}, "permission": "pull_requests"},
	{"path": ["pulls", "comments", "#"], "methods": {"PATCH"}, "permission": "pull_requests"},
	{"path": ["pulls", "comments", "#", "reactions"], "methods": {"POST"}, "permission": "pull_requests"},
	{"path": ["pulls", "#", "reviews"], "methods": {"POST"}, "permission": "pull_requests"},
	{"path": ["pulls", "#", "reviews", "#"], "methods": {"PUT"}, "permission": "pull_requests"},
	{"path": ["pulls", "#", "reviews", "#", "events"], "methods": {"POST"}, "permission": "pull_requests"},
	{"path": ["pulls", "#", "requested_reviewers"], "methods": {"POST"}, "permission": "pull_requests"},
]

# below: the path's segments after /repos/OWNER/NAME.
below := array.slice(segments, 3, count(segments)) if repo

# route_matches(r): the path below the repository is route r's, segment by segment.
route_matches(r) if {
	count(r.path) == count(below)
	every i, p in r.path {
		segment_matches(p, below[i])
	}
}

segment_matches(p, s) if p == s

segment_matches("#", s) if regex.match(`^[0-9]+$`, s)

segment_matches("*", s) if not s in {"", ".", ".."}

# write_route: the route of write_routes this request is, if it is one.
write_route := r if {
	some r in write_routes
	method in r.methods
	route_matches(r)
}

# The GitHub App permissions a request needs: writing one sub-resource, or reading the
# repository's contents, issues and pull requests; outside /repos/, metadata alone.
permissions := {write_route.permission: "write"} if {
	method in write_methods
} else := {"contents": "read", "issues": "read", "pull_requests": "read"} if {
	repo
} else := {"metadata": "read"}

# credential: the credential granted; with settings.github.app, narrowed to the repository
# and the permissions (docs/github-app.md).
credential := {"name": settings.github.credential, "scope": {"repositories": [split(repo, "/")[1]], "permissions": permissions}} if {
	object.get(settings.github, "app", false) == true
	repo
} else := {"name": settings.github.credential, "scope": {"permissions": permissions}} if {
	object.get(settings.github, "app", false) == true
} else := settings.github.credential

grant := {"allow": true, "credentials": [credential], "reason": "GitHub API"}

# what is the sub-resource a refused write names, for its reason.
what := "the repository itself (its settings)" if {
	count(below) == 0
} else := below[0]

deny(reason) := {"allow": false, "reason": reason}

decision := deny(sprintf("%s is not allowed on api.github.com", [method])) if {
	not method in (read_methods | write_methods)
} else := deny(sprintf("the path %s is not in canonical form (empty, . or .. segments, ; or backslash, in any encoding); send /repos/OWNER/NAME/...", [path])) if {
	not canonical
} else := graphql.github_decision if {
	path == "/graphql"
} else := grant if {
	method in read_methods
	readable
} else := grant if {
	method in write_methods
	writable
	write_route
} else := deny(sprintf("%s %s is not part of write on repository %s: agents may write issues, comments, labels, pull requests and reviews, never %s; repository settings, hooks, keys, collaborators, transfer, Actions secrets and variables, branch protection and rulesets are never allowed (docs/policy.md, GitHub write)", [method, path, repo, what])) if {
	method in write_methods
	writable
} else := deny(sprintf("repository %s is read-only for agents: %s is not allowed", [repo, method])) if {
	readable
} else := deny(sprintf("repository %s is not on the GitHub allow-list in policies/data.yaml", [repo])) if {
	repo
} else := grant if {
	method in read_methods
	path in settings.github.paths
} else := deny(sprintf("%s %s is not allowed on api.github.com: only /repos/OWNER/NAME/... for repositories on the allow-list, and reading %s", [method, path, concat(", ", settings.github.paths)]))
