package broker

import (
	"bytes"
	"errors"
	"io"
	"net/http"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/llm"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/usage"
)

// meterRequest starts metering a request to an LLM API (broker/llm), or does nothing for any
// other. The request body is read for its model when it is not in memory yet, the way the
// policy reads it (within policy.max_body_bytes, held against the agent's budget of bodies);
// it must be called before the outbound request is made from r. It returns the body to send
// instead of r's when the broker rewrote it (the stream decision, usage asked for), or nil. A
// body the broker will not meter is refused: ambiguous JSON (400 ambiguous_request), a stream
// member of no clear value, or, under a tokens or cost budget, a body it cannot read (400
// bad_request). A credential substituted into bodies is never sent to an LLM API's host.
func (x *exchange) meterRequest(r *http.Request, in *policy.Input, t target, small []byte, body *policyBody, granted []*inject.Binding) ([]byte, error) {
	if x.g.llm.Provider(t.host) != "" {
		// config.validateBodyOnLLM refuses such a config; this holds whatever the config.
		for _, g := range granted {
			if g.InBody() {
				return nil, denial{"a credential substituted into request bodies may not be sent to an LLM API's host: the model could stream the secret back split across events, where it cannot be scrubbed"}
			}
		}
	}
	ep, ok := x.g.llm.Match(t.host, in.Path)
	if !ok || in.Method != http.MethodPost { // GET /v1/chat/completions lists stored ones: no call
		return nil, nil
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
	enforce := x.b.budgets != nil && x.g.mode != config.ModeMonitor
	budgeted := enforce && x.b.budgets.Metering(x.agent.ID, x.agent.Labels, ep.Provider) != ""
	m, nb, err := llm.Start(ep, text, llm.Options{Budgeted: budgeted, Size: r.ContentLength})
	if err != nil {
		return nil, meterRefusal(err)
	}
	// A hard budget cuts a stream that would overrun it; in monitor mode nothing is cut.
	if enforce && x.b.budgets.HardApplies(x.agent.ID, x.agent.Labels, ep.Provider) {
		m.Cap(x.b.budgets, x.agent.ID, x.agent.Labels)
	}
	x.meter = m
	return nb, nil
}

// meterRefusal is what the agent is told of a request the meter refused: strictjson's own
// ambiguity, the meter's (a near-miss name), or a body it cannot read.
func meterRefusal(err error) error {
	var re *llm.RequestError
	switch {
	case !errors.As(err, &re):
		return err // strictjson.ErrAmbiguous: classify answers 400 ambiguous_request
	case errors.Is(err, llm.ErrAmbiguous):
		return ambiguous{re.Reason}
	default:
		return badRequest{re.Reason}
	}
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
