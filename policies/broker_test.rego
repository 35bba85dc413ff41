package broker_test

import data.broker

connect(host) := {"phase": "connect", "agent": {"id": "a", "labels": {}}, "request": {"method": "CONNECT", "host": host, "port": 443}}

req(method, host) := {"phase": "request", "agent": {"id": "a", "labels": {}}, "request": {"method": method, "scheme": "https", "host": host, "port": 443, "path": "/"}}

cases := {
	"connect to a read-only host": {"input": connect("pypi.org"), "allow": true, "credentials": []},
	"connect to a credentialed host": {"input": connect("api.github.com"), "allow": true, "credentials": []},
	"connect to an unknown host": {"input": connect("evil.example"), "allow": false, "credentials": []},
	"GET a read-only host": {"input": req("GET", "pypi.org"), "allow": true, "credentials": []},
	"POST a read-only host": {"input": req("POST", "pypi.org"), "allow": false, "credentials": []},
	"GET GitHub API with its credential": {"input": req("GET", "api.github.com"), "allow": true, "credentials": ["github"]},
	"DELETE on GitHub API": {"input": req("DELETE", "api.github.com"), "allow": false, "credentials": []},
	"POST to OpenAI": {"input": req("POST", "api.openai.com"), "allow": true, "credentials": ["openai"]},
	"request to an unknown host": {"input": req("GET", "evil.example"), "allow": false, "credentials": []},
}

test_decisions if {
	every _, c in cases {
		d := broker.decision with input as c.input
		d.allow == c.allow
		object.get(d, "credentials", []) == c.credentials
	}
}

test_every_deny_has_a_reason if {
	every _, c in cases {
		d := broker.decision with input as c.input
		explained(d)
	}
}

explained(d) if d.allow

explained(d) if {
	not d.allow
	d.reason != ""
}

test_deny_reason_names_host if {
	d := broker.decision with input as req("GET", "evil.example")
	contains(d.reason, "evil.example")
}

test_single_decision_for_every_case if {
	every _, c in cases {
		d := broker.decision with input as c.input
		is_boolean(d.allow)
	}
}
