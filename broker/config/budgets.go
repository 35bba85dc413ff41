package config

// Budgets configures where budget counters are kept (the budgets themselves are policy data:
// data.budgets, data.prices; see docs/budgets.md).
type Budgets struct {
	// Store is the shared store; none keeps counters in the broker's memory.
	Store BudgetStore `yaml:"store"`
	// OnStoreError is what a budget does when the shared store cannot be reached, unless
	// its data says otherwise: fail_closed (the default; 503) or local (counters in memory
	// from the last values the store gave, replayed to it when it answers again).
	OnStoreError string `yaml:"on_store_error"`
}

// BudgetStore names the shared store of budget counters (and of approvals grants).
type BudgetStore struct {
	Redis *RedisStore `yaml:"redis"`
}

// RedisStore is a Redis or Valkey server.
type RedisStore struct {
	Address     string `yaml:"address"`
	PasswordEnv string `yaml:"password_env"`
	TLS         bool   `yaml:"tls"`
	// KeyPrefix starts every key the broker writes (default "capbroker:").
	KeyPrefix string `yaml:"key_prefix"`
}

func (c *Config) validateBudgets(e *errs) {
	b := c.Budgets
	switch b.OnStoreError {
	case "", "fail_closed", "local":
	default:
		e.add("budgets.on_store_error", "must be fail_closed or local, not %q", b.OnStoreError)
	}
	if r := b.Store.Redis; r != nil {
		if r.Address == "" {
			e.add("budgets.store.redis.address", "required (host:port)")
		}
		if r.PasswordEnv != "" && !envNameRe.MatchString(r.PasswordEnv) {
			e.add("budgets.store.redis.password_env", "must be an environment variable name, not %q", r.PasswordEnv)
		}
	}
}
