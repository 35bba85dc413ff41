package broker

import (
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

	"github.com/capbroker/capbroker/broker/identity"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/upstream"
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

// denial is a deny whose reason the agent may read.
type denial struct{ reason string }

func (d denial) Error() string        { return "denied: " + d.reason }
func (d denial) Is(target error) bool { return target == errDenied }

// agentError is what the agent is told: the code, the status, a reason and a hint. Internal
// error text never reaches it; it is logged in the audit event instead.
type agentError struct {
	status int
	code   string
	reason string
	hint   string
}

const hintDenied = "This request is not allowed by the broker's policy. Do not retry it; ask the operator if it should be allowed."

// classify maps an error to what the agent sees. It is the only place that does.
func classify(err error) agentError {
	var d denial
	var br badRequest // path.go: a bad request whose reason the agent may read
	var big bodyTooLarge
	switch {
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
	case errors.Is(err, errInternal):
		return agentError{http.StatusBadGateway, "internal_error", "the broker failed while handling this request; it was not sent",
			"This is a problem on the broker's side; the details are in its log."}
	case errors.Is(err, errTooMany):
		return agentError{http.StatusTooManyRequests, "too_many_connections", "this agent has too many open connections through the broker",
			"Close idle connections or wait for running requests to finish, then retry."}
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
	case errors.Is(err, errUpstreamTimeout) || errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return agentError{http.StatusGatewayTimeout, "upstream_error", "the upstream server did not answer in time",
			"The upstream may be slow or down. Retrying later may work."}
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
		errors.Is(err, upstream.ErrForbiddenDestination),
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
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
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

// errorResponse builds the response for a refused request.
func errorResponse(req *http.Request, ae agentError, requestID, agent, host string) *http.Response {
	b, _ := json.Marshal(errorBody{ae.code, ae.reason, requestID, agent, host, ae.hint})
	b = append(b, '\n')
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	h.Set("X-Broker-Request-Id", requestID)
	h.Set("Cache-Control", "no-store")
	if ae.status == http.StatusProxyAuthRequired {
		h.Set("Proxy-Authenticate", `Basic realm="broker"`)
	}
	return &http.Response{
		Status:        strconv.Itoa(ae.status) + " " + http.StatusText(ae.status),
		StatusCode:    ae.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          io.NopCloser(strings.NewReader(string(b))),
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
