# LLM APIs, with the broker's credential for each, for listed models only.
#
# data.settings.llm (policies/data.yaml) maps each host to its credential, its model
# endpoints, the models allowed on them and the paths that may be read. A model endpoint
# takes a POST whose JSON body names the model (input.request.body.model). The policy sees
# JSON bodies up to policy.max_body_bytes (8 MiB by default, a long conversation included);
# the broker refuses a larger one (413) before this policy's decision counts, and a non-JSON
# body is null here: it cannot name a model and is refused.
#
# Paths are matched segment by segment, and only in plain form: a path with any spelling of
# "." or "..", "//", an escaped "/", ";" or a backslash is refused before any grant, so no
# upstream's way of reading it can turn an allowed path into another (policies/paths.rego).
package llm

import data.paths
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

# plain: the path is canonical, without "//" or an escaped "/": its segments are the ones
# every upstream reads.
plain if {
	paths.canonical(path)
	not paths.empty_segment(path)
	not paths.encoded_slash(path)
}

# readable: the path is a read path or below one, segment by segment.
readable if {
	some p in provider.read_paths
	paths.under(path, p)
}

endpoint if path in provider.endpoints

# Every grant is an explicit branch; whatever matches none of them ends in the last deny.
decision := deny(sprintf("the path %s is not in plain form (no . or .. segments, //, %%2F, ; or backslash, in any encoding); send the documented path", [path])) if {
	not plain
} else := grant if {
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
} else := deny(sprintf("POST %s on %s needs a JSON body (content-type application/json) with a \"model\" string", [path, input.request.host]))
