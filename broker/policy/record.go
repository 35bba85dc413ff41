package policy

// LoadProtocols reads input.graphql, input.mcp and input.jsonrpc for a request to an endpoint
// configured under protocols, whatever the policy refers to, so that the audit event's input
// carries them (`broker policy learn` drafts a policy from them: a recording without them
// would teach it nothing about which tools or operations were used). Call it before Decide
// when inputs are recorded. It never changes a decision: a body that does not read as the
// protocol is left for Decide to refuse, as it would have, when the policy reads that part,
// and is otherwise left out of the record.
func (in *Input) LoadProtocols() {
	if in.ReadGraphQL != nil {
		in.loadGraphQL()
	}
	// One at a time: an MCP body that fails to parse must not keep input.jsonrpc unread.
	_ = in.loadRPC(true, false)
	_ = in.loadRPC(false, true)
}
