package broker

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/textproto"
	"strings"

	"github.com/elazarl/goproxy"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/upstream"
	"github.com/capbroker/capbroker/broker/wire"
	"github.com/capbroker/capbroker/broker/wire/strictjson"
)

// redacted replaces every injected secret value found in a response.
const redacted = "[REDACTED]"

// handleRequest runs the pipeline for a plain (absolute-form) HTTP request. It always returns
// a response, so goproxy never forwards on its own.
func (b *Broker) handleRequest(r *http.Request, _ *goproxy.ProxyCtx) (*http.Request, *http.Response) {
	resp := b.exchange(r, nil)
	if resp.StatusCode == http.StatusSwitchingProtocols {
		switched(r.Context())
	}
	if resp.Close {
		// goproxy writes the response through its ResponseWriter, which closes the
		// connection on this header, not on resp.Close.
		resp.Header.Set("Connection", "close")
	}
	return r, resp
}

// exchange runs the pipeline for one request, plain or inside a tunnel, and returns the
// response for the agent: the upstream's, or a refusal.
func (b *Broker) exchange(r *http.Request, tun *tunnel) (resp *http.Response) {
	x := b.begin(policy.PhaseRequest, r)
	defer func() {
		// A bug must not take the broker down or forward a half-processed request. The panic
		// value is not logged: it could hold request data.
		if p := recover(); p != nil {
			b.log.Error().Str("request_id", x.ev.RequestID).Msg("panic in the request pipeline; request refused")
			resp = x.fail(r, errInternal)
		}
	}()
	resp, err := b.forward(x, r, tun)
	if err != nil {
		return x.fail(r, err)
	}
	return resp
}

// forward identifies, decides, injects, sends and wraps the response for scrubbing and audit.
func (b *Broker) forward(x *exchange, r *http.Request, tun *tunnel) (*http.Response, error) {
	identitySpan := x.step("identity")
	t, err := b.requestTarget(x, r, tun)
	identitySpan.Finish()
	if err != nil {
		return nil, err
	}
	if err := b.admission.request(x.agent.ID); err != nil {
		return nil, err
	}
	x.running = true
	x.ev.Scheme, x.ev.Host, x.ev.Port, x.ev.Path = t.scheme, t.host, t.port, r.URL.Path
	small, err := readSmallBody(r)
	if err != nil {
		return nil, err
	}
	x.bytesIn.Add(int64(len(small)))
	x.small = small
	if small == nil && r.Body != nil && r.Body != http.NoBody {
		r.Body = &countingBody{ReadCloser: r.Body, n: &x.bytesIn}
	}

	body := &x.body // the body as read for the policy, if it is
	defer func() { body.hold.release() }()
	in, d, granted, err := b.decide(x, r, t, small, body)
	if err != nil {
		return nil, err
	}
	if err := b.checkMCPSession(x, r, in); err != nil {
		return nil, err
	}
	metered, err := x.meterRequest(r, in, t, small, body, granted)
	if err != nil {
		return nil, err
	}

	out := outbound(r, t, in.Path)
	if small != nil {
		// So that the upstream client can send an idempotent request again, on a fresh
		// connection, when its kept-alive one turns out closed before any response.
		out.GetBody = func() (io.ReadCloser, error) { return memBody(small), nil }
	}
	x.prepareMetered(out, metered)
	credentialsSpan := x.credentialsStep(granted)
	toks, err := x.g.inject(r.Context(), out, granted, d.Scopes)
	if err != nil {
		credentialsSpan.Finish()
		return nil, err
	}
	x.scrub = x.g.responseScrubber(t.host)
	var rng *byteRange // a range the broker widened, to cut from the answer
	if !x.scrub.Empty() {
		// Ask for an unencoded body, and WebSocket frames without compression, so the response
		// can be scrubbed; and for the whole of it: a secret split across ranges would be
		// scrubbed in neither.
		for _, h := range encodingOffers {
			delete(out.Header, h)
		}
		rng = narrowRange(out, x.scrub)
	}
	x.g.forwardTrailers(r, out)
	err = x.g.sign(r.Context(), out, granted)
	credentialsSpan.Finish()
	if err != nil {
		return nil, err
	}

	x.traceOutbound(out, d.ForwardTraceparent)
	resp, err := x.send(out, t, granted, toks)
	if err != nil {
		return nil, err
	}
	x.traceScrub()
	b.noteMCPSession(x, in, resp)
	if err := checkSwitch(out, resp); err != nil {
		return nil, err
	}
	return x.respond(resp, x.scrub.Counting(&x.redacted), rng)
}

// decide asks the policy about the request (and a person, when the policy asks), applies the
// decision and the budgets, and returns the policy input, the decision and the credentials
// granted.
func (b *Broker) decide(x *exchange, r *http.Request, t target, small []byte, body *policyBody) (*policy.Input, policy.Decision, []*inject.Binding, error) {
	in, err := b.requestInput(x, r, t, small, body)
	if err != nil {
		return nil, policy.Decision{}, nil, err
	}
	b.readUsage(x, r, in)
	if x.g.auditInput.Logs() {
		in.LoadProtocols() // recorded whatever the policy reads (docs/learn.md)
	}
	policySpan := x.step("policy")
	d, err := b.policy.Decide(r.Context(), in)
	policySpan.Finish()
	if body.err == nil {
		body.err = bodyRefusal(err)
	}
	if body.err != nil {
		return nil, d, nil, body.err
	}
	if err == nil && d.Ask != nil {
		approvalSpan := x.step("approval")
		d, err = b.ask(x, r, in, d, small, body)
		approvalSpan.Finish()
	}
	granted, err := b.authorize(x, in, d, err)
	if err == nil {
		err = b.checkBudgets(x, r, t, in, body)
	}
	return in, d, granted, err
}

// send sends out upstream. An upstream's 401 to minted tokens retires them, and a request that
// can be sent again is sent once more with fresh ones (renewRejected), which the response is
// then scrubbed of as well.
func (x *exchange) send(out *http.Request, t target, granted []*inject.Binding, toks []minted) (*http.Response, error) {
	pool := poolFor(x.agent.ID, granted)
	if x.route != nil {
		out = out.WithContext(upstream.WithRoute(out.Context(), x.route))
	}
	for try := 0; ; try++ {
		resp, err := x.g.transport.RoundTrip(out, pool)
		if err != nil {
			return nil, upstreamFailure(t.hostPort(), err)
		}
		again := false
		if try == 0 {
			if again, err = renewRejected(resp, out, toks); err != nil {
				return nil, err
			}
		}
		if !again {
			return resp, nil
		}
		x.scrub = x.g.responseScrubber(t.host)
	}
}

// encodingOffers are the request headers that let an upstream encode a response in a way the
// scrubber cannot read, by their canonical names: net/http gives a request's header names in
// canonical form (a name that is not a valid token stays as it is, and is none of these).
var encodingOffers = [...]string{"Accept-Encoding", "Grpc-Accept-Encoding", "Sec-Websocket-Extensions"}

// requestTarget works out and checks where a request goes. Inside a tunnel the request's host
// must be the CONNECT host, and the request is always sent to the CONNECT target.
func (b *Broker) requestTarget(x *exchange, r *http.Request, tun *tunnel) (target, error) {
	if tun != nil {
		x.ev.Mode = tun.mode
		x.ev.Host, x.ev.Port = tun.target.host, tun.target.port
		agent, err := tun.reidentify(x.g)
		if err != nil {
			x.identify(tun.agent)
			return target{}, err
		}
		x.identify(agent)
		if r.ProtoMajor == 2 && r.Method == http.MethodConnect {
			// Extended CONNECT (WebSockets over HTTP/2) is not advertised; a tunnel in a tunnel is not offered.
			return target{}, fmt.Errorf("%w: CONNECT over HTTP/2 is not supported; use HTTP/1.1 for WebSockets", errBadRequest)
		}
		if tun.sniMismatch != "" {
			return target{}, denial{fmt.Sprintf("TLS server name %q does not match the tunnel's CONNECT host %q", tun.sniMismatch, tun.target.host)}
		}
		// The Host header and, in absolute form, the URL's host must both name the CONNECT target.
		for _, h := range []string{r.Host, r.URL.Host} {
			if h == "" || tun.target.names(h) {
				continue
			}
			host, port, err := splitHost(h, 0)
			if err != nil {
				return target{}, fmt.Errorf("%w: %v", errBadRequest, err)
			}
			if host != tun.target.host || (port != 0 && port != tun.target.port) {
				opened := "the tunnel's CONNECT host"
				if tun.mode == audit.ModeTransparent {
					opened = "the host this redirected connection was opened for"
				}
				return target{}, denial{fmt.Sprintf("request host %q does not match %s %q", h, opened, tun.target.hostPort())}
			}
		}
		return tun.target, nil
	}
	// The target is recorded before the agent is identified: a 407's event names where the
	// agent was going.
	host, port, splitErr := splitHost(r.URL.Host, 80)
	if splitErr == nil && r.URL.Scheme == "http" {
		x.ev.Scheme, x.ev.Host, x.ev.Port = "http", host, port
	}
	proxyAuth, err := proxyAuthorization(r)
	if err != nil {
		return target{}, err
	}
	agent, err := x.g.agents.Identify(proxyAuth, sourceAddr(r))
	if err != nil {
		return target{}, err
	}
	x.identify(agent)
	if _, err := claimConn(r.Context(), agent.ID); err != nil {
		return target{}, err
	}
	if r.URL.Scheme != "http" {
		return target{}, fmt.Errorf("%w: scheme %q: use CONNECT for https", errBadRequest, r.URL.Scheme)
	}
	if splitErr != nil {
		return target{}, fmt.Errorf("%w: %v", errBadRequest, splitErr)
	}
	return newTarget("http", host, port), nil
}

// authorize applies the decision: which credentials, if any, the request may carry. In monitor
// mode a deny is recorded as would_deny and the request goes on without credentials.
func (b *Broker) authorize(x *exchange, in *policy.Input, d policy.Decision, evalErr error) ([]*inject.Binding, error) {
	x.ev.PolicyRevision = d.Revision
	x.ev.DecisionID = d.ID
	if x.g.auditInput.Logs() {
		// The body is read for the event only at the level that writes it.
		x.ev.Input, x.ev.InputLevel = in.Document(x.g.auditInput.Body()), x.g.auditInput
	}
	err := evalErr
	var granted []*inject.Binding
	if err == nil && !d.Allow {
		err = denial{d.Reason}
	}
	// Credentials matter in the request phase only: nothing is injected at connect time.
	if err == nil && in.Phase == policy.PhaseRequest {
		granted, err = x.g.bindings.Resolve(d.Credentials, in.Host)
		if err == nil {
			err = x.g.checkScopes(granted, d.Scopes)
		}
		if err == nil && len(granted) > 0 && in.Scheme != "https" {
			err = denial{policy.ReasonCredentialsNeedHTTPS}
		}
	}
	x.ev.Reason = d.Reason
	if err == nil && d.UpstreamProxy != "" && !x.g.dialer.HasProxy(d.UpstreamProxy) {
		err = denial{fmt.Sprintf("the policy chose upstream proxy %q, which is not configured (upstream.proxy.proxies)", d.UpstreamProxy)}
	}
	if d.UpstreamProxy != "" || x.g.dialer.Chains() {
		x.route = &upstream.Route{Name: d.UpstreamProxy}
	}
	if err == nil {
		x.ev.Decision = audit.Allow
		if in.Phase == policy.PhaseRequest {
			x.ev.Credentials = d.Credentials
		}
		return granted, nil
	}
	if x.g.mode == config.ModeMonitor {
		x.ev.Decision = audit.Allow
		x.ev.WouldDeny = true
		x.ev.Reason = classify(err).reason
		if !errors.Is(err, errDenied) {
			x.ev.Error = err.Error()
		}
		return nil, nil
	}
	return nil, err
}

// readSmallBody reads a request body of known length up to maxSmallBody whole, and puts it
// back in r as an in-memory body, which it also returns (nil when the body was left to
// stream). Such a body has usually arrived with the headers. In memory, it goes upstream in the
// same write as the headers: net/http sends the headers on their own, first, before a body it
// cannot see whole. A body the agent will send only after "100 Continue" is left alone, so that
// the agent is not asked for it before the policy has decided.
func readSmallBody(r *http.Request) ([]byte, error) {
	if r.ContentLength <= 0 || r.ContentLength > maxSmallBody || r.Header.Get("Expect") != "" {
		return nil, nil
	}
	buf := make([]byte, r.ContentLength)
	if _, err := io.ReadFull(r.Body, buf); err != nil {
		return nil, fmt.Errorf("%w: reading the request body: %v", errBadRequest, err)
	}
	r.Body = memBody(buf)
	return buf, nil
}

// memBody is a request body held in memory, in the form the upstream client (and
// Request.Write) know to be one: they send it in the same write as the headers.
func memBody(b []byte) io.ReadCloser { return io.NopCloser(bytes.NewReader(b)) }

// requestInput builds the policy input. Its headers are gathered, and a JSON body up to
// x.g.maxPolicyBody is read (readPolicyBody), only when the policy can see them; small is the
// body if readSmallBody has read it. A JSON body over the limit that the policy would read
// sets body.err: the request is refused, whatever the policy decides without the body. A
// path, query or method override that the upstream could read differently from the policy is
// refused here (path.go); the path the policy sees is the one outbound sends, and the one the
// audit event records. Before anything reads a header, a decision-relevant one given twice
// (wire.CheckRequest) is refused.
func (b *Broker) requestInput(x *exchange, r *http.Request, t target, small []byte, body *policyBody) (*policy.Input, error) {
	if err := wire.CheckRequest(r); err != nil {
		return nil, err
	}
	raw, path, err := requestPath(r.URL)
	if err != nil {
		return nil, err
	}
	x.ev.Path = path
	q, err := requestQuery(r.URL.RawQuery)
	if err != nil {
		return nil, err
	}
	if err := methodOverride(r, q, small); err != nil {
		return nil, err
	}
	x.in = policy.Input{
		Phase:       policy.PhaseRequest,
		AgentID:     x.agent.ID,
		Labels:      x.agent.Labels,
		SourceIP:    x.ev.SourceIP,
		Mode:        x.ev.Mode,
		Method:      r.Method,
		Scheme:      t.scheme,
		Host:        t.host,
		Port:        t.port,
		Path:        path,
		RawPath:     raw,
		Query:       q,
		ReadHeaders: func() map[string]string { return x.g.policyHeaders(r.Header) },
		BodySize:    r.ContentLength,
		Credentials: x.g.bindings.Matching(t.host),
	}
	in := &x.in
	if err := x.g.describeAWS(x, r, in); err != nil {
		return nil, err
	}
	graphQL := x.describeGraphQL(r, in)
	x.g.describeRPC(x, r, in)
	if r.Body == nil || r.Body == http.NoBody {
		in.BodySize = 0
		return in, nil
	}
	in.ReadBody = func() ([]byte, int64) {
		readable := graphQL || isJSON(r.Header.Get("Content-Type")) // a GraphQL body is read whatever its type
		if readable {
			if body.err = wire.CheckBodyEncoding(r.Header); body.err != nil {
				return nil, r.ContentLength
			}
		}
		if small == nil && readable && r.ContentLength <= x.g.maxPolicyBody {
			// The bytes about to be held count against the agent's budget until the
			// request has been sent (bodyBudget); unknown length counts as the limit.
			n := r.ContentLength
			if n < 0 {
				n = x.g.maxPolicyBody + 1
			}
			if body.hold, body.err = x.g.bodies.hold(r.Context(), x.agent.ID, n); body.err != nil {
				body.err = fmt.Errorf("%w: waiting to read the request body: %v", errBadRequest, body.err)
				return nil, r.ContentLength
			}
		}
		text, size, err := readPolicyBody(r, small, x.g.maxPolicyBody, readable)
		body.err, body.text = err, text
		if err != nil || text == nil {
			body.hold.release()
		} else if small == nil {
			body.hold.keep(int64(len(text)))
		}
		return text, size
	}
	return in, nil
}

// bodyRefusal is the refusal, in every mode, of a body the policy reads that the broker cannot
// read as the upstream will (policy.Input's check, broker/rpc, broker/graphql): an ambiguous
// one (strictjson.ErrAmbiguous, 400 ambiguous_request), one sent as JSON that is not (400
// bad_request). nil for any other err of Decide's.
func bodyRefusal(err error) error {
	switch {
	case errors.Is(err, strictjson.ErrAmbiguous):
		return err
	case errors.Is(err, policy.ErrBodyNotJSON):
		return badRequest{err.Error()}
	}
	return nil
}

// policyBody is what reading the body for the policy left: the bytes held against the
// agent's budget, and the error that refuses the request (bodyTooLarge), if any.
type policyBody struct {
	hold *bodyHold
	err  error
	text []byte // the body's text, when read (metering reads its model)
}

// policyHeaders are the request's headers as the policy sees them: lower-case names, values
// joined, without hop-by-hop and credential-bearing ones.
func (g *generation) policyHeaders(h http.Header) map[string]string {
	headers := make(map[string]string, len(h))
	for k, vs := range h {
		lk := strings.ToLower(k)
		if !g.bindings.CredentialHeader(lk) && !isHopByHop(k) {
			headers[lk] = strings.Join(vs, ", ")
		}
	}
	return headers
}

// readPolicyBody reads a JSON body (any body, when readable says so: a GraphQL request's) up to
// limit bytes for the policy: small, when readSmallBody
// has read it; otherwise it reads the body here, into one buffer of the body's length when
// that is known, and puts the bytes back in front of the rest of r's body, so the upstream is
// sent them from that same buffer. It returns the body's text (nil if it is not JSON or
// unreadable, or not readable), which the policy parses as far as it needs, and the body's size (-1 when
// unknown). A JSON body over limit is an error (bodyTooLarge): the policy would see null
// where the body is, and a policy that allows what it cannot see would let it through.
func readPolicyBody(r *http.Request, small []byte, limit int64, readable bool) ([]byte, int64, error) {
	size := r.ContentLength
	if !readable {
		return nil, size, nil
	}
	if size > limit {
		return nil, size, bodyTooLarge{limit}
	}
	buf := small
	if buf == nil {
		var err error
		if size >= 0 {
			buf = make([]byte, size)
			var n int
			n, err = io.ReadFull(r.Body, buf)
			if err == io.EOF {
				err = io.ErrUnexpectedEOF // a declared body that never came is cut short, not empty
			}
			buf = buf[:n]
		} else {
			buf, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
		}
		r.Body = readCloser{io.MultiReader(bytes.NewReader(buf), errReader{err}, r.Body), r.Body}
		if err != nil {
			return nil, size, nil // the upstream is sent the same failure
		}
		if int64(len(buf)) > limit {
			return nil, size, bodyTooLarge{limit}
		}
	}
	if size < 0 {
		size = int64(len(buf))
	}
	return buf, size, nil
}

// bodyTooLarge refuses a JSON body over policy.max_body_bytes that the policy would read.
type bodyTooLarge struct{ limit int64 }

func (e bodyTooLarge) Error() string {
	return fmt.Sprintf("the JSON request body is over policy.max_body_bytes (%d bytes), the most the policy reads", e.limit)
}

func isJSON(contentType string) bool {
	if contentType == "application/json" {
		return true // the usual case, without parsing parameters
	}
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && wire.JSONType(mt)
}

type readCloser struct {
	io.Reader
	io.Closer
}

// errReader replays a read error after the buffered bytes, or nothing when err is nil.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	return 0, io.EOF
}

// outbound is the request as sent upstream: to the checked target, with exactly the path the
// policy decided on (requestInput), without hop-by-hop headers or proxy credentials. WebSocket
// upgrades keep their Upgrade handshake. A request the agent sent over HTTP/1.1 goes upstream
// over HTTP/1.1 (upstream.WithHTTP1), one sent over HTTP/2 over h2 where the host offers it.
func outbound(r *http.Request, t target, path string) *http.Request {
	ctx := r.Context()
	if r.ProtoMajor == 1 && !upstream.IsHTTP1(ctx) { // a tunnel's requests have it already (mitm.go)
		ctx = upstream.WithHTTP1(ctx)
	}
	out := r.Clone(ctx)
	out.RequestURI = ""
	out.URL.Scheme = t.scheme
	out.URL.Host = t.hostPort()
	sendPath(out.URL, path)
	out.Host = t.hostHeader()
	out.Close = false
	out.GetBody = nil
	upgrade := isWebSocketUpgrade(r.Header)
	removeHopByHop(out.Header)
	if headerHasToken(r.Header, "Te", "trailers") {
		out.Header.Set("Te", "trailers") // end to end (gRPC needs it); other TE values are hop-by-hop
	}
	if upgrade {
		out.Header.Set("Connection", "Upgrade")
		out.Header.Set("Upgrade", "websocket")
	}
	return out
}

// hopByHop are the headers that describe one connection, not the message (RFC 9110 §7.6.1),
// plus the proxy's own credentials; by their canonical names (isHopByHop).
var hopByHop = map[string]bool{
	"Connection":          true,
	"Proxy-Connection":    true,
	"Keep-Alive":          true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
}

// isHopByHop reports whether a header name, in any case, is one of hopByHop. A name already
// in canonical form, as net/http gives them, is looked up without a copy.
func isHopByHop(name string) bool {
	return hopByHop[textproto.CanonicalMIMEHeaderKey(name)]
}

func removeHopByHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for name := range h {
		if isHopByHop(name) {
			delete(h, name)
		}
	}
}

func isWebSocketUpgrade(h http.Header) bool {
	return headerHasToken(h, "Connection", "upgrade") && strings.EqualFold(strings.TrimSpace(h.Get("Upgrade")), "websocket")
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
