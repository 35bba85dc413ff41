package budget

import "github.com/capbroker/capbroker/broker/policy"

// A policy whose data.budgets or data.prices is malformed does not load: `broker policy
// check` and a reload report it, instead of the broker refusing requests.
func init() {
	policy.RegisterDataCheck(func(data map[string]any) error {
		_, err := Parse(data)
		return err
	})
}
