package broker

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"golang.org/x/sync/semaphore"

	"github.com/capbroker/capbroker/broker/approvals"
	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/wire"
	"github.com/capbroker/capbroker/broker/wire/strictjson"
)

// The agent-facing codes of a request held for approval (CONTRACT §8).
const (
	codeDeniedByApprover    = "denied_by_approver"
	codeApprovalTimeout     = "approval_timeout"
	codeApprovalWithdrawn   = "approval_withdrawn"
	codeApprovalQueueFull   = "approval_queue_full"
	codeApprovalInterrupted = "approval_interrupted"
)

// approvalRefusal is a held request that was not approved, or one that could not be held.
type approvalRefusal struct {
	status       int
	code, reason string
	hint         string
}

func (e approvalRefusal) Error() string { return e.code + ": " + e.reason }

// refusedByApprover reports whether a code is a refusal after asking: a deny, for the audit.
func refusedByApprover(code string) bool {
	return code == codeDeniedByApprover || code == codeApprovalTimeout || code == codeApprovalWithdrawn
}

// ask holds a request whose decision asks a person (d.Ask), and returns the decision as
// approved (allow, with the credentials the decision named) or the refusal. A live grant
// answers without holding. Nothing is sent upstream while the request is held: its body is
// read whole first (up to policy.max_body_bytes), so the agent's bytes wait in the broker.
// In monitor mode the ask is recorded as would_deny by authorize, and nothing is held.
func (b *Broker) ask(x *exchange, r *http.Request, in *policy.Input, d policy.Decision, small []byte, body *policyBody) (policy.Decision, error) {
	if x.g.mode == config.ModeMonitor {
		return d, nil
	}
	q := b.approvals
	if q == nil {
		return d, denial{"the policy asks a person to approve this request, and this broker holds no requests for approval"}
	}
	method, path := in.Method, in.Path
	if g := q.Match(approvals.Target{Agent: in.AgentID, Scheme: in.Scheme, Host: in.Host, Port: in.Port, Method: method, Path: path}); g != nil {
		b.approvalsMetrics().Granted()
		x.ev.Approval = &audit.Approval{ID: g.ID, Outcome: "granted", By: g.CreatedBy, Scope: g.Kind, Comment: g.Comment, Grant: g.ID}
		return approved(d), nil
	}

	var held []byte
	if in.Phase == policy.PhaseRequest && r.Body != nil && r.Body != http.NoBody {
		var err error
		if held, err = b.holdBody(x, r, small, body); err != nil {
			return d, err
		}
		if err := showable(r.Header, held); err != nil {
			return d, err
		}
	}
	req := approvals.Request{
		RequestID: x.ev.RequestID,
		Agent:     in.AgentID,
		SourceIP:  x.ev.SourceIP,
		Phase:     in.Phase,
		Method:    method,
		Scheme:    in.Scheme,
		Host:      in.Host,
		Port:      in.Port,
		Path:      path,
		QueryKeys: queryKeys(in.Query),
		Headers:   map[string]string{},
		BodySize:  int64(len(held)),
		Reason:    d.Reason,
		Timeout:   d.Ask.Timeout,
		Scopes:    d.Ask.Scopes,
	}
	if in.Phase == policy.PhaseRequest {
		clean := x.g.secretFree(in.Host)
		for k, v := range x.g.policyHeaders(r.Header) {
			if !audit.CredentialHeader(k) {
				req.Headers[k] = clean(v)
			}
		}
		req.Path = clean(req.Path)
		req.Query = make(map[string][]string, len(in.Query))
		for k, vs := range in.Query {
			shown := make([]string, len(vs))
			for i, v := range vs {
				shown[i] = clean(v)
			}
			req.Query[clean(k)] = shown
		}
		req.Credentials = append([]string{}, d.Credentials...) // [] rather than null: none attached
		req.BodyPreview, req.BodyTruncated = preview(clean, held)
	}
	hold, stop := watchHeld(r)
	out, err := q.Hold(hold, req)
	stop()
	if err != nil {
		if errors.Is(err, approvals.ErrQueueFull) {
			return d, approvalRefusal{http.StatusTooManyRequests, codeApprovalQueueFull, err.Error(),
				"Too many requests wait for a person's approval. Wait for them to be decided, then retry."}
		}
		return d, interrupted()
	}
	x.ev.Approval = &audit.Approval{ID: out.ID, Outcome: out.State, By: out.By, Scope: out.Scope, Comment: out.Comment}
	if out.Grant != nil {
		x.ev.Approval.Grant = out.Grant.ID
	}
	switch out.State {
	case approvals.StateApproved:
		return approved(d), nil
	case approvals.StateDenied:
		reason := "a person denied this request"
		if out.Comment != "" {
			reason += ": " + out.Comment
		}
		return d, approvalRefusal{http.StatusForbidden, codeDeniedByApprover, reason,
			"Do not retry this request; ask the person who denied it if it should be allowed."}
	case approvals.StateTimeout:
		return d, approvalRefusal{http.StatusForbidden, codeApprovalTimeout, "nobody approved this request in time; it was not sent",
			"Ask the operator to approve it (the request needed a person's approval), then retry."}
	case approvals.StateWithdrawn:
		return d, approvalRefusal{http.StatusForbidden, codeApprovalWithdrawn, "the agent disconnected while the request was held for approval",
			"The request was not sent."}
	}
	return d, interrupted()
}

func interrupted() error {
	return approvalRefusal{http.StatusServiceUnavailable, codeApprovalInterrupted,
		"the broker stopped while this request was held for approval; it was not sent",
		"Retry once the broker is back; the request will be held again."}
}

func approved(d policy.Decision) policy.Decision {
	d.Allow, d.Ask = true, nil
	return d
}

func (b *Broker) approvalsMetrics() *approvals.Metrics { return b.approvals.Metrics() }

// holdBody reads the body of a held request whole, up to policy.max_body_bytes, and puts it
// back in r from memory. The bytes count against the agent's body budget; an agent over it
// is refused rather than made to wait (it already waits for a person).
func (b *Broker) holdBody(x *exchange, r *http.Request, small []byte, body *policyBody) ([]byte, error) {
	limit := x.g.maxPolicyBody
	if small != nil {
		return small, nil
	}
	if r.ContentLength > limit {
		return nil, bodyTooLarge{limit}
	}
	if body.hold == nil || body.hold.n == 0 {
		n := r.ContentLength
		if n < 0 {
			n = limit + 1
		}
		h := x.g.bodies.tryHold(x.agent.ID, n)
		if h == nil {
			return nil, approvalRefusal{http.StatusTooManyRequests, codeApprovalQueueFull,
				"this agent's requests held for approval hold as many body bytes as it may", "Wait for them to be decided, then retry."}
		}
		body.hold.release()
		body.hold = h
	}
	buf, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%w: reading the request body: %v", errBadRequest, err)
	}
	if int64(len(buf)) > limit {
		return nil, bodyTooLarge{limit}
	}
	body.hold.keep(int64(len(buf)))
	r.Body = io.NopCloser(bytes.NewReader(buf))
	r.ContentLength = int64(len(buf))
	return buf, nil
}

// secretFree returns what removes, from text shown to the person deciding, every value the
// broker knows (inject.Known: what it has sent, and what its store holds of every configured
// credential), whatever host it concerns, and their forms for host.
func (g *generation) secretFree(host string) func(string) string {
	for _, b := range g.bindings.All() {
		for _, v := range g.secrets.Known(b.Name) {
			g.known.Hold(b, v)
		}
	}
	forms := g.responseScrubber(host)
	all := redactor(g.known.Values())
	return func(text string) string { return forms.String(all.String(text)) }
}

// preview is the start of a held request's body for the person deciding, as text,
// secret-free, and whether it was cut (then it ends in "…").
func preview(clean func(string) string, body []byte) (string, bool) {
	if len(body) == 0 {
		return "", false
	}
	// The whole body is scrubbed, then cut: a secret across the cut is not half shown.
	text := clean(string(body))
	cut := false
	if len(text) > approvals.BodyPreviewMax {
		n := approvals.BodyPreviewMax
		for n > 0 && !utf8.RuneStart(text[n]) {
			n--
		}
		text, cut = text[:n]+"…", true
	}
	if !utf8.ValidString(text) || strings.ContainsRune(text, 0) {
		return fmt.Sprintf("[binary body, %d bytes]", len(body)), true
	}
	return text, cut
}

// showable refuses to hold a body a person cannot be shown as the upstream will read it. A
// body read as JSON (labelled so, or a JSON object or array whatever its label) is refused
// when two of its members may be read as one by a server (strictjson: duplicates, letter case
// or folding): the preview shows the first 2 KiB, and a second member after it would be
// approved unseen, and even in plain sight nobody can tell which one a server keeps. One that
// is not valid JSON is refused when it is longer than the preview: a lenient server may read
// past what the strict reader could check. A body labelled JSON and sent encoded
// (Content-Encoding: gzip...) is refused too: the server decodes it, the preview cannot.
func showable(h http.Header, body []byte) error {
	labelled := isJSON(h.Get("Content-Type"))
	if labelled && wire.CheckBodyEncoding(h) != nil {
		return badRequest{"the request is held for a person's approval, and its JSON body is sent with a Content-Encoding the person cannot be shown: send it unencoded"}
	}
	if !labelled && !looksLikeJSON(body) {
		return nil
	}
	err := strictjson.Check(bytes.TrimPrefix(body, utf8BOM))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, strictjson.ErrAmbiguous):
		return err // 400 ambiguous_request (classify)
	case len(body) > approvals.BodyPreviewMax:
		return badRequest{"the request is held for a person's approval, and its body reads as JSON but is not valid JSON and is longer than the preview a person is shown: send valid JSON"}
	}
	return nil // shown whole, as text
}

var utf8BOM = []byte("\xef\xbb\xbf")

// looksLikeJSON reports whether a body starts, after white space or a byte order mark, like a
// JSON object or array.
func looksLikeJSON(b []byte) bool {
	b = bytes.TrimLeft(bytes.TrimPrefix(b, utf8BOM), " \t\r\n")
	return len(b) > 0 && (b[0] == '{' || b[0] == '[')
}

func queryKeys(q map[string][]string) []string {
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// tryHold is hold without waiting: nil when agent may not hold n more bytes now.
func (b *bodyBudget) tryHold(agent string, n int64) *bodyHold {
	b.mu.Lock()
	s, ok := b.agents[agent]
	if !ok {
		s = semaphore.NewWeighted(b.perAgent)
		b.agents[agent] = s
	}
	b.mu.Unlock()
	if !s.TryAcquire(n) {
		return nil
	}
	return &bodyHold{s: s, n: n}
}
