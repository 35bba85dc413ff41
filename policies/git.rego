# Git hosting, over HTTPS and over SSH, from one data shape: the hosts are data.settings.git
# (policies/data.yaml), pushes are data.settings.git_push.
#
# HTTPS: clone and fetch, never push (the broker does not read an HTTPS push's ref updates).
# SSH (phase "ssh", input.ssh, the broker's SSH front door): clone, fetch and archive of any
# repository on those hosts; a push only to a repository in git_push.repositories, and every
# ref it updates a branch in git_push.branches: no tag, no other branch, no deletion.
#
# HTTPS details. Git's smart HTTP protocol reads with
# GET .../info/refs?service=git-upload-pack and POST .../git-upload-pack; it pushes with
# git-receive-pack, which is refused. No credential: public repositories only. A path that
# is not canonical (any spelling of "." or "..", ";", a backslash; policies/paths.rego) is
# refused, so that no server's way of reading it turns a fetch into a push.
package git

import data.paths
import data.settings

hosts := {h | settings.git[h] == true} if is_object(settings.git)

else := {h | some h in settings.git} # the list form of earlier releases (below)

# governs(host): the host is git hosting: one lookup by key in settings.git, an object
# (host: true); no list scanned, no set built per decision.
governs(host) if settings.git[host] == true

# The list form of earlier releases (a YAML list of hosts) is still read, by scanning it:
# `broker check-config` warns when such a list is long. Write host: true for new files.
governs(host) if {
	is_array(settings.git)
	host in settings.git
}

decision := {"allow": false, "reason": sprintf("the path %s is not in canonical form (. or .. segments, ; or backslash, in any encoding)", [input.request.path])} if {
	not paths.canonical(input.request.path)
} else := {"allow": false, "reason": sprintf("pushing to %s is not allowed: git hosting is read-only (clone and fetch)", [input.request.host])} if {
	pushing
} else := {"allow": true, "reason": "git clone or fetch"} if {
	input.request.method in {"GET", "HEAD"}
} else := {"allow": true, "reason": "git clone or fetch"} if {
	input.request.method == "POST"
	endswith(input.request.path, "/git-upload-pack")
} else := {"allow": false, "reason": sprintf("%s %s is not allowed on %s: git hosting is read-only (clone and fetch)", [input.request.method, input.request.path, input.request.host])}

pushing if endswith(input.request.path, "/git-receive-pack")

pushing if "git-receive-pack" in input.request.query.service

# The all-zero object id: a ref created (as old) or deleted (as new), SHA-1 or SHA-256.
zero_oid(oid) if regex.match(`^0+$`, oid)

# repository is input.ssh.repository as owner/name: without ".git", lower case.
repository := lower(trim_suffix(input.ssh.repository, ".git"))

# push_repository: the repository is one settings.git_push.repositories names ("owner/name",
# or "owner/*" for all of an owner's; GitLab groups as "group/sub/*").
push_repository if {
	some pattern in object.get(settings, ["git_push", "repositories"], [])
	glob.match(lower(pattern), ["/"], repository)
}

# branch_allowed(ref): a branch (refs/heads/...) created or moved, its name matching one of
# settings.git_push.branches ("agent/*" matches agent/x, not agent/x/y).
branch_allowed(ref) if {
	startswith(ref.name, "refs/heads/")
	not zero_oid(ref.new)
	branch := substring(ref.name, count("refs/heads/"), -1)
	some pattern in object.get(settings, ["git_push", "branches"], [])
	glob.match(pattern, ["/"], branch)
}

refused_refs := [r.name | some r in input.ssh.refs; not branch_allowed(r)]

ssh_decision := {"allow": true, "reason": sprintf("git %s", [input.ssh.service])} if {
	input.ssh.service in {"fetch", "archive"}
} else := {"allow": false, "reason": sprintf("pushing to %s on %s is not allowed: policies/data.yaml git_push.repositories does not list it", [input.ssh.repository, input.ssh.host])} if {
	input.ssh.service == "push"
	not push_repository
} else := {"allow": false, "reason": sprintf("pushing %s is not allowed: only branches matching %s may be pushed (no tags, no deletions)", [concat(", ", refused_refs), concat(", ", object.get(settings, ["git_push", "branches"], []))])} if {
	input.ssh.service == "push"
	count(refused_refs) > 0
} else := {"allow": true, "reason": "git push to allowed branches"} if {
	input.ssh.service == "push"
} else := {"allow": false, "reason": sprintf("the git service %v is not known", [input.ssh.service])}
