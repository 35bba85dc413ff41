package llm_test

import data.llm

req(method, host, path, body) := {"phase": "request", "agent": {"id": "a", "labels": {}}, "request": {"method": method, "scheme": "https", "host": host, "port": 443, "path": path, "headers": {"content-type": "application/json"}, "body": body}}

chat(model) := req("POST", "api.openai.com", "/v1/chat/completions", {"model": model, "messages": []})

settings := {
	"api.openai.com": {"credential": "openai", "endpoints": ["/v1/chat/completions", "/v1/embeddings"], "models": ["gpt-4.1*", "o4-mini"], "read_paths": ["/v1/models"]},
	"api.anthropic.com": {"credential": "anthropic", "endpoints": ["/v1/messages"], "models": ["claude-sonnet-4*"], "read_paths": []},
}

cases := {
	"listed model by prefix": {"input": chat("gpt-4.1-mini"), "allow": true, "credentials": ["openai"]},
	"listed model exactly": {"input": chat("o4-mini"), "allow": true, "credentials": ["openai"]},
	"exact entry is not a prefix": {"input": chat("o4-mini-high"), "allow": false, "reason": "model o4-mini-high is not allowed on api.openai.com; allowed: gpt-4.1*, o4-mini"},
	"unlisted model": {"input": chat("gpt-3.5-turbo"), "allow": false, "reason": "model gpt-3.5-turbo is not allowed on api.openai.com; allowed: gpt-4.1*, o4-mini"},
	"model is not a string": {"input": chat(4), "allow": false, "reason": "POST /v1/chat/completions on api.openai.com needs a JSON body (content-type application/json) with a \"model\" string"},
	"no JSON body": {"input": req("POST", "api.openai.com", "/v1/chat/completions", null), "allow": false, "reason": "POST /v1/chat/completions on api.openai.com needs a JSON body (content-type application/json) with a \"model\" string"},
	"anthropic messages": {"input": req("POST", "api.anthropic.com", "/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 10}), "allow": true, "credentials": ["anthropic"]},
	"anthropic other model": {"input": req("POST", "api.anthropic.com", "/v1/messages", {"model": "claude-opus-4-1"}), "allow": false},
	"other endpoint": {"input": req("POST", "api.openai.com", "/v1/files", {"model": "gpt-4.1"}), "allow": false, "reason": "POST /v1/files is not allowed on api.openai.com: only the model endpoints /v1/chat/completions, /v1/embeddings"},
	"endpoint with a suffix": {"input": req("POST", "api.openai.com", "/v1/chat/completions/../../files", {"model": "gpt-4.1"}), "allow": false},
	"list models": {"input": req("GET", "api.openai.com", "/v1/models", null), "allow": true, "credentials": ["openai"]},
	"read one model": {"input": req("GET", "api.openai.com", "/v1/models/gpt-4.1", null), "allow": true, "credentials": ["openai"]},
	"read files": {"input": req("GET", "api.openai.com", "/v1/files", null), "allow": false, "reason": "GET /v1/files is not allowed on api.openai.com: only POST to the model endpoints /v1/chat/completions, /v1/embeddings, and reading /v1/models"},
	"DELETE": {"input": req("DELETE", "api.openai.com", "/v1/models/ft-x", null), "allow": false},
	"read path is a segment, not a prefix": {"input": req("GET", "api.openai.com", "/v1/modelsx", null), "allow": false},
	"read path with a trailing slash": {"input": req("GET", "api.openai.com", "/v1/models/", null), "allow": true, "credentials": ["openai"]},
}

# The review's finding and its variants: a read path or an endpoint with a way out of it, in
# every spelling an upstream may resolve. The broker sends the normalised path, but the
# policy refuses them even when it is given the raw one.
escapes := {
	"dot-dot": "/v1/models/../files",
	"encoded dot-dot": "/v1/models/%2e%2e/files",
	"encoded dot-dot, upper-case": "/v1/models/%2E%2E/files",
	"dot": "/v1/models/./x",
	"dot-dot behind an encoded slash": "/v1/models/..%2Ffiles",
	"encoded slash": "/v1/models/x%2fy",
	"double-encoded dot-dot": "/v1/models/%252e%252e/files",
	"double slash": "/v1/models//x",
	"leading double slash": "//v1/models",
	"path parameter": "/v1/models/..;/files",
	"semicolon": "/v1/models;x/files",
	"backslash": "/v1/models\\..\\files",
	"encoded backslash": "/v1/models/..%5Cfiles",
}

test_escapes_refused[name] if {
	some name, p in escapes
	some r in [req("GET", "api.openai.com", p, null), req("POST", "api.openai.com", concat("", ["/v1/chat/completions", trim_prefix(p, "/v1/models")]), {"model": "gpt-4.1"})]
	d := llm.decision with input as r with data.settings.llm as settings
	not d.allow
	object.get(d, "credentials", []) == []
	startswith(d.reason, sprintf("the path %s is not in plain form", [r.request.path]))
}

test_decisions[name] if {
	some name, c in cases
	d := llm.decision with input as c.input with data.settings.llm as settings
	d.allow == c.allow
	object.get(d, "credentials", []) == object.get(c, "credentials", [])
	object.get(c, "reason", d.reason) == d.reason
}

test_shipped_settings if {
	d := llm.decision with input as req("POST", "api.anthropic.com", "/v1/messages", {"model": "claude-sonnet-4-5"})
	d.allow
	d.credentials == ["anthropic"]
}

# A coding agent's conversation runs to several MiB: 4 MiB of messages to a listed model is
# allowed, as the broker gives the policy every JSON body up to policy.max_body_bytes.
test_long_conversation_allowed if {
	kib := concat("", [s | some _ in numbers.range(1, 64); s := "0123456789abcdef"])
	content := concat("", [kib | some _ in numbers.range(1, 4096)])
	count(content) == 4194304
	body := {"model": "gpt-4.1-mini", "messages": [{"role": "user", "content": content}, {"role": "assistant", "content": "ok"}]}
	d := llm.decision with input as object.union(req("POST", "api.openai.com", "/v1/chat/completions", body), {"request": {"body_size": 4194400}})
		with data.settings.llm as settings
	d.allow
	d.credentials == ["openai"]
}
