package policy

// Phases of a decision.
const (
	PhaseConnect = "connect"
	PhaseRequest = "request"
)

// Input is the policy input (CONTRACT §4).
type Input struct {
	Phase       string
	AgentID     string
	Labels      map[string]string
	SourceIP    string
	Method      string
	Scheme      string
	Host        string
	Port        int
	Path        string
	Query       map[string][]string
	Headers     map[string]string // lower-case names, credential-bearing headers already removed
	Body        any               // parsed JSON body, or nil
	BodySize    int64
	Credentials []string // configured credentials whose hosts match Host
}

// value builds the JSON-shaped document the policy sees as input.
func (in *Input) value() map[string]any {
	labels := make(map[string]any, len(in.Labels))
	for k, v := range in.Labels {
		labels[k] = v
	}
	creds := make([]any, len(in.Credentials))
	for i, c := range in.Credentials {
		creds[i] = c
	}
	req := map[string]any{"method": in.Method, "host": in.Host, "port": in.Port}
	if in.Phase == PhaseRequest {
		query := make(map[string]any, len(in.Query))
		for k, vs := range in.Query {
			l := make([]any, len(vs))
			for i, v := range vs {
				l[i] = v
			}
			query[k] = l
		}
		headers := make(map[string]any, len(in.Headers))
		for k, v := range in.Headers {
			headers[k] = v
		}
		req["scheme"] = in.Scheme
		req["path"] = in.Path
		req["query"] = query
		req["headers"] = headers
		req["body"] = in.Body
		req["body_size"] = in.BodySize
	}
	return map[string]any{
		"phase":       in.Phase,
		"agent":       map[string]any{"id": in.AgentID, "labels": labels},
		"source":      map[string]any{"ip": in.SourceIP},
		"request":     req,
		"credentials": creds,
	}
}

// Document returns the input as the policy sees it, for the audit log (audit.include_input).
func (in *Input) Document() map[string]any { return in.value() }
