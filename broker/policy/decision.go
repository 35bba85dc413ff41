package policy

import (
	"slices"
	"strconv"
	"time"

	"github.com/open-policy-agent/opa/v1/rego"
)

// Decision is what the policy said about one request (CONTRACT §4).
type Decision struct {
	// ID is unique to this evaluation (a random UUID), for the audit event's decision_id.
	ID          string
	Allow       bool
	Reason      string
	Credentials []string
	// Scopes holds, by credential name, the scope a grant was narrowed to (an item
	// {"name": "gh_app", "scope": {...}}); a credential granted by its name alone has none.
	Scopes map[string]map[string]any
	// Intercept is meaningful in the connect phase only: false asks for an opaque tunnel.
	Intercept bool
	// UpstreamProxy names the upstream proxy the request leaves through ("direct": none);
	// "" leaves it to upstream.proxy (CONTRACT §8b).
	UpstreamProxy string
	// Role is, for a Postgres connection, the Vault database role its user is issued from
	// (CONTRACT §8b); "" leaves it to the upstream's default_role.
	Role string
	// ForwardTraceparent ("forward_traceparent": true) lets the request's W3C traceparent
	// (and tracestate) header go upstream; without it the broker removes them, as a header
	// can carry what the agent should not pass on (docs/observability.md).
	ForwardTraceparent bool
	// Revision identifies the policy that decided.
	Revision string
	// Ask, when set, holds the request for a person to approve (CONTRACT §8): Allow is false,
	// and Credentials are what an approval lets the request carry.
	Ask *Ask
}

// Ask is a decision's "ask": hold the request until a person approves or denies it.
type Ask struct {
	Reason string
	// Timeout is how long the request is held; 0 is the broker's approvals.timeout.
	Timeout time.Duration
	// Scopes are what an approval may cover: AskOnce, AskAgent, AskAlways (all by default).
	Scopes []string
}

// Scopes of an approval.
const (
	AskOnce   = "once"
	AskAgent  = "agent"
	AskAlways = "always"
)

// MaxAskTimeout bounds how long a request may be held.
const MaxAskTimeout = time.Hour

// Reasons given when the policy's answer cannot be used. They are shown to the agent.
const (
	ReasonUndefined = "the policy gave no decision for this request"
	ReasonMultiple  = "the policy gave more than one decision for this request"
	ReasonMalformed = "the policy's decision is malformed"
	ReasonNoAllow   = "the policy's decision does not allow this request"
	ReasonNoPolicy  = "the broker has no policy loaded yet"
)

func parseResult(rs rego.ResultSet, revision string) Decision {
	deny := func(reason string) Decision { return Decision{Reason: reason, Revision: revision} }
	switch {
	case len(rs) == 0 || len(rs[0].Expressions) == 0:
		return deny(ReasonUndefined)
	case len(rs) > 1 || len(rs[0].Expressions) > 1:
		return deny(ReasonMultiple)
	}
	return parseDecision(rs[0].Expressions[0].Value, revision)
}

// parseDecision reads the decision object. Anything that is not exactly the documented shape
// denies: allow must be the boolean true, credentials a list of strings, intercept a boolean.
func parseDecision(v any, revision string) Decision {
	d := Decision{Revision: revision, Intercept: true}
	obj, ok := v.(map[string]any)
	if !ok {
		return Decision{Reason: ReasonMalformed + ": not an object", Revision: revision}
	}
	if r, ok := obj["reason"]; ok {
		s, ok := r.(string)
		if !ok {
			return Decision{Reason: ReasonMalformed + ": reason is not a string", Revision: revision}
		}
		d.Reason = s
	}
	if c, ok := obj["credentials"]; ok {
		list, ok := c.([]any)
		if !ok {
			return Decision{Reason: ReasonMalformed + ": credentials is not a list", Revision: revision}
		}
		for _, x := range list {
			name, scope, err := parseGrant(x)
			if err == "" && slices.Contains(d.Credentials, name) {
				err = "credential " + strconv.Quote(name) + " is granted twice"
			}
			if err != "" {
				return Decision{Reason: ReasonMalformed + ": " + err, Revision: revision}
			}
			d.Credentials = append(d.Credentials, name)
			if scope != nil {
				if d.Scopes == nil {
					d.Scopes = map[string]map[string]any{}
				}
				d.Scopes[name] = scope
			}
		}
	}
	if u, ok := obj["upstream_proxy"]; ok {
		s, ok := u.(string)
		if !ok || s == "" {
			return Decision{Reason: ReasonMalformed + ": upstream_proxy is not a proxy's name", Revision: revision}
		}
		d.UpstreamProxy = s
	}
	if r, ok := obj["role"]; ok {
		s, ok := r.(string)
		if !ok || s == "" {
			return Decision{Reason: ReasonMalformed + ": role is not a role's name", Revision: revision}
		}
		d.Role = s
	}
	if f, ok := obj["forward_traceparent"]; ok {
		b, ok := f.(bool)
		if !ok {
			return Decision{Reason: ReasonMalformed + ": forward_traceparent is not a boolean", Revision: revision}
		}
		d.ForwardTraceparent = b
	}
	if i, ok := obj["intercept"]; ok {
		b, ok := i.(bool)
		if !ok {
			return Decision{Reason: ReasonMalformed + ": intercept is not a boolean", Revision: revision}
		}
		d.Intercept = b
	}
	if a, ok := obj["ask"]; ok {
		ask, err := parseAsk(a)
		if err == "" && obj["allow"] == true {
			err = "allow is true together with ask"
		}
		if err != "" {
			return Decision{Reason: ReasonMalformed + ": " + err, Revision: revision}
		}
		if _, present := obj["allow"]; !present {
			d.Ask = ask
			if d.Reason == "" {
				d.Reason = ask.Reason
			}
			return d
		}
		// allow: false with ask: the deny stands.
	}
	allow, ok := obj["allow"].(bool)
	if !ok {
		if _, present := obj["allow"]; present {
			return Decision{Reason: ReasonMalformed + ": allow is not a boolean", Revision: revision}
		}
		if d.Reason == "" {
			d.Reason = ReasonNoAllow
		}
		d.Credentials, d.Scopes = nil, nil
		return d
	}
	d.Allow = allow
	if !allow {
		d.Credentials, d.Scopes = nil, nil
		if d.Reason == "" {
			d.Reason = ReasonNoAllow
		}
	}
	return d
}

// parseGrant reads one item of a decision's credentials: a name, or an object with a name and
// an optional scope object (CONTRACT §8). It returns why the item is malformed, or "".
func parseGrant(x any) (name string, scope map[string]any, malformed string) {
	switch v := x.(type) {
	case string:
		return v, nil, ""
	case map[string]any:
		name, ok := v["name"].(string)
		if !ok {
			return "", nil, "a credentials item without a name"
		}
		for k := range v {
			if k != "name" && k != "scope" {
				return "", nil, "credentials item " + strconv.Quote(name) + " has an unknown key " + strconv.Quote(k)
			}
		}
		if s, present := v["scope"]; present {
			if scope, ok = s.(map[string]any); !ok {
				return "", nil, "the scope of credential " + strconv.Quote(name) + " is not an object"
			}
		}
		return name, scope, ""
	}
	return "", nil, "credentials must be names or {name, scope} objects"
}

// parseAsk reads a decision's ask object: {reason, timeout, scopes}, each optional. It returns
// why it is malformed, or "".
func parseAsk(v any) (*Ask, string) {
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, "ask is not an object"
	}
	a := &Ask{}
	for k, x := range obj {
		switch k {
		case "reason":
			s, ok := x.(string)
			if !ok {
				return nil, "ask.reason is not a string"
			}
			a.Reason = s
		case "timeout":
			s, ok := x.(string)
			var err error
			if ok {
				a.Timeout, err = time.ParseDuration(s)
			}
			if !ok || err != nil || a.Timeout <= 0 {
				return nil, "ask.timeout is not a positive duration such as \"2m\""
			}
			a.Timeout = min(a.Timeout, MaxAskTimeout)
		case "scopes":
			list, ok := x.([]any)
			if !ok || len(list) == 0 {
				return nil, "ask.scopes is not a non-empty list"
			}
			for _, s := range list {
				name, _ := s.(string)
				if name != AskOnce && name != AskAgent && name != AskAlways {
					return nil, "ask.scopes may hold only \"once\", \"agent\" and \"always\""
				}
				if !slices.Contains(a.Scopes, name) {
					a.Scopes = append(a.Scopes, name)
				}
			}
		default:
			return nil, "ask has an unknown key " + strconv.Quote(k)
		}
	}
	if a.Scopes == nil {
		a.Scopes = []string{AskOnce, AskAgent, AskAlways}
	}
	return a, ""
}
