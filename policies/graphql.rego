# GitHub's GraphQL API (POST https://api.github.com/graphql), with the broker's `github`
# credential, decided on what each request executes: input.graphql, which the broker reads
# only for endpoints in its config's protocols.graphql (docs/graphql.md). Without that entry
# the policy cannot see the operations, and GraphQL is refused.
#
# Queries (introspection included) are allowed: what they read is bounded by what the
# credential can see, not by repository lists. Mutations are allowed per agent, by their
# top-level fields (addComment, createIssue: what runs, whatever the operation is named), as
# listed in data.settings.github.graphql.mutations (policies/data.yaml) under the agent's id.
# Subscriptions and persisted queries (a hash: the broker cannot see the document) are
# refused.
#
# A listed mutation must also be one of write_mutations: GraphQL's counterparts of what
# write means on the REST API (issues, comments, labels, pull requests, reviews, reactions).
# Mutations that administer (updateRepository, deleteRepository, branch protection and
# rulesets, collaborators, deploy keys, environments, secrets), that merge, that push
# (createCommitOnBranch, refs) or that delete are refused even when listed. With
# settings.github.app the token is narrowed to reading contents, issues and pull requests,
# and a mutation's to writing issues and pull requests (docs/github-app.md).
package graphql

import data.settings

ops := input.graphql

# allowed_mutations: the mutation fields this agent may call.
allowed_mutations := {f | some f in object.get(object.get(settings.github, "graphql", {}), "mutations", {})[input.agent.id]}

# write_mutations: the only mutation fields that may be listed for an agent.
write_mutations := {
	"addComment", "updateIssueComment",
	"createIssue", "updateIssue", "closeIssue", "reopenIssue",
	"addLabelsToLabelable", "removeLabelsFromLabelable",
	"addAssigneesToAssignable", "removeAssigneesFromAssignable",
	"addReaction", "removeReaction",
	"createPullRequest", "updatePullRequest", "closePullRequest", "reopenPullRequest",
	"markPullRequestReadyForReview", "convertPullRequestToDraft", "requestReviews",
	"addPullRequestReview", "addPullRequestReviewComment", "addPullRequestReviewThread",
	"addPullRequestReviewThreadReply", "submitPullRequestReview", "updatePullRequestReview",
	"updatePullRequestReviewComment", "resolveReviewThread", "unresolveReviewThread",
}

mutation_fields := {f |
	some op in ops
	op.type == "mutation"
	some f in op.fields
}

# beyond_write: the mutation fields of this request that are not part of write.
beyond_write := {f | some f in mutation_fields; not f in write_mutations}

# refused_fields: the mutation fields of this request the agent may not call.
refused_fields := {f | some f in mutation_fields; not f in allowed_mutations}

# permissions: what a GitHub App token for this request may do.
permissions := {"issues": "write", "pull_requests": "write"} if {
	count(mutation_fields) > 0
} else := {"contents": "read", "issues": "read", "pull_requests": "read"}

credential := {"name": settings.github.credential, "scope": {"permissions": permissions}} if {
	object.get(settings.github, "app", false) == true
} else := settings.github.credential

grant := {"allow": true, "credentials": [credential], "reason": "GitHub GraphQL API"}

deny(reason) := {"allow": false, "reason": reason}

github_decision := deny("the GitHub GraphQL API needs api.github.com /graphql in the broker's protocols.graphql, so that the policy sees its operations") if {
	not input.graphql
} else := deny("the request to the GitHub GraphQL API carries no GraphQL operation") if {
	count(ops) == 0
} else := deny("persisted GraphQL queries are not allowed: send the query document") if {
	some op in ops
	op.type == "persisted"
} else := deny("GraphQL subscriptions are not allowed") if {
	some op in ops
	op.type == "subscription"
} else := deny(sprintf("GraphQL mutation %s is not allowed for agent %s (policies/data.yaml settings.github.graphql.mutations)", [concat(", ", sort(refused_fields)), input.agent.id])) if {
	count(refused_fields) > 0
} else := deny(sprintf("GraphQL mutation %s is not part of write (issues, comments, labels, pull requests, reviews): mutations that administer, merge, push or delete are never allowed (docs/policy.md, GitHub write)", [concat(", ", sort(beyond_write))])) if {
	count(beyond_write) > 0
} else := grant if {
	every op in ops {
		op.type in {"query", "mutation"}
	}
} else := deny(sprintf("GraphQL operations of type %s are not allowed", [concat(", ", {op.type | some op in ops; not op.type in {"query", "mutation"}})]))
