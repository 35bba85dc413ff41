# The shipped policy: what `broker dev` and the README quick start use. It composes one
# package per concern; edit policies/data.yaml to change the lists they read.
#
#   registries.rego  read-only package registries (GET, HEAD)
#   git.rego         git hosting: clone and fetch; over SSH, pushes to listed branches
#   github.rego      the GitHub API with the github credential, scoped to repositories
#   graphql.rego     GitHub's GraphQL API: queries, and the mutations listed per agent
#   llm.rego         LLM APIs with their credentials, for listed models only
#   aws.rego         AWS with the aws credential: read one bucket, write one prefix, no IAM/STS
#   mcp.rego         MCP servers: listed tools, resources and prompts; arguments per agent
#   agents.rego      per-agent profiles (label `profile`): which of those an agent may use
#   paths.rego       reading paths by segments, and refusing every spelling of "." and ".."
#   postgres.rego    the Postgres front door: databases, Vault roles, statement rules
#
# The CONNECT phase opens (and intercepts) a tunnel on port 443 to a host some concern
# governs, if the agent's profile may use that concern; the request phase then decides every
# request inside the tunnel with that concern's rules, over https only. Everything else is
# denied, with a reason written for the agent.
package broker

import data.agents
import data.aws
import data.git
import data.github
import data.llm
import data.mcp
import data.postgres
import data.registries

host := input.request.host

# The concern that governs the request's host. Each host belongs to at most one concern
# (broker_test.rego checks that the lists do not overlap).
concern := "registries" if registries.governs(host)

concern := "git" if git.governs(host)

concern := "github" if github.governs(host)

concern := "llm" if llm.governs(host)

concern := "aws" if aws.governs(host)

concern := "mcp" if mcp.governs(host)

default decision := {"allow": false, "reason": "the policy does not know this kind of request (phase must be connect, request, ssh or postgres)"}

decision := {"allow": false, "reason": sprintf("host %s is not on the allow-list in policies/data.yaml", [host])} if {
	input.phase in {"connect", "request", "ssh"}
	not concern
} else := {"allow": false, "reason": agents.refusal(concern, host)} if {
	input.phase in {"connect", "request", "ssh"}
	not agents.may_use(concern)
} else := {"allow": false, "reason": sprintf("%s is not a git host: only git hosting is served over SSH", [host])} if {
	input.phase == "ssh"
	concern != "git"
} else := git.ssh_decision if {
	input.phase == "ssh"
} else := connect if {
	input.phase == "connect"
} else := {"allow": false, "reason": sprintf("plain http:// is not allowed for %s; use https://%s", [host, host])} if {
	input.phase == "request"
	not input.request.scheme == "https"
} else := registries.decision if {
	input.phase == "request"
	concern == "registries"
} else := git.decision if {
	input.phase == "request"
	concern == "git"
} else := github.decision if {
	input.phase == "request"
	concern == "github"
} else := llm.decision if {
	input.phase == "request"
	concern == "llm"
} else := aws.decision if {
	input.phase == "request"
	concern == "aws"
} else := mcp.decision if {
	input.phase == "request"
	concern == "mcp"
} else := postgres.decision if {
	input.phase == "postgres"
}

connect := {"allow": true, "intercept": true} if {
	input.request.port == 443
} else := {"allow": false, "reason": sprintf("only port 443 is allowed for %s, not %v", [host, input.request.port])}
