package config

import "time"

// Fleet makes this broker one replica of several that behave as one (docs/fleet.md): the
// requests held for approval, MCP sessions and per-agent caps are shared through
// budgets.store.redis, beside the budgets and grants. The replica's name is audit.instance's
// (default $POD_NAME, else the host name): in its audit events and in the shared store.
type Fleet struct {
	// OnStoreError is what MCP sessions and the fleet's caps do when the store cannot be
	// reached: fail_closed (the default; 503) or local (this replica's own view).
	OnStoreError string `yaml:"on_store_error"`
	// MCPSessionTTL is how long a broker remembers an MCP session's agent (default 24h).
	MCPSessionTTL time.Duration `yaml:"mcp_session_ttl"`
	// DrainDelay is how long SIGTERM reports not ready (/readyz 503) while still serving,
	// before the listener closes: the time a load balancer takes to stop sending.
	DrainDelay time.Duration `yaml:"drain_delay"`
	// DrainHold is how long a draining replica keeps the requests it holds for approval, to
	// be decided from any replica's console, before answering them approval_interrupted.
	DrainHold time.Duration `yaml:"drain_hold"`
	// AgentRequestsPerSecond caps each agent's requests across the fleet (0: no cap).
	AgentRequestsPerSecond int `yaml:"agent_requests_per_second"`
	// AgentConnections caps each agent's open connections across the fleet (0: no cap).
	AgentConnections int `yaml:"agent_connections"`
	// Learn records every replica's decision events (those carrying their input, from
	// audit.include_input) in Redis, for `broker policy learn --from fleet`.
	Learn bool `yaml:"learn"`
}

// Fleet defaults.
const (
	DefaultMCPSessionTTL = 24 * time.Hour
	DefaultDrainDelay    = 2 * time.Second
	DefaultDrainHold     = 10 * time.Second
)

func (c *Config) validateFleet(e *errs) {
	f := c.Fleet
	if f == nil {
		return
	}
	if c.Budgets.Store.Redis == nil {
		e.add("fleet", "requires budgets.store.redis: the replicas share their state through it")
	}
	switch f.OnStoreError {
	case "", "fail_closed", "local":
	default:
		e.add("fleet.on_store_error", "must be fail_closed or local, not %q", f.OnStoreError)
	}
	if f.MCPSessionTTL < 0 {
		e.add("fleet.mcp_session_ttl", "must be positive")
	}
	if f.DrainDelay < 0 || f.DrainDelay > time.Minute {
		e.add("fleet.drain_delay", "must be between 0 and 1m, not %s", f.DrainDelay)
	}
	if f.DrainHold < 0 || f.DrainHold > 10*time.Minute {
		e.add("fleet.drain_hold", "must be between 0 and 10m, not %s", f.DrainHold)
	}
	if f.AgentRequestsPerSecond < 0 {
		e.add("fleet.agent_requests_per_second", "must be positive")
	}
	if f.AgentConnections < 0 {
		e.add("fleet.agent_connections", "must be positive")
	}
	if f.Learn && !c.Audit.IncludeInput.Logs() {
		e.add("fleet.learn", "records the decision events' input: set audit.include_input (metadata, headers or full)")
	}
}
