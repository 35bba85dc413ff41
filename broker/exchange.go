package broker

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"github.com/capbroker/capbroker/broker/upstream"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/llm"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/scrub"
	"github.com/capbroker/capbroker/broker/telemetry"
)

// exchange is the state of one decision, from arrival to the audit event. finish writes the
// event exactly once, whichever path ends the exchange (response sent, refusal, client gone).
type exchange struct {
	b *Broker
	// g is the config the exchange is served with, taken once when it begins (generation).
	g     *generation
	ev    audit.Event
	agent identity.Agent
	once  sync.Once
	// bytesIn and bytesOut are updated by the body wrappers, possibly from another goroutine;
	// redacted by the response's scrubber (audit "redacted").
	bytesIn, bytesOut, redacted atomic.Int64
	// running: the exchange holds one of its agent's running-request slots (admission).
	running bool
	// scrub is the response scrubber of the request's host, once it is known: the audit
	// event's text from the upstream or the agent (an error quoting a malformed response
	// line, a reason, the path) passes through it too.
	scrub *scrub.Replacer
	// meter reads the usage of a call to an LLM API, or is nil (llm.go).
	meter *llm.Meter
	// route is the upstream proxy route of the request (nil: no proxy configured, none
	// chosen); its Via goes into the audit event.
	route *upstream.Route
	// code is the agent-facing error code of a failed exchange (metrics outcome).
	code string
	// idHeader is the response's X-Broker-Request-Id value (respond).
	idHeader [1]string
	// in and body are the request's policy input and its body as read for the policy
	// (requestInput): here rather than allocated on their own.
	in   policy.Input
	body policyBody
	// jsonRPC: the request is to a configured MCP or JSON-RPC endpoint, whose client reads a
	// refusal as a JSON-RPC error (describeRPC).
	jsonRPC bool
	// mcp: the endpoint is an MCP server's (its messages are named as MCP's in the audit).
	mcp bool
	// small is the request's body when readSmallBody read it, else nil.
	small []byte
	// tr is the exchange's trace (tracing.go), nil when it is not traced.
	tr *telemetry.Trace
}

func (b *Broker) begin(phase string, r *http.Request) *exchange {
	b.inflight.Add(1)
	b.metrics.started()
	x := &exchange{b: b, g: b.gen.Load()}
	x.ev = audit.Event{
		RequestID:  newRequestID(),
		Phase:      phase,
		Method:     r.Method,
		Start:      time.Now(),
		Mode:       audit.ModeExplicit,
		PolicyMode: x.g.mode,
		SourceIP:   sourceIP(r),
	}
	b.startTrace(x, r)
	return x
}

func (x *exchange) identify(a identity.Agent) {
	x.agent = a
	x.ev.Agent = a.ID
}

// finish records the decision: audit event, metrics, and the end of the in-flight request.
func (x *exchange) finish() {
	x.once.Do(func() {
		x.ev.BytesIn, x.ev.BytesOut = x.bytesIn.Load(), x.bytesOut.Load()
		x.ev.Redacted = int(x.redacted.Load())
		if v := x.route.Via(); v != "" {
			x.ev.Via = v
			x.ev.TLSInspected = x.route.Inspected()
			x.b.metrics.proxyUsed(v, x.code == "upstream_proxy_refused" || x.code == "upstream_error")
		}
		x.nameRPC()
		if x.scrub != nil {
			x.ev.Error = x.scrub.String(x.ev.Error)
			x.ev.Reason = x.scrub.String(x.ev.Reason)
			x.ev.Path = x.scrub.String(x.ev.Path)
		}
		// decision is allow, deny, challenge (counted as neither a deny nor an error: see
		// fail), or, for an exchange that failed, error.
		decision := x.ev.Decision
		if decision == "" {
			x.ev.Decision = audit.Deny
			decision = "error"
		}
		x.b.metrics.exchanged(x.ev.Phase, decision, time.Since(x.ev.Start))
		x.b.metrics.finished(x.ev.Agent, x.ev.Host, outcome(decision, x.code), x.ev.Credentials)
		x.endTrace()
		x.b.audit.Write(&x.ev)
		if x.running {
			x.b.admission.requestDone(x.agent.ID)
		}
		x.b.inflight.Done()
	})
}

// fail turns an error into the agent's response, records it, and finishes the exchange.
func (x *exchange) fail(r *http.Request, err error) *http.Response {
	ae := classify(err)
	x.code = ae.code
	switch {
	case ae.code == "denied" || ae.code == codeAmbiguous || ae.code == "budget_exceeded" || refusedByApprover(ae.code) ||
		ae.code == errMCPSessionUnknown.code:
		x.ev.Decision = audit.Deny
		x.ev.Reason = ae.reason
	case isChallenge(r, err):
		x.ev.Decision = audit.Challenge
		x.ev.Reason = "proxy credentials requested: the request carried none"
	default:
		if ae.code == "upstream_error" {
			x.b.metrics.upstreamError(err)
		}
		x.ev.Error = err.Error()
		if x.ev.Reason == "" {
			x.ev.Reason = ae.reason
		}
	}
	resp := x.refusal(r, ae)
	setRetryAfter(resp, err)
	x.ev.Status = ae.status
	x.bytesOut.Add(resp.ContentLength)
	x.finish()
	return resp
}

// refusal is the agent's response to a request refused with ae, in the shape its client
// reads. A refusal of requests with ids to an MCP or JSON-RPC endpoint is an error response to
// each (rpcRefusal), except for the 407 asking for proxy credentials and the 404 of an
// unknown MCP session, which the client acts on, and the 400 of an ambiguous request, whose
// ids are not trusted (CONTRACT §8b); one of anything else there (notifications, a body not
// read, or not read as the server would) is a JSON-RPC error with id null and the refusal's
// status.
func (x *exchange) refusal(r *http.Request, ae agentError) *http.Response {
	shape := shapeFor(r, x.ev.Host)
	if x.jsonRPC {
		shape = shapeJSONRPC
		text := x.rpcText()
		if ae.status != http.StatusProxyAuthRequired && ae.code != errMCPSessionUnknown.code && ae.code != codeAmbiguous && text != nil {
			if ids, batch := rpcRequests(text); len(ids) > 0 {
				return rpcRefusal(r, ae, ids, batch, x.ev.RequestID, x.agent.ID, x.ev.Host)
			}
		}
	}
	return shapedErrorResponse(r, shape, ae, x.ev.RequestID, x.agent.ID, x.ev.Host)
}

// isChallenge reports whether err is the broker asking for proxy credentials that r did not
// send at all. Clients such as git (libcurl with any proxy auth) send a CONNECT without them
// first and again with them after the 407: that first answer is a challenge, not a refusal.
// A 407 for credentials that were sent and are wrong stays an error (decision deny).
func isChallenge(r *http.Request, err error) bool {
	return errors.Is(err, identity.ErrUnauthenticated) && r != nil && r.Header.Get("Proxy-Authorization") == ""
}

func newRequestID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics rather than return short)
	return hex.EncodeToString(b[:])
}

// sourceIP is sourceAddr as text: the host part of r.RemoteAddr when that is already how the
// address prints (as the net package writes it), so that a request costs no allocation for it.
func sourceIP(r *http.Request) string {
	a := sourceAddr(r)
	host := r.RemoteAddr
	if i := strings.LastIndexByte(host, ':'); i >= 0 {
		host = strings.TrimSuffix(strings.TrimPrefix(host[:i], "["), "]")
	}
	var buf [64]byte
	if a.IsValid() && string(a.AppendTo(buf[:0])) == host {
		return host
	}
	return a.String()
}

func sourceAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// countingBody counts bytes through a body; closing a response's body finishes its exchange.
type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
	x *exchange // the response's exchange, or nil (a request body)
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingBody) Close() error {
	err := c.ReadCloser.Close()
	if c.x != nil {
		c.x.finish() // once only, however often the body is closed
	}
	return err
}

// upgradedBody is the body of a 101 response: it is also the upstream side of the upgraded
// connection, which goproxy writes the agent's bytes into.
type upgradedBody struct {
	*countingBody
	w  io.Writer
	in *atomic.Int64
}

func (u *upgradedBody) Write(p []byte) (int, error) {
	n, err := u.w.Write(p)
	u.in.Add(int64(n))
	return n, err
}
