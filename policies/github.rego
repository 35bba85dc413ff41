# The GitHub REST API, with the broker's `github` credential, scoped to repositories.
#
# data.settings.github (policies/data.yaml) lists the repositories an agent may read and
# those it may also write, and the few paths outside /repos/ it may read. DELETE is never
# allowed. POST /graphql is decided by its operations (graphql.rego).
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

grant := {"allow": true, "credentials": [settings.github.credential], "reason": "GitHub API"}

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
} else := deny(sprintf("repository %s is read-only for agents: %s is not allowed", [repo, method])) if {
	readable
} else := deny(sprintf("repository %s is not on the GitHub allow-list in policies/data.yaml", [repo])) if {
	repo
} else := grant if {
	method in read_methods
	path in settings.github.paths
} else := deny(sprintf("%s %s is not allowed on api.github.com: only /repos/OWNER/NAME/... for repositories on the allow-list, and reading %s", [method, path, concat(", ", settings.github.paths)]))
