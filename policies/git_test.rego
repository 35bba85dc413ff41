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

# Git over SSH (phase ssh): the same hosts, pushes from settings.git_push.
ssh_in(service, repo, refs) := {"phase": "ssh", "agent": {"id": "a", "labels": {}}, "request": {"method": "", "host": "github.com", "port": 22}, "ssh": {"host": "github.com", "port": 22, "user": "git", "service": service, "repository": repo, "refs": refs}}

push_settings := {"git": {"github.com": true}, "git_push": {"repositories": ["capbroker/sandbox", "team/*"], "branches": ["agent/*"]}}

oid_a := "1111111111111111111111111111111111111111"

oid_b := "2222222222222222222222222222222222222222"

oid_0 := "0000000000000000000000000000000000000000"

ssh_cases := {
	"clone": {"input": ssh_in("fetch", "octocat/hello.git", []), "allow": true},
	"archive": {"input": ssh_in("archive", "octocat/hello", []), "allow": true},
	"push agent branch": {"input": ssh_in("push", "capbroker/sandbox.git", [{"name": "refs/heads/agent/fix-1", "old": oid_a, "new": oid_b}]), "allow": true},
	"create agent branch": {"input": ssh_in("push", "team/x.git", [{"name": "refs/heads/agent/new", "old": oid_0, "new": oid_b}]), "allow": true},
	"push nothing": {"input": ssh_in("push", "capbroker/sandbox", []), "allow": true},
	"push main": {"input": ssh_in("push", "capbroker/sandbox.git", [{"name": "refs/heads/main", "old": oid_a, "new": oid_b}]), "allow": false, "reason": "pushing refs/heads/main is not allowed: only branches matching agent/* may be pushed (no tags, no deletions)"},
	"main among agent branches": {"input": ssh_in("push", "capbroker/sandbox.git", [{"name": "refs/heads/agent/ok", "old": oid_a, "new": oid_b}, {"name": "refs/heads/main", "old": oid_a, "new": oid_b}]), "allow": false},
	"nested agent branch": {"input": ssh_in("push", "capbroker/sandbox.git", [{"name": "refs/heads/agent/a/b", "old": oid_a, "new": oid_b}]), "allow": false},
	"delete agent branch": {"input": ssh_in("push", "capbroker/sandbox.git", [{"name": "refs/heads/agent/x", "old": oid_a, "new": oid_0}]), "allow": false},
	"delete tag": {"input": ssh_in("push", "capbroker/sandbox.git", [{"name": "refs/tags/v1", "old": oid_a, "new": oid_0}]), "allow": false},
	"push tag": {"input": ssh_in("push", "capbroker/sandbox.git", [{"name": "refs/tags/agent/v1", "old": oid_0, "new": oid_a}]), "allow": false},
	"other repository": {"input": ssh_in("push", "capbroker/capbroker.git", [{"name": "refs/heads/agent/x", "old": oid_a, "new": oid_b}]), "allow": false, "reason": "pushing to capbroker/capbroker.git on github.com is not allowed: policies/data.yaml git_push.repositories does not list it"},
	"unknown service": {"input": ssh_in("shell", "a/b", []), "allow": false},
}

test_ssh_decisions[name] if {
	some name, c in ssh_cases
	d := git.ssh_decision with input as c.input with data.settings as push_settings
	d.allow == c.allow
	object.get(c, "reason", d.reason) == d.reason
}

# By default (policies/data.yaml) no repository takes pushes.
test_ssh_push_refused_by_default if {
	d := git.ssh_decision with input as ssh_in("push", "capbroker/sandbox.git", [{"name": "refs/heads/agent/x", "old": oid_a, "new": oid_b}])
	not d.allow
}
