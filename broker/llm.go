package broker

import (
	"bytes"
	"io"
	"net/http"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/llm"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/usage"
)

// meterRequest starts metering a request to an LLM API (broker/llm), or does nothing for any
// other. The request body is read for its model when it is not in memory yet, the way the
// policy reads it (within policy.max_body_bytes, held against the agent's budget of bodies);
// it must be called before the outbound request is made from r. It returns the body to send
// instead of r's, when the broker asks for usage the agent did not, or nil.
func (x *exchange) meterRequest(in *policy.Input, t target, small []byte, body *policyBody) []byte {
	ep, ok := x.g.llm.Match(t.host, in.Path)
	if !ok || in.Method != http.MethodPost { // GET /v1/chat/completions lists stored ones: no call

		return nil
	}
	text := small
	if text == nil {
		if in.ReadBody != nil {
			in.ReadBody()
			in.ReadBody = nil
		}
		if body.err == nil {
			text = body.text
		}
	}
	m, nb := llm.Start(ep, text)
	// A hard budget cuts a stream that would overrun it; in monitor mode nothing is cut.
	if x.b.budgets != nil && x.g.mode != config.ModeMonitor && x.b.budgets.HardApplies(x.agent.ID, x.agent.Labels, ep.Provider) {
		m.Cap(x.b.budgets, x.agent.ID, x.agent.Labels)
	}
	x.meter = m
	return nb
}

// prepareMetered makes out ask for an unencoded response, whose usage can be read, and sends
// nb as its body when it is not nil.
func (x *exchange) prepareMetered(out *http.Request, nb []byte) {
	if x.meter == nil {
		return
	}
	for _, h := range encodingOffers {
		delete(out.Header, h)
	}
	if nb != nil {
		out.Body = io.NopCloser(bytes.NewReader(nb))
		out.ContentLength, out.TransferEncoding = int64(len(nb)), nil
		out.Header.Del("Content-Length")
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(nb)), nil }
	}
}

// metered takes a metered call once its response has ended: the recorder (budgets) is given
// it, and its cost goes on the audit event, before the event is written (finish).
func (x *exchange) metered(c usage.Call) {
	c.RequestID, c.Agent, c.Labels = x.ev.RequestID, x.agent.ID, x.agent.Labels
	var cost float64
	if x.b.recorder != nil {
		cost = x.b.recorder.Record(c)
	}
	if name := x.meter.CutBy(); name != "" {
		x.ev.Budget = name
		x.ev.Error = "stream cut: it would overrun the hard budget " + name
	}
	x.ev.LLM = &audit.LLMCall{Provider: c.Provider, Model: c.Model, TokensIn: c.In, TokensOut: c.Out, TokensCached: c.Cached, Cost: cost, Reported: c.Reported, Estimated: c.Estimated}
	x.b.metrics.llm.Observe(c, cost)
}
