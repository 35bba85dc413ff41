package broker

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/capbroker/capbroker/broker/budget"
	"github.com/capbroker/capbroker/broker/certs"
	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/upstream"
	"github.com/capbroker/capbroker/broker/wire"
	"github.com/capbroker/capbroker/broker/wire/strictjson"
	"github.com/capbroker/capbroker/credentials"
)

// The failures the pipeline maps to an agent-facing response. Everything else is an upstream error.
var (
	errDenied          = errors.New("denied")
	errBadRequest      = errors.New("bad request")
	errUpstreamTimeout = errors.New("upstream timeout")
	errTooMany         = errors.New("too many connections for this agent")
	errTooManyRequests = errors.New("too many requests in flight for this agent")
	errOtherAgent      = errors.New("a connection carries one agent's requests")
	// errUnscrubbable is a response in a shape the scrubber cannot read (an unknown encoding, a
	// byte range, a compressed WebSocket): refused, not passed on unscrubbed.
	errUnscrubbable = errors.New("response cannot be scrubbed")
	errInternal     = errors.New("internal error")
)

// codeAmbiguous is the error of a request the broker will not decide on (ambiguous): audited
// as a deny.
const codeAmbiguous = "ambiguous_request"

// denial is a deny whose reason the agent may read.
type denial struct{ reason string }

func (d denial) Error() string        { return "denied: " + d.reason }
func (d denial) Is(target error) bool { return target == errDenied }

// ambiguous is a request the broker will not decide on because a server may read it otherwise
// than the broker would (CONTRACT §8b): a decision-relevant header given twice, say. The
// reason names what is ambiguous, never a value. A body whose JSON members collide is refused
// the same way through strictjson.ErrAmbiguous, and a header through a *wire.HeaderError (given
// twice, spelled with '_', an encoded body the broker reads, an x-amz-copy-source S3 could read
// as another object).
type ambiguous struct{ reason string }

func (a ambiguous) Error() string { return "ambiguous request: " + a.reason }

const hintAmbiguous = "Send each decision-relevant header once and each JSON member once, with its name in one letter case."

// agentError is what the agent is told: the code, the status, a reason and a hint. Internal
// error text never reaches it; it is logged in the audit event instead.
type agentError struct {
	status int
	code   string
	reason string
	hint   string
}

// reasonOwnService is the deny of a request to the broker's own listeners (its proxy, admin
// API, transparent and DNS listeners) or the services it uses (Vault, Redis): refused at the
// dialer whatever the policy decided, so that an agent can never approve its own requests.
const reasonOwnService = "the destination is the broker's own listener or a service the broker uses (its admin API, proxy, Vault or Redis); the broker never sends an agent's request there"

const hintDenied = "This request is not allowed by the broker's policy. Do not retry it; ask the operator if it should be allowed."

// classify maps an error to what the agent sees. It is the only place that does.
func classify(err error) agentError {
	var d denial
	var br badRequest // path.go: a bad request whose reason the agent may read
	var big bodyTooLarge
	var ar approvalRefusal
	var ex *budget.Exceeded
	var un *budget.Unavailable
	var amb ambiguous
	var sj *strictjson.Error
	var wh *wire.HeaderError
	var pr *upstream.ProxyRefusedError
	switch {
	case errors.As(err, &amb):
		return agentError{http.StatusBadRequest, codeAmbiguous, amb.reason, hintAmbiguous}
	case errors.Is(err, strictjson.ErrAmbiguous) && errors.As(err, &sj):
		return agentError{http.StatusBadRequest, codeAmbiguous, sj.Error(), hintAmbiguous}
	case errors.As(err, &wh):
		return agentError{http.StatusBadRequest, codeAmbiguous, wh.Error(), hintAmbiguous}
	case errors.As(err, &ex):
		return agentError{http.StatusTooManyRequests, "budget_exceeded", ex.Error(),
			"Retry after the time in the Retry-After header, when the budget's window resets, or ask the operator for a larger budget."}
	case errors.As(err, &un):
		return agentError{http.StatusServiceUnavailable, "budget_unavailable",
			fmt.Sprintf("the store of budget %q could not be reached and the budget fails closed; the request was not sent", un.Budget),
			"This is a problem on the broker's side. Retrying later may work."}
	case errors.As(err, &ar):
		return agentError{ar.status, ar.code, ar.reason, ar.hint}
	case errors.As(err, &big):
		return agentError{http.StatusRequestEntityTooLarge, "body_too_large", big.Error(),
			"Send a smaller body, or ask the operator to raise policy.max_body_bytes."}
	case errors.As(err, &d):
		return agentError{http.StatusForbidden, "denied", d.reason,
			hintDenied}
	case errors.As(err, &br):
		return agentError{http.StatusBadRequest, "bad_request", br.reason, "Check the request's URL and headers."}
	case errors.Is(err, inject.ErrNotBound):
		return agentError{http.StatusForbidden, "denied", "the policy granted a credential that may not be sent to this host", hintDenied}
	case errors.Is(err, identity.ErrUnauthenticated):
		return agentError{http.StatusProxyAuthRequired, "proxy_auth_required", "missing or invalid proxy credentials",
			"Use the proxy URL you were given: HTTPS_PROXY=http://AGENT_ID:TOKEN@broker:port."}
	case errors.Is(err, policy.ErrEvaluation):
		return agentError{http.StatusServiceUnavailable, "policy_error", "the broker could not evaluate its policy; the request was not sent",
			"This is a problem on the broker's side. Retrying later may work."}
	case errors.Is(err, credentials.ErrUnavailable):
		return agentError{http.StatusServiceUnavailable, "credential_unavailable", "a credential this request needs is unavailable; the request was not sent",
			"This is a problem on the broker's side. Retrying later may work."}
	case errors.Is(err, certs.ErrUnavailable):
		return agentError{http.StatusServiceUnavailable, codeCAUnavailable,
			"the broker cannot issue certificates for intercepted connections now (its CA could not be renewed); the connection was not opened",
			"This is a problem on the broker's side. Retrying later may work."}
	case errors.Is(err, errInternal):
		return agentError{http.StatusBadGateway, "internal_error", "the broker failed while handling this request; it was not sent",
			"This is a problem on the broker's side; the details are in its log."}
	case errors.Is(err, errTooMany):
		return agentError{http.StatusTooManyRequests, "too_many_connections", "this agent has too many open connections through the broker",
			"Close idle connections or wait for running requests to finish, then retry."}
	case errors.Is(err, budget.ErrRateCapped):
		return agentError{http.StatusTooManyRequests, "too_many_requests", err.Error(), "Slow down, then retry."}
	case errors.Is(err, budget.ErrCapsUnusable):
		return agentError{http.StatusServiceUnavailable, "fleet_store_unavailable", "the broker could not reach the fleet's shared store to count this request; it was not sent",
			"This is a problem on the broker's side. Retrying later may work."}
	case errors.Is(err, errTooManyRequests):
		return agentError{http.StatusTooManyRequests, "too_many_requests", "this agent has too many requests in flight through the broker",
			"Wait for running requests to finish, then retry."}
	case errors.Is(err, errOtherAgent):
		return agentError{http.StatusBadRequest, "bad_request", "this connection already carries another agent's requests",
			"Open a new connection for each agent identity."}
	case errors.Is(err, errUnscrubbable):
		return agentError{http.StatusBadGateway, "upstream_error", "the upstream's response could not be checked for secrets, so it was not passed on",
			"Ask for the response whole and without compression (no Range, no Accept-Encoding other than gzip); the details are in the broker's audit log."}
	case errors.Is(err, errBadRequest):
		return agentError{http.StatusBadRequest, "bad_request", "the request could not be processed",
			"Check the request's host, URL and headers."}
	case errors.As(err, &pr):
		return agentError{http.StatusBadGateway, "upstream_proxy_refused",
			fmt.Sprintf("the network's upstream proxy %q refused the request: %d %s", pr.Proxy, pr.Status, pr.Reason),
			"The corporate proxy the broker goes through refused this destination or the broker's login; ask the operator or the proxy team."}
	case errors.Is(err, upstream.ErrPACRefused):
		return agentError{http.StatusBadGateway, "upstream_error", "the network's PAC file gave no usable way out for this destination, and the operator's fallback is to refuse",
			"This is a problem in the broker's proxy configuration (upstream.proxy.pac); the details are in the broker's audit log."}
	case errors.Is(err, upstream.ErrProxyUnreachable):
		return agentError{http.StatusBadGateway, "upstream_error", "no upstream proxy of the broker's network could be reached; the request was not sent",
			"This is a problem on the broker's side or the network's proxy. Retrying later may work."}
	case errors.Is(err, upstream.ErrOwnService):
		return agentError{http.StatusForbidden, "denied", reasonOwnService, hintDenied}
	case errors.Is(err, errUpstreamTimeout) || errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return agentError{http.StatusGatewayTimeout, "upstream_error", "the upstream server did not answer in time",
			"The upstream may be slow or down. Retrying later may work."}
	case errors.Is(err, context.Canceled):
		// The request's context ended: the agent went away (an HTTP/2 stream reset, a closed
		// connection) or the broker was draining. No upstream failed; the audit event says so.
		return agentError{http.StatusBadGateway, "upstream_error", "the request was cancelled before the upstream answered: the agent went away, or the broker was shutting down",
			"Retry the request if it was not cancelled on purpose."}
	default:
		return agentError{http.StatusBadGateway, "upstream_error", "the upstream server could not be reached or failed TLS verification",
			"The upstream may be down, or its certificate is not trusted. The details are in the broker's audit log."}
	}
}

// upstreamFailure is the error recorded for a request the upstream failed: err itself when it
// is one whose text the broker composed (a dial, TLS or timeout failure, a closed connection),
// else a fixed text. A parser's error quotes the bytes it choked on, and an upstream can put a
// secret it was sent into a malformed header line: that text is never stored. The audit
// event's error is scrubbed as well (exchange.finish); this makes the parser's words go too.
func upstreamFailure(addr string, err error) error {
	var (
		ne  net.Error
		ve  *tls.CertificateVerificationError
		rec tls.RecordHeaderError
		ae  *tls.AlertError
	)
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded), errors.Is(err, errBadSwitch),
		errors.Is(err, upstream.ErrForbiddenDestination), errors.Is(err, upstream.ErrProxyRefused),
		errors.Is(err, upstream.ErrProxyUnreachable), errors.Is(err, upstream.ErrPACRefused),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.As(err, &ne), errors.As(err, &ve), errors.As(err, &rec), errors.As(err, &ae):
		return fmt.Errorf("upstream %s: %w", addr, err)
	}
	return fmt.Errorf("upstream %s: %w", addr, errMalformedResponse)
}

// errMalformedResponse stands for a parser's error about an upstream's response (see
// upstreamFailure).
var errMalformedResponse = errors.New("malformed or unexpected response (the parser's message is not recorded: it may quote the upstream's bytes)")

func isTimeout(err error) bool {
	ne, ok := errors.AsType[net.Error](err)
	return ok && ne.Timeout()
}

// errorBody is the JSON the agent gets on any refusal (CONTRACT §5).
type errorBody struct {
	Error     string `json:"error"`
	Reason    string `json:"reason"`
	RequestID string `json:"request_id"`
	Agent     string `json:"agent"`
	Host      string `json:"host"`
	Hint      string `json:"hint"`
}

// apiError is the object an API SDK reads its error message from: OpenAI's {"error": {...}}
// and Anthropic's {"type": "error", "error": {...}}. code is the broker's error code.
type apiError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
	Code    string `json:"code"`
}

// openAIBody is a refusal of an OpenAI-style API call: the SDK prints error.message. The
// broker's other fields stay at the top level, where the SDK does not look.
type openAIBody struct {
	Error     apiError `json:"error"`
	Reason    string   `json:"reason"`
	RequestID string   `json:"request_id"`
	Agent     string   `json:"agent"`
	Host      string   `json:"host"`
	Hint      string   `json:"hint"`
}

// anthropicBody is a refusal of an Anthropic-style API call.
type anthropicBody struct {
	Type string `json:"type"` // always "error"
	openAIBody
}

// errorShape is the form of a refusal's body: the one the agent's client reads.
type errorShape int

const (
	shapeBroker    errorShape = iota // CONTRACT §5 JSON
	shapeOpenAI                      // OpenAI-compatible API paths and hosts
	shapeAnthropic                   // Anthropic's API
	shapeGit                         // git's smart HTTP: text/plain, printed as "remote: ..."
	shapeJSONRPC                     // a configured MCP or JSON-RPC endpoint: a JSON-RPC error
)

// jsonRPCBody is a refusal of a request to an MCP server or JSON-RPC endpoint: a JSON-RPC 2.0
// error response, its message the one line an SDK prints, the broker's fields in its data. Its
// id is the refused request's (rpcRequests), or null when the body's ids are not known or not
// trusted.
type jsonRPCBody struct {
	JSONRPC string          `json:"jsonrpc"` // always "2.0"
	ID      json.RawMessage `json:"id"`      // nil: null
	Error   struct {
		Code    int       `json:"code"`
		Message string    `json:"message"`
		Data    errorBody `json:"data"`
	} `json:"error"`
}

// jsonRPCCode is the JSON-RPC error code of a refusal with this status: a request the broker
// will not read is an invalid request (-32600), any other refusal a server error (-32000).
func jsonRPCCode(status int) int {
	if status == http.StatusBadRequest {
		return -32600
	}
	return -32000
}

// jsonRPCError is the JSON-RPC error response to the request with this id refused with ae.
func jsonRPCError(id json.RawMessage, ae agentError, eb errorBody) jsonRPCBody {
	jb := jsonRPCBody{JSONRPC: "2.0", ID: id}
	jb.Error.Code, jb.Error.Message, jb.Error.Data = jsonRPCCode(ae.status), apiMessage(ae), eb
	return jb
}

// openAIResources are the first path segments after /v1/ of OpenAI's API (and of the many
// servers that copy it: vLLM, Ollama, LiteLLM, OpenRouter...).
var openAIResources = map[string]bool{
	"chat": true, "completions": true, "responses": true, "embeddings": true, "models": true,
	"moderations": true, "images": true, "audio": true, "files": true, "uploads": true,
	"batches": true, "assistants": true, "threads": true, "vector_stores": true,
	"fine_tuning": true, "realtime": true, "conversations": true,
}

// shapeFor picks the body shape for a refusal of req, whose destination host is host ("" when
// not known yet). A CONNECT's body is read by no client: it keeps the broker's JSON.
func shapeFor(req *http.Request, host string) errorShape {
	if req == nil || req.Method == http.MethodConnect || req.URL == nil {
		return shapeBroker
	}
	if host == "" {
		host = req.URL.Hostname()
	}
	if host == "" {
		host, _, _ = strings.Cut(req.Host, ":")
	}
	host = strings.ToLower(host)
	p := strings.ToLower(req.URL.Path)
	switch {
	case strings.HasSuffix(p, "/info/refs"), strings.HasSuffix(p, "/git-upload-pack"), strings.HasSuffix(p, "/git-receive-pack"):
		return shapeGit
	case host == "api.anthropic.com":
		return shapeAnthropic
	case host == "api.openai.com", strings.HasSuffix(host, ".openai.azure.com"):
		return shapeOpenAI
	case strings.HasSuffix(p, "/v1/messages"), strings.Contains(p, "/v1/messages/"), strings.HasSuffix(p, "/v1/complete"),
		strings.Contains(p, "/anthropic/"):
		return shapeAnthropic
	case strings.Contains(p, "/chat/completions"):
		return shapeOpenAI
	}
	if _, rest, ok := strings.Cut(p, "/v1/"); ok {
		seg, _, _ := strings.Cut(rest, "/")
		if openAIResources[seg] {
			return shapeOpenAI
		}
	}
	return shapeBroker
}

// apiErrorType is the error type an API SDK is given for a refusal with this status, in the
// vocabulary Anthropic's API uses (OpenAI's SDK does not read it).
func apiErrorType(status int) string {
	switch {
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusProxyAuthRequired:
		return "authentication_error"
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status < 500:
		return "invalid_request_error"
	default:
		return "api_error"
	}
}

// apiMessage is the one line an SDK prints for a refusal: who refused, why, what to do.
func apiMessage(ae agentError) string {
	return "capbroker " + ae.code + ": " + strings.TrimSuffix(ae.reason, ".") + ". " + ae.hint
}

// errorContent renders a refusal's body in shape.
func errorContent(shape errorShape, ae agentError, eb errorBody) (contentType string, body []byte) {
	switch shape {
	case shapeGit:
		// git prints each line of a text/plain error body as "remote: <line>".
		text := "capbroker " + ae.code + ": " + ae.reason + "\n" + ae.hint + "\n" +
			"request_id: " + eb.RequestID + " agent: " + eb.Agent + " host: " + eb.Host + "\n"
		return "text/plain; charset=utf-8", []byte(text)
	case shapeJSONRPC:
		body, _ = json.Marshal(jsonRPCError(nil, ae, eb))
	case shapeOpenAI, shapeAnthropic:
		ob := openAIBody{apiError{apiErrorType(ae.status), apiMessage(ae), ae.code}, eb.Reason, eb.RequestID, eb.Agent, eb.Host, eb.Hint}
		if shape == shapeOpenAI {
			body, _ = json.Marshal(ob)
		} else {
			body, _ = json.Marshal(anthropicBody{"error", ob})
		}
	default:
		body, _ = json.Marshal(eb)
	}
	return "application/json", append(body, '\n')
}

// maxStatusReason bounds the reason put in a CONNECT refusal's status line.
const maxStatusReason = 160

// statusReason makes text a safe HTTP reason-phrase: printable ASCII only (anything else, a
// CR or LF included, becomes '?'), spaces collapsed, at most maxStatusReason bytes.
func statusReason(text string) string {
	var b strings.Builder
	space := false
	for _, r := range text {
		switch {
		case r == ' ' || r == '\t':
			space = true
			continue
		case r < 0x21 || r > 0x7e:
			r = '?'
		}
		if space && b.Len() > 0 {
			b.WriteByte(' ')
		}
		space = false
		b.WriteRune(r)
	}
	s := b.String()
	if len(s) > maxStatusReason {
		s = s[:maxStatusReason-3] + "..."
	}
	return s
}

// errorResponse builds the response for a refused request, its body in the shape the agent's
// client reads (shapeFor). A refused CONNECT carries "<code>: <reason>" in its status line:
// the body of a CONNECT response is shown by no client, the status line by several (Python,
// Go, curl -v). The 407 challenge keeps the standard words.
func errorResponse(req *http.Request, ae agentError, requestID, agent, host string) *http.Response {
	return shapedErrorResponse(req, shapeFor(req, host), ae, requestID, agent, host)
}

// shapedErrorResponse is errorResponse with its body in shape.
func shapedErrorResponse(req *http.Request, shape errorShape, ae agentError, requestID, agent, host string) *http.Response {
	eb := errorBody{ae.code, ae.reason, requestID, agent, host, ae.hint}
	ctype, b := errorContent(shape, ae, eb)
	status := strconv.Itoa(ae.status) + " " + http.StatusText(ae.status)
	if ae.status != http.StatusProxyAuthRequired && req != nil && req.Method == http.MethodConnect {
		status = strconv.Itoa(ae.status) + " " + statusReason(ae.code+": "+ae.reason)
	}
	return refusalResponse(req, ae, status, ae.status, ctype, b, requestID)
}

// rpcRefusal is the refusal of a JSON-RPC body carrying requests with these ids: an HTTP 200
// whose body is a JSON-RPC error response to each (an array for a batch), the answer an MCP or
// JSON-RPC client settles the call with. The SDK's error is then the broker's reason (error
// message, the broker's fields in error.data) where a 4xx would be a transport error. The
// audit event keeps the refusal's status.
func rpcRefusal(req *http.Request, ae agentError, ids []json.RawMessage, batch bool, requestID, agent, host string) *http.Response {
	eb := errorBody{ae.code, ae.reason, requestID, agent, host, ae.hint}
	var b []byte
	if batch {
		l := make([]jsonRPCBody, len(ids))
		for i, id := range ids {
			l[i] = jsonRPCError(id, ae, eb)
		}
		b, _ = json.Marshal(l)
	} else {
		b, _ = json.Marshal(jsonRPCError(ids[0], ae, eb))
	}
	return refusalResponse(req, ae, "200 OK", http.StatusOK, "application/json", append(b, '\n'), requestID)
}

// refusalResponse is the response of a refusal with ae, its status line status (code
// statusCode) and its body b.
func refusalResponse(req *http.Request, ae agentError, status string, statusCode int, ctype string, b []byte, requestID string) *http.Response {
	h := http.Header{}
	h.Set("Content-Type", ctype)
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("X-Broker-Request-Id", requestID)
	h.Set("Cache-Control", "no-store")
	if ae.status == http.StatusProxyAuthRequired {
		h.Set("Proxy-Authenticate", `Basic realm="broker"`)
	}
	return &http.Response{
		Status:        status,
		StatusCode:    statusCode,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          io.NopCloser(bytes.NewReader(b)),
		ContentLength: int64(len(b)),
		Request:       req,
		// A refusal of the agent's request closes its HTTP/1.x connection: it is not kept (and
		// its slot held) for the idle timeout on behalf of an agent just turned away.
		Close: ae.status < 500,
	}
}

// busyRejection answers a connection the broker cannot hold (see admission).
var busyRejection = func() []byte {
	body := `{"error":"too_many_connections","reason":"the broker holds as many connections as it may, from this address or in total; the connection is closed","hint":"Close idle connections or wait for running requests to finish, then retry."}` + "\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nRetry-After: 1\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

// framingRejection is written by the wire guard when an agent's message framing is ambiguous.
var framingRejection = func() []byte {
	body := `{"error":"bad_request","reason":"malformed or ambiguous HTTP/1.1 framing; the connection is closed","hint":"Send one Content-Length or Transfer-Encoding: chunked, CRLF line endings, no folded headers."}` + "\n"
	return []byte("HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()
