# Package registries: read-only, no credential.
#
# The hosts are data.settings.registries (policies/data.yaml). Requests to them may read
# (GET, HEAD) and nothing else; the broker's package decides only requests to these hosts.
package registries

import data.settings

hosts := {h | some h in settings.registries}

# governs(host): the host is a registry (a lookup in the list, no set built per decision).
governs(host) if host in settings.registries

read_methods := {"GET", "HEAD"}

decision := {"allow": true, "reason": "read-only package registry"} if {
	input.request.method in read_methods
} else := {"allow": false, "reason": sprintf("%s is not allowed on %s: package registries are read-only (GET, HEAD)", [input.request.method, input.request.host])}
