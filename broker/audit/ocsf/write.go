package ocsf

import (
	"math"
	"strconv"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// The events are written by hand, each type's fields in the order and with the omissions its
// json tags give: reflection made json.Marshal most of an event's cost. TestWriteMatchesTags
// holds the two to the same output.

// w appends one JSON value to b.
type w struct {
	b     []byte
	comma bool // a member or element was written at this level
}

func (w *w) key(k string) {
	if w.comma {
		w.b = append(w.b, ',')
	}
	w.b = append(w.b, '"')
	w.b = append(w.b, k...) // the keys are the encoder's own: plain ASCII names
	w.b = append(w.b, '"', ':')
	w.comma = true
}

// quote writes s as a JSON string; bytes that are not UTF-8 become U+FFFD.
func (w *w) quote(s string) { w.b, _ = jsontext.AppendQuote(w.b, s) }

func (w *w) str(k, v string) {
	w.key(k)
	w.quote(v)
}

func (w *w) strOmit(k, v string) {
	if v != "" {
		w.str(k, v)
	}
}

func (w *w) int(k string, v int64) {
	w.key(k)
	w.b = strconv.AppendInt(w.b, v, 10)
}

func (w *w) intOmit(k string, v int64) {
	if v != 0 {
		w.int(k, v)
	}
}

func (w *w) boolOmit(k string, v bool) {
	if v {
		w.bool(k, v)
	}
}

func (w *w) bool(k string, v bool) {
	w.key(k)
	w.b = strconv.AppendBool(w.b, v)
}

// float writes v as JSON does; a value JSON cannot hold (NaN, an infinity) as null.
func (w *w) float(k string, v float64) {
	w.key(k)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		w.b = append(w.b, "null"...)
		return
	}
	w.b = jsonFloat(w.b, v)
}

// jsonFloat formats v as ECMAScript does, as json v2 does.
func jsonFloat(b []byte, v float64) []byte {
	format := byte('f')
	if abs := math.Abs(v); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, v, format, -1, 64)
	if format == 'e' { // clean up e-09 to e-9
		n := len(b)
		if n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

func (w *w) strs(k string, v []string) {
	w.key(k)
	w.b = append(w.b, '[')
	for i, s := range v {
		if i > 0 {
			w.b = append(w.b, ',')
		}
		w.quote(s)
	}
	w.b = append(w.b, ']')
}

func (w *w) strsOmit(k string, v []string) {
	if len(v) > 0 {
		w.strs(k, v)
	}
}

// open begins the object at k ("" for a value without a key: the line, an array element).
func (w *w) open(k string) {
	if k != "" {
		w.key(k)
	} else if w.comma {
		w.b = append(w.b, ',')
	}
	w.b = append(w.b, '{')
	w.comma = false
}

func (w *w) close() {
	w.b = append(w.b, '}')
	w.comma = true
}

func (w *w) openArray(k string) {
	w.key(k)
	w.b = append(w.b, '[')
	w.comma = false
}

func (w *w) closeArray() {
	w.b = append(w.b, ']')
	w.comma = true
}

// any writes v with json (the policy input: a map of what JSON decoding gives), or null.
func (w *w) any(k string, v any) {
	w.key(k)
	b, err := json.Marshal(v, marshalOptions)
	if err != nil {
		b = []byte("null")
	}
	w.b = append(w.b, b...)
}

var marshalOptions = json.JoinOptions(json.Deterministic(true), jsontext.AllowInvalidUTF8(true))

func (ev *event) write(w *w) {
	w.open("")
	w.int("activity_id", int64(ev.ActivityID))
	w.strOmit("activity_name", ev.ActivityName)
	w.int("category_uid", int64(ev.CategoryUID))
	w.str("category_name", ev.CategoryName)
	w.int("class_uid", int64(ev.ClassUID))
	w.str("class_name", ev.ClassName)
	w.int("type_uid", ev.TypeUID)
	w.int("time", ev.Time)
	w.intOmit("start_time", ev.StartTime)
	if ev.Duration != nil {
		w.int("duration", *ev.Duration)
	}
	w.int("severity_id", int64(ev.SeverityID))
	w.str("severity", ev.Severity)
	w.intOmit("status_id", int64(ev.StatusID))
	w.strOmit("status", ev.Status)
	w.strOmit("status_code", ev.StatusCode)
	w.strOmit("status_detail", ev.StatusDetail)
	w.strOmit("message", ev.Message)
	w.intOmit("action_id", int64(ev.ActionID))
	w.strOmit("action", ev.Action)
	w.intOmit("disposition_id", int64(ev.DispositionID))
	w.strOmit("disposition", ev.Disposition)
	w.boolOmit("is_alert", ev.IsAlert)
	w.intOmit("confidence_id", int64(ev.ConfidenceID))
	w.strOmit("confidence", ev.Confidence)
	ev.Metadata.write(w)
	ev.Actor.write(w, "actor")
	ev.SrcEndpoint.write(w, "src_endpoint")
	ev.DstEndpoint.write(w, "dst_endpoint")
	if c := ev.ConnectionInfo; c != nil {
		w.open("connection_info")
		w.int("direction_id", int64(c.DirectionID))
		w.str("direction", c.Direction)
		w.strOmit("protocol_name", c.ProtocolName)
		w.close()
	}
	if t := ev.Traffic; t != nil {
		w.open("traffic")
		w.int("bytes_in", t.BytesIn)
		w.int("bytes_out", t.BytesOut)
		w.close()
	}
	ev.HTTPRequest.write(w)
	if r := ev.HTTPResponse; r != nil {
		w.open("http_response")
		w.int("code", int64(r.Code))
		w.close()
	}
	w.intOmit("http_status", int64(ev.HTTPStatus))
	ev.Query.write(w)
	if ev.RcodeID != nil {
		w.int("rcode_id", int64(*ev.RcodeID))
	}
	w.strOmit("rcode", ev.Rcode)
	ev.API.write(w)
	if a := ev.AIModel; a != nil {
		w.open("ai_model")
		w.str("ai_provider", a.AIProvider)
		w.str("name", a.Name)
		w.close()
	}
	if m := ev.MessageContext; m != nil {
		w.open("message_context")
		m.Service.write(w)
		for _, t := range []struct {
			k string
			v *int64
		}{{"prompt_tokens", m.PromptTokens}, {"completion_tokens", m.CompletionTokens}, {"total_tokens", m.TotalTokens}} {
			if t.v != nil {
				w.int(t.k, *t.v)
			}
		}
		w.close()
	}
	writeResources(w, ev.Resources)
	if f := ev.FindingInfo; f != nil {
		w.open("finding_info")
		w.str("uid", f.UID)
		w.str("title", f.Title)
		w.strOmit("desc", f.Desc)
		w.strsOmit("types", f.Types)
		if a := f.Analytic; a != nil {
			w.open("analytic")
			w.str("name", a.Name)
			w.int("type_id", int64(a.TypeID))
			w.str("type", a.Type)
			w.strOmit("uid", a.UID)
			w.close()
		}
		w.close()
	}
	if len(ev.Evidences) > 0 {
		w.openArray("evidences")
		for i := range ev.Evidences {
			e := &ev.Evidences[i]
			w.open("")
			e.Actor.write(w, "actor")
			e.SrcEndpoint.write(w, "src_endpoint")
			e.DstEndpoint.write(w, "dst_endpoint")
			e.HTTPRequest.write(w)
			e.API.write(w)
			e.Query.write(w)
			w.close()
		}
		w.closeArray()
	}
	ev.User.write(w, "user")
	w.strsOmit("privileges", ev.Privileges)
	if t := ev.Trace; t != nil {
		w.open("trace")
		w.str("uid", t.UID)
		w.close()
	}
	switch u := ev.Unmapped.(type) {
	case *native:
		u.write(w)
	case *approvalNative:
		u.write(w)
	}
	w.close()
}

func (m *metadata) write(w *w) {
	w.open("metadata")
	w.str("version", m.Version)
	w.open("product")
	w.str("name", m.Product.Name)
	w.str("vendor_name", m.Product.VendorName)
	w.strOmit("version", m.Product.Version)
	w.close()
	w.strOmit("uid", m.UID)
	w.strOmit("correlation_uid", m.CorrelationUID)
	w.str("log_name", m.LogName)
	if m.Reporter != nil {
		w.open("reporter")
		w.str("name", m.Reporter.Name)
		w.close()
	}
	w.strsOmit("profiles", m.Profiles)
	w.close()
}

func (a *actor) write(w *w, k string) {
	if a == nil {
		return
	}
	w.open(k)
	a.User.write(w, "user")
	w.close()
}

func (u *user) write(w *w, k string) {
	if u == nil {
		return
	}
	w.open(k)
	w.strOmit("name", u.Name)
	w.strOmit("uid", u.UID)
	w.intOmit("type_id", int64(u.TypeID))
	w.strOmit("type", u.Type)
	w.close()
}

func (e *endpoint) write(w *w, k string) {
	if e == nil {
		return
	}
	w.open(k)
	w.strOmit("name", e.Name)
	w.strOmit("hostname", e.Hostname)
	w.strOmit("ip", e.IP)
	w.intOmit("port", int64(e.Port))
	w.close()
}

func (r *httpRequest) write(w *w) {
	if r == nil {
		return
	}
	w.open("http_request")
	w.strOmit("http_method", r.HTTPMethod)
	if u := r.URL; u != nil {
		w.open("url")
		w.strOmit("scheme", u.Scheme)
		w.strOmit("hostname", u.Hostname)
		w.intOmit("port", int64(u.Port))
		w.strOmit("path", u.Path)
		w.strOmit("url_string", u.URLString)
		w.close()
	}
	w.strOmit("uid", r.UID)
	w.close()
}

func (q *dnsQuery) write(w *w) {
	if q == nil {
		return
	}
	w.open("query")
	w.str("hostname", q.Hostname)
	w.strOmit("type", q.Type)
	w.strOmit("class", q.Class)
	w.close()
}

func (a *api) write(w *w) {
	if a == nil {
		return
	}
	w.open("api")
	w.str("operation", a.Operation)
	a.Service.write(w)
	if r := a.Request; r != nil {
		w.open("request")
		w.str("uid", r.UID)
		w.close()
	}
	w.close()
}

func (s *service) write(w *w) {
	if s == nil {
		return
	}
	w.open("service")
	w.strOmit("name", s.Name)
	w.close()
}

func writeResources(w *w, rs []resource) {
	if len(rs) == 0 {
		return
	}
	w.openArray("resources")
	for _, r := range rs {
		w.open("")
		w.strOmit("name", r.Name)
		w.strOmit("type", r.Type)
		w.close()
	}
	w.closeArray()
}

func (u *native) write(w *w) {
	w.open("unmapped")
	w.str("decision", u.Decision)
	w.str("phase", u.Phase)
	w.strOmit("mode", u.Mode)
	w.strOmit("policy_mode", u.PolicyMode)
	w.strOmit("policy_revision", u.PolicyRevision)
	w.strOmit("decision_id", u.DecisionID)
	w.strs("credentials", u.Credentials)
	w.boolOmit("would_deny", u.WouldDeny)
	w.strOmit("error", u.Error)
	w.strOmit("budget", u.Budget)
	w.intOmit("redacted", int64(u.Redacted))
	w.strOmit("via", u.Via)
	w.boolOmit("tls_inspected", u.TLSInspected)
	w.strOmit("trace_id", u.TraceID)
	if a := u.AWS; a != nil {
		w.open("aws")
		w.str("service", a.Service)
		w.str("operation", a.Operation)
		w.close()
	}
	if g := u.GraphQL; g != nil {
		w.open("graphql")
		w.str("type", g.Type)
		w.str("name", g.Name)
		w.close()
	}
	if m := u.MCP; m != nil {
		w.open("mcp")
		w.str("method", m.Method)
		w.str("tool", m.Tool)
		if len(m.Batch) > 0 {
			w.openArray("batch")
			for _, c := range m.Batch {
				w.open("")
				w.str("method", c.Method)
				w.str("tool", c.Tool)
				w.close()
			}
			w.closeArray()
		}
		w.close()
	}
	if j := u.JSONRPC; j != nil {
		w.open("jsonrpc")
		w.str("method", j.Method)
		w.strsOmit("batch", j.Batch)
		w.close()
	}
	if l := u.LLM; l != nil {
		w.open("llm")
		w.str("provider", l.Provider)
		w.str("model", l.Model)
		w.int("tokens_in", l.TokensIn)
		w.int("tokens_out", l.TokensOut)
		w.int("tokens_cached", l.TokensCached)
		w.float("cost", l.Cost)
		w.bool("usage_reported", l.UsageReported)
		w.boolOmit("usage_estimated", l.UsageEstimated)
		w.close()
	}
	if x := u.SSH; x != nil {
		w.open("ssh")
		w.str("host", x.Host)
		w.int("port", int64(x.Port))
		w.str("user", x.User)
		w.str("service", x.Service)
		w.str("repository", x.Repository)
		w.openArray("refs")
		for _, r := range x.Refs {
			w.open("")
			w.str("name", r.Name)
			w.str("old", r.Old)
			w.str("new", r.New)
			w.close()
		}
		w.closeArray()
		w.close()
	}
	if p := u.Postgres; p != nil {
		w.open("postgres")
		w.str("database", p.Database)
		w.str("upstream", p.Upstream)
		w.str("user", p.User)
		w.str("application_name", p.ApplicationName)
		w.bool("tls", p.TLS)
		w.strOmit("role", p.Role)
		w.strOmit("lease_id", p.LeaseID)
		if n := p.Statements; n != nil {
			w.open("statements")
			w.int("read", n.Read)
			w.int("write", n.Write)
			w.int("ddl", n.DDL)
			w.int("other", n.Other)
			w.close()
		}
		if st := p.Statement; st != nil {
			w.open("statement")
			w.str("kind", st.Kind)
			w.str("command", st.Command)
			w.strs("tables", st.Tables)
			w.strs("functions", st.Functions)
			w.str("text", st.Text)
			w.close()
		}
		w.close()
	}
	w.intOmit("bytes_in", u.BytesIn)
	w.intOmit("bytes_out", u.BytesOut)
	if a := u.Approval; a != nil {
		w.open("approval")
		w.str("id", a.ID)
		w.str("outcome", a.Outcome)
		w.str("by", a.By)
		w.str("scope", a.Scope)
		w.strOmit("comment", a.Comment)
		w.strOmit("grant", a.Grant)
		w.close()
	}
	w.strOmit("input_level", u.InputLevel)
	if len(u.Input) > 0 {
		w.any("input", u.Input)
	}
	w.close()
}

func (u *approvalNative) write(w *w) {
	w.open("unmapped")
	w.str("action", u.Action)
	w.str("id", u.ID)
	w.strOmit("request_id", u.RequestID)
	w.strOmit("scope", u.Scope)
	w.strOmit("comment", u.Comment)
	w.strOmit("expires", u.Expires)
	w.close()
}
