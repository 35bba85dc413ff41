package git_test

import data.git

req(method, path, query) := {"phase": "request", "agent": {"id": "a", "labels": {}}, "request": {"method": method, "scheme": "https", "host": "github.com", "port": 443, "path": path, "query": query}}

cases := {
	"ref discovery for clone": {"input": req("GET", "/o/r.git/info/refs", {"service": ["git-upload-pack"]}), "allow": true},
	"fetch pack": {"input": req("POST", "/o/r.git/git-upload-pack", {}), "allow": true},
	"release download": {"input": req("GET", "/o/r/releases/download/v1/x.tar.gz", {}), "allow": true},
	"ref discovery for push": {"input": req("GET", "/o/r.git/info/refs", {"service": ["git-receive-pack"]}), "allow": false, "reason": "pushing to github.com is not allowed: git hosting is read-only (clone and fetch)"},
	"push pack": {"input": req("POST", "/o/r.git/git-receive-pack", {}), "allow": false, "reason": "pushing to github.com is not allowed: git hosting is read-only (clone and fetch)"},
	"other POST": {"input": req("POST", "/login", {}), "allow": false, "reason": "POST /login is not allowed on github.com: git hosting is read-only (clone and fetch)"},
	"DELETE": {"input": req("DELETE", "/o/r", {}), "allow": false, "reason": "DELETE /o/r is not allowed on github.com: git hosting is read-only (clone and fetch)"},
}

test_decisions[name] if {
	some name, c in cases
	d := git.decision with input as c.input
	d.allow == c.allow
	object.get(d, "credentials", []) == []
	object.get(c, "reason", d.reason) == d.reason
}
