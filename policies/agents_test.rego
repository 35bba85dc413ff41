package agents_test

import data.agents

agent(labels) := {"agent": {"id": "coder-1", "labels": labels}}

profiles := {"default": ["registries", "github"], "builder": ["registries"], "offline": []}

cases := {
	"no label: default profile": {"labels": {}, "concern": "github", "may": true},
	"default profile lacks llm": {"labels": {}, "concern": "llm", "may": false, "reason": "agent coder-1 (profile default) may not use llm (api.openai.com); its profile allows: github, registries"},
	"builder uses registries": {"labels": {"profile": "builder"}, "concern": "registries", "may": true},
	"builder may not use github": {"labels": {"profile": "builder", "team": "x"}, "concern": "github", "may": false, "reason": "agent coder-1 (profile builder) may not use github (api.openai.com); its profile allows: registries"},
	"offline uses nothing": {"labels": {"profile": "offline"}, "concern": "registries", "may": false, "reason": "agent coder-1 (profile offline) may not use registries (api.openai.com); its profile allows: nothing"},
	"unknown profile": {"labels": {"profile": "root"}, "concern": "registries", "may": false, "reason": "agent coder-1 has profile \"root\", which policies/data.yaml does not define"},
}

test_profiles[name] if {
	some name, c in cases
	may_use(c.concern, c.labels) == c.may
	reason := agents.refusal(c.concern, "api.openai.com") with input as agent(c.labels) with data.settings.profiles as profiles
	object.get(c, "reason", reason) == reason
}

may_use(concern, labels) if {
	agents.may_use(concern) with input as agent(labels) with data.settings.profiles as profiles
} else := false

test_shipped_default_profile_uses_everything if {
	every concern in ["registries", "git", "github", "llm"] {
		agents.may_use(concern) with input as agent({})
	}
}
