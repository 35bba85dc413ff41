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

# A push dressed as a fetch, in every spelling an upstream may resolve: refused as not
# canonical, even given the raw path.
escapes := {
	"dot-dot": "/o/r.git/git-receive-pack/../git-upload-pack",
	"encoded dot-dot": "/o/r.git/git-upload-pack/%2e%2e/git-receive-pack",
	"dot-dot behind an encoded slash": "/o/r.git/git-upload-pack/..%2Fgit-receive-pack",
	"path parameter": "/o/r.git/git-receive-pack;/git-upload-pack",
	"backslash": "/o/r.git/git-receive-pack\\..\\git-upload-pack",
	"encoded backslash": "/o/r.git/git-upload-pack%5C..%5Cgit-receive-pack",
}

test_escapes_refused[name] if {
	some name, p in escapes
	d := git.decision with input as req("POST", p, {})
	not d.allow
	startswith(d.reason, sprintf("the path %s is not in canonical form", [p]))
}

test_kept_forms if {
	git.decision.allow with input as req("GET", "//o/r.git/info/refs", {"service": ["git-upload-pack"]})
	git.decision.allow with input as req("GET", "/group%2Fsub/r.git/info/refs", {"service": ["git-upload-pack"]})
}

test_decisions[name] if {
	some name, c in cases
	d := git.decision with input as c.input
	d.allow == c.allow
	object.get(d, "credentials", []) == []
	object.get(c, "reason", d.reason) == d.reason
}
