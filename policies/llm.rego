# LLM APIs, with the broker's credential for each, for listed models only.
#
# data.settings.llm (policies/data.yaml) maps each host to its credential, its model
# endpoints, the models allowed on them and the paths that may be read. A model endpoint
# takes a POST whose JSON body names the model (input.request.body.model); the broker parses
# JSON bodies up to 64 KiB, so a larger or non-JSON body cannot name one and is refused.
package llm

import data.settings

hosts := {h | some h, _ in settings.llm}

# governs(host): the host is an LLM API (an object lookup, no set built per decision).
governs(host) if settings.llm[host]

provider := settings.llm[input.request.host]

method := input.request.method

path := input.request.path

model := input.request.body.model

grant := {"allow": true, "credentials": [provider.credential], "reason": "LLM API"}

deny(reason) := {"allow": false, "reason": reason}

# allowed(m): m is one of the provider's models, or starts with one that ends in "*".
allowed(m) if m in provider.models

allowed(m) if {
	some p in provider.models
	endswith(p, "*")
	startswith(m, trim_suffix(p, "*"))
}

readable if {
	some p in provider.read_paths
	path == p
}

readable if {
	some p in provider.read_paths
	startswith(path, concat("", [p, "/"]))
}

endpoint if path in provider.endpoints

# Every grant is an explicit branch; whatever matches none of them ends in the last deny.
decision := grant if {
	method in {"GET", "HEAD"}
	readable
} else := grant if {
	method == "POST"
	endpoint
	is_string(model)
	allowed(model)
} else := deny(sprintf("%s %s is not allowed on %s: only POST to the model endpoints %s, and reading %s", [method, path, input.request.host, concat(", ", provider.endpoints), concat(", ", provider.read_paths)])) if {
	not method == "POST"
} else := deny(sprintf("POST %s is not allowed on %s: only the model endpoints %s", [path, input.request.host, concat(", ", provider.endpoints)])) if {
	not endpoint
} else := deny(sprintf("model %s is not allowed on %s; allowed: %s", [model, input.request.host, concat(", ", provider.models)])) if {
	is_string(model)
} else := deny(sprintf("POST %s on %s needs a JSON body (at most 64 KiB, content-type application/json) with a \"model\" string", [path, input.request.host]))
