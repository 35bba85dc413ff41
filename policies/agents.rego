# Per-agent profiles: which concerns (registries, git, github, llm) each agent may use.
#
# An agent's profile is its `profile` label (config: agents[].labels.profile), or "default".
# data.settings.profiles (policies/data.yaml) lists the concerns of each profile.
package agents

import data.settings

default id := ""

id := input.agent.id

default profile := "default"

profile := input.agent.labels.profile

uses := {c | some c in settings.profiles[profile]}

# may_use(concern): the agent's profile includes the concern.
may_use(concern) if concern in settings.profiles[profile]

# refusal(concern, host): why the agent may not use the concern, for the agent to read.
refusal(concern, host) := sprintf("agent %s has profile %q, which policies/data.yaml does not define", [id, profile]) if {
	not settings.profiles[profile]
} else := sprintf("agent %s (profile %s) may not use %s (%s); its profile allows: %s", [id, profile, concern, host, allowed_list])

allowed_list := concat(", ", sort(uses)) if {
	count(uses) > 0
} else := "nothing"
