package broker

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/capbroker/capbroker/broker/budget"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/llm"
	"github.com/capbroker/capbroker/broker/policy"
)

// readUsage makes input.usage available to the policy: the counters of the budgets that
// apply to the agent, computed only if the policy refers to them.
func (b *Broker) readUsage(x *exchange, r *http.Request, in *policy.Input) {
	switch {
	case b.budgets == nil:
	case !b.budgets.Active():
		in.ReadUsage = noUsage // what Usage returns then, without a closure per request
	default:
		ctx := r.Context()
		in.ReadUsage = func() map[string]any { return b.budgets.Usage(ctx, x.agent.ID, x.agent.Labels) }
	}
}

func noUsage() map[string]any { return map[string]any{} }

// checkBudgets counts an allowed request against the budgets that apply to it, before it is
// sent: over one, it is refused (429 budget_exceeded, with Retry-After); a budget whose shared
// store failed and that fails closed refuses it with 503. The request's model is read from
// its JSON body (as the policy reads it) only when a budget naming a model applies. In
// monitor mode a request a budget would refuse is recorded as would_deny and sent.
func (b *Broker) checkBudgets(x *exchange, r *http.Request, t target, in *policy.Input, body *policyBody) error {
	if b.budgets == nil || !b.budgets.Active() {
		return nil
	}
	// A metered endpoint (broker/llm: built-in, or one the config names) says its provider;
	// other requests to an LLM API's host count for that API too.
	provider := x.g.llm.Provider(t.host)
	if provider == "" {
		provider = b.budgets.Provider(t.host)
	}
	ep, metered := x.g.llm.Match(t.host, in.Path)
	if metered {
		provider = ep.Provider
	}
	if err := b.checkMetered(x, r, in, provider, metered && in.Method == http.MethodPost); err != nil {
		return err
	}
	err := b.budgets.Check(r.Context(), budget.Request{
		Agent: x.agent.ID, Labels: x.agent.Labels, Provider: provider,
		Model: func() string { return requestModel(provider, in) },
	})
	if body.err != nil {
		return body.err
	}
	if err == nil {
		return nil
	}
	if ex, ok := errors.AsType[*budget.Exceeded](err); ok {
		x.ev.Budget = ex.Budget
	} else if un, ok := errors.AsType[*budget.Unavailable](err); ok {
		x.ev.Budget = un.Budget
	} else {
		return fmt.Errorf("%w: %v", policy.ErrEvaluation, err)
	}
	if x.g.mode == config.ModeMonitor {
		x.ev.WouldDeny = true
		x.ev.Reason = err.Error()
		return nil
	}
	return err
}

// checkMetered refuses a request to an LLM API's host that the broker cannot meter (an
// endpoint it does not know, a method other than POST on one it does, a protocol upgrade)
// and that is not free (llm.Free: reads, counting tokens), when a tokens or cost budget
// applies: such a call would spend tokens no budget counts. In monitor mode it is recorded as
// would_deny and sent.
func (b *Broker) checkMetered(x *exchange, r *http.Request, in *policy.Input, provider string, metered bool) error {
	if provider == "" || metered || llm.Free(in.Method, in.Path, r.Header.Get("Upgrade") != "") {
		return nil
	}
	name := b.budgets.Metering(x.agent.ID, x.agent.Labels, provider)
	if name == "" {
		return nil
	}
	x.ev.Budget = name
	err := denial{fmt.Sprintf("%s %s on an LLM API's host is no call the broker can meter, and the tokens or cost budget %q applies: it is refused rather than left uncounted", in.Method, in.Path, name)}
	if x.g.mode == config.ModeMonitor {
		x.ev.WouldDeny = true
		x.ev.Reason = err.Error()
		return nil
	}
	return err
}

// requestModel is the model an LLM request names: in the path for Gemini
// (/v1beta/models/MODEL:generateContent), else the body's "model".
func requestModel(provider string, in *policy.Input) string {
	if provider == "gemini" {
		_, rest, ok := strings.Cut(in.Path, "/models/")
		if !ok {
			return ""
		}
		m, _, _ := strings.Cut(rest, ":")
		m, _, _ = strings.Cut(m, "/")
		return m
	}
	return in.BodyString("model")
}

// setRetryAfter tells an agent refused for a budget when to try again: when the budget's
// window ends, or in a second when its store failed.
func setRetryAfter(resp *http.Response, err error) {
	var ex *budget.Exceeded
	var un *budget.Unavailable
	switch {
	case errors.As(err, &ex):
		resp.Header.Set("Retry-After", strconv.Itoa(max(ex.RetryAfterSeconds(), 1)))
	case errors.As(err, &un):
		resp.Header.Set("Retry-After", "1")
	}
}
