# Package registries: read-only, no credential.
#
# The hosts are data.settings.registries (policies/data.yaml). Requests to them may read
# (GET, HEAD) and nothing else; the broker's package decides only requests to these hosts.
# A path that is not canonical (any spelling of "." or "..", ";", a backslash;
# policies/paths.rego) is refused: no registry needs one. An escaped "/" is kept: npm asks
# for scoped packages as /@scope%2Fname.
package registries

import data.paths
import data.settings

hosts := {h | settings.registries[h] == true} if is_object(settings.registries)

else := {h | some h in settings.registries} # the list form of earlier releases (below)

# governs(host): the host is a registry: one lookup by key in settings.registries, an
# object (host: true), whatever its length; no list scanned, no set built per decision.
governs(host) if settings.registries[host] == true

# The list form of earlier releases (a YAML list of hosts) is still read, by scanning it:
# `broker check-config` warns when such a list is long. Write host: true for new files.
governs(host) if {
	is_array(settings.registries)
	host in settings.registries
}

read_methods := {"GET", "HEAD"}

decision := {"allow": false, "reason": sprintf("the path %s is not in canonical form (. or .. segments, ; or backslash, in any encoding)", [input.request.path])} if {
	not paths.canonical(input.request.path)
} else := {"allow": true, "reason": "read-only package registry"} if {
	input.request.method in read_methods
} else := {"allow": false, "reason": sprintf("%s is not allowed on %s: package registries are read-only (GET, HEAD)", [input.request.method, input.request.host])}
