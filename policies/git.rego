# Git hosting: clone and fetch, never push.
#
# The hosts are data.settings.git (policies/data.yaml). Git's smart HTTP protocol reads with
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
