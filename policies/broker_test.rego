package broker_test

import data.broker

agent(labels) := {"id": "coder-1", "labels": labels}

connect(host, port) := {"phase": "connect", "agent": agent({}), "request": {"method": "CONNECT", "host": host, "port": port}}

req(method, host, path) := {"phase": "request", "agent": agent({}), "request": {"method": method, "scheme": "https", "host": host, "port": 443, "path": path}}

ssh(host, service) := {"phase": "ssh", "agent": agent({}), "request": {"method": "", "host": host, "port": 22}, "ssh": {"host": host, "port": 22, "user": "git", "service": service, "repository": "o/r.git", "refs": []}}

as_builder(i) := object.union(i, {"agent": agent({"profile": "builder"})})

cases := {
	"connect to a registry": {"input": connect("pypi.org", 443), "allow": true},
	"connect to the GitHub API": {"input": connect("api.github.com", 443), "allow": true},
	"connect to an LLM API": {"input": connect("api.openai.com", 443), "allow": true},
	"connect to another port": {"input": connect("pypi.org", 8443), "allow": false, "reason": "only port 443 is allowed for pypi.org, not 8443"},
	"connect to an unknown host": {"input": connect("evil.example", 443), "allow": false, "reason": "host evil.example is not on the allow-list in policies/data.yaml"},
	"GET a registry": {"input": req("GET", "pypi.org", "/simple/requests/"), "allow": true},
	"POST a registry": {"input": req("POST", "pypi.org", "/legacy/"), "allow": false, "reason": "POST is not allowed on pypi.org: package registries are read-only (GET, HEAD)"},
	"plain http": {"input": object.union(req("GET", "pypi.org", "/simple/"), {"request": {"scheme": "http", "port": 80}}), "allow": false, "reason": "plain http:// is not allowed for pypi.org; use https://pypi.org"},
	"git fetch": {"input": req("POST", "github.com", "/o/r.git/git-upload-pack"), "allow": true},
	"git push": {"input": req("POST", "github.com", "/o/r.git/git-receive-pack"), "allow": false},
	"GitHub API user with its credential": {"input": req("GET", "api.github.com", "/user"), "allow": true, "credentials": ["github"]},
	"GitHub API DELETE": {"input": req("DELETE", "api.github.com", "/repos/o/r"), "allow": false, "reason": "DELETE is not allowed on api.github.com"},
	"OpenAI listed model": {"input": object.union(req("POST", "api.openai.com", "/v1/chat/completions"), {"request": {"body": {"model": "gpt-4.1-mini"}}}), "allow": true, "credentials": ["openai"]},
	"OpenAI unlisted model": {"input": object.union(req("POST", "api.openai.com", "/v1/chat/completions"), {"request": {"body": {"model": "davinci-002"}}}), "allow": false},
	"unknown host": {"input": req("GET", "evil.example", "/"), "allow": false, "reason": "host evil.example is not on the allow-list in policies/data.yaml"},
	"OpenAI models, then dot-dot": {"input": req("GET", "api.openai.com", "/v1/models/../files"), "allow": false},
	"OpenAI models, then encoded dot-dot": {"input": req("GET", "api.openai.com", "/v1/models/%2e%2e/files"), "allow": false},
	"OpenAI models, then dot-dot and an encoded slash": {"input": req("GET", "api.openai.com", "/v1/models/..%2Ffiles"), "allow": false},
	"OpenAI models, then a path parameter": {"input": req("GET", "api.openai.com", "/v1/models/..;/files"), "allow": false},
	"OpenAI models, then backslashes": {"input": req("GET", "api.openai.com", "/v1/models\\..\\files"), "allow": false},
	"OpenAI models, double slash": {"input": req("GET", "api.openai.com", "/v1//models"), "allow": false},
	"GitHub API, dot-dot out of a repository": {"input": req("GET", "api.github.com", "/repos/capbroker/sandbox/%2e%2e/%2e%2e/user/repos"), "allow": false},
	"builder profile: registry": {"input": as_builder(req("GET", "pypi.org", "/simple/")), "allow": true},
	"builder profile: no GitHub API": {"input": as_builder(connect("api.github.com", 443)), "allow": false, "reason": "agent coder-1 (profile builder) may not use github (api.github.com); its profile allows: git, registries"},
	"AWS S3 read with its credential": {"input": object.union(req("GET", "example-data.s3.eu-west-1.amazonaws.com", "/x"), {"aws": {"service": "s3", "region": "eu-west-1", "operation": "GetObject", "bucket": "example-data", "key": "x"}}), "allow": true, "credentials": ["aws"]},
	"MCP tool listed": {"input": object.union(req("POST", "mcp.example.com", "/mcp"), {"mcp": [{"method": "tools/call", "tool": "echo", "arguments": {}, "uri": ""}]}), "allow": true},
	"MCP tool not listed": {"input": object.union(req("POST", "mcp.example.com", "/mcp"), {"mcp": [{"method": "tools/call", "tool": "delete_repository", "arguments": {}, "uri": ""}]}), "allow": false, "reason": "MCP tool delete_repository is not allowed on mcp.example.com: agents may call echo, search_issues"},
	"AWS IAM": {"input": object.union(req("POST", "iam.amazonaws.com", "/"), {"aws": {"service": "iam", "region": "us-east-1", "operation": "CreateAccessKey", "bucket": "", "key": ""}}), "allow": false, "reason": "AWS iam is never allowed for agents (CreateAccessKey)"},
	"git clone over ssh": {"input": ssh("github.com", "fetch"), "allow": true},
	"git push over ssh, repository not listed": {"input": ssh("github.com", "push"), "allow": false},
	"ssh to a host that is not git hosting": {"input": ssh("pypi.org", "fetch"), "allow": false, "reason": "pypi.org is not a git host: only git hosting is served over SSH"},
	"ssh to an unknown host": {"input": ssh("evil.example", "fetch"), "allow": false, "reason": "host evil.example is not on the allow-list in policies/data.yaml"},
	"offline profile: no git over ssh": {"input": object.union(ssh("github.com", "fetch"), {"agent": agent({"profile": "offline"})}), "allow": false},
	"unknown phase": {"input": {"phase": "other", "agent": agent({}), "request": {"host": "pypi.org"}}, "allow": false},
}

test_decisions[name] if {
	some name, c in cases
	d := broker.decision with input as c.input
	d.allow == c.allow
	object.get(d, "credentials", []) == object.get(c, "credentials", [])
	reason := object.get(d, "reason", "")
	object.get(c, "reason", reason) == reason
}

# Every deny carries a reason the agent can read.
test_every_deny_has_a_reason[name] if {
	some name, c in cases
	d := broker.decision with input as c.input
	explained(d)
}

explained(d) if d.allow

explained(d) if {
	not d.allow
	d.reason != ""
}

# A host in two concerns would make `concern` conflict, and every decision for it an error.
test_concerns_do_not_overlap if {
	lists := [data.registries.hosts, data.git.hosts, data.github.hosts, data.llm.hosts, data.aws.hosts, object.keys(data.settings.mcp.servers)]
	hosts := {h | some l in lists; some h in l}
	count(hosts) == sum([count(l) | some l in lists])
}
