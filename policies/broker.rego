# The shipped example policy: what `broker dev` and the README quick start use.
#
# Read it top to bottom: the CONNECT phase lets an agent open a tunnel to a host on one of
# the lists below; the request phase then decides every request inside the tunnel and says
# which credentials it carries. Everything else is denied, with a reason the agent can read.
package broker

# Hosts an agent may read from (GET/HEAD), with no credential.
read_only_hosts := {
	"pypi.org",
	"files.pythonhosted.org",
	"proxy.golang.org",
	"sum.golang.org",
	"registry.npmjs.org",
	"github.com",
	"codeload.github.com",
	"objects.githubusercontent.com",
}

# Hosts reached with a credential the broker injects. The agent never sees the secret.
credentialed_hosts := {
	"api.github.com": {"credential": "github", "methods": {"GET", "HEAD"}},
	"api.openai.com": {"credential": "openai", "methods": {"GET", "POST"}},
	"api.anthropic.com": {"credential": "anthropic", "methods": {"GET", "POST"}},
}

read_methods := {"GET", "HEAD"}

default decision := {
	"allow": false,
	"reason": "denied by default: no rule in policies/broker.rego allows this request",
}

# CONNECT: open (and intercept) a tunnel to any host some rule below could allow.
decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	known_host
}

decision := {"allow": false, "reason": sprintf("host %s is not on the allow-list in policies/broker.rego", [input.request.host])} if {
	input.phase == "connect"
	not known_host
}

# Requests: read-only hosts.
decision := {"allow": true, "reason": "read-only host"} if {
	input.phase == "request"
	read_only_hosts[input.request.host]
	read_methods[input.request.method]
}

# Requests: credentialed hosts, with their credential, for the listed methods.
decision := {"allow": true, "credentials": [rule.credential], "reason": "credentialed host"} if {
	input.phase == "request"
	rule := credentialed_hosts[input.request.host]
	rule.methods[input.request.method]
}

decision := {"allow": false, "reason": sprintf("%s %s is not allowed: this host is read-only (GET, HEAD)", [input.request.method, input.request.host])} if {
	input.phase == "request"
	read_only_hosts[input.request.host]
	not read_methods[input.request.method]
}

decision := {"allow": false, "reason": sprintf("%s is not allowed on %s", [input.request.method, input.request.host])} if {
	input.phase == "request"
	rule := credentialed_hosts[input.request.host]
	not rule.methods[input.request.method]
}

decision := {"allow": false, "reason": sprintf("host %s is not on the allow-list in policies/broker.rego", [input.request.host])} if {
	input.phase == "request"
	not known_host
}

known_host if read_only_hosts[input.request.host]

known_host if credentialed_hosts[input.request.host]
