# Asking a person (docs/approvals.md): three requests worth a human's yes, as a building
# block. The shipped broker.rego does not use it; a policy that wants it puts, before its own
# rules, `decision := ask.decision if ask.decision` (with `import data.ask`).
#
#   a git push to a protected repository   git's smart HTTP push (info/refs?service=
#                                          git-receive-pack, then POST .../git-receive-pack);
#                                          the branch is inside the binary pack, which the
#                                          policy cannot read, so every push to the repository
#                                          asks
#   a DELETE on an API                     any DELETE to a host of api_hosts
#   a first connection to an unlisted host a CONNECT to a host no list names
#
# An "always" approval writes data.approved (approved.json in the policy directory): each
# entry {agent, method ("" any), scheme, host, port, path_prefix} stops the asking for what it
# covers: that scheme, host and port exactly ("" is the scheme of a connect-phase entry).
package ask

# Repositories whose pushes need a person, as "host/owner/name".
protected_repos := {"github.com/acme/prod-config"}

# Hosts where a DELETE needs a person.
api_hosts := {"api.github.com", "api.example.com"}

# Hosts the other policies list: a connection to any other host is asked about.
known_hosts := {"github.com", "api.github.com", "api.example.com", "pypi.org", "files.pythonhosted.org"}

decision := {
	"ask": {"reason": sprintf("git push to %s/%s needs a person's approval", [input.request.host, repo]), "timeout": "10m", "scopes": ["once", "agent"]},
	"credentials": [],
} if {
	input.phase == "request"
	pushing
	repo := repo_of(input.request.path)
	concat("/", [input.request.host, repo]) in protected_repos
	not approved
}

decision := {"ask": {"reason": sprintf("DELETE %s on %s needs a person's approval", [input.request.path, input.request.host]), "timeout": "5m"}} if {
	input.phase == "request"
	input.request.method == "DELETE"
	input.request.host in api_hosts
	not approved
}

decision := {"ask": {"reason": sprintf("%s is on no list: a first connection needs a person's approval", [input.request.host]), "scopes": ["once", "always"]}} if {
	input.phase == "connect"
	not input.request.host in known_hosts
	not approved
}

pushing if endswith(input.request.path, "/git-receive-pack")

pushing if "git-receive-pack" in input.request.query.service

# repo_of("/acme/prod-config.git/info/refs") is "acme/prod-config".
repo_of(path) := trim_suffix(concat("/", array.slice(split(trim_prefix(path, "/"), "/"), 0, 2)), ".git")

# approved: an "always" approval covers this request. data.approved is undefined until the
# first one: then nothing is approved.
approved if {
	some a in data.approved
	a.agent == input.agent.id
	a.scheme == request_scheme
	a.host == input.request.host
	a.port == input.request.port
	a.method in {"", input.request.method}
	path_covered(a.path_prefix)
}

# The connect phase has no scheme: its entries have "".
request_scheme := input.request.scheme if input.phase == "request"

request_scheme := "" if input.phase == "connect"

# A CONNECT has no path: an entry with an empty prefix covers it. The input is read by its
# exact paths, never as a whole object, so that the broker's decision cache keeps working.
path_covered(prefix) if prefix == ""

path_covered(prefix) if startswith(input.request.path, prefix)
