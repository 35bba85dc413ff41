package ocsf

import (
	"github.com/capbroker/capbroker/broker/audit"
)

// Decision appends a decision's activity event and, when it calls for one, its findings.
func (c *Encoder) Decision(dst []byte, e *audit.Event, m audit.Meta) []byte {
	var ev event
	c.activity(&ev, e, m)
	dst = appendLine(dst, &ev)
	for _, f := range findingsOf(e) {
		ev = event{}
		c.finding(&ev, e, m, f)
		dst = appendLine(dst, &ev)
	}
	return dst
}

// activity fills the activity event of a decision.
func (c *Encoder) activity(ev *event, e *audit.Event, m audit.Meta) {
	class, activity, activityName := classOf(e)
	ev.SeverityID = sevInformational
	if e.Decision == audit.Deny {
		ev.SeverityID = sevLow
	}
	c.base(ev, class, activity, activityName, m, e.RequestID)
	ev.Metadata.UID = e.RequestID
	if !e.Start.IsZero() {
		ev.StartTime = ms(e.Start)
		d := m.Duration.Milliseconds()
		ev.Duration = &d
	}
	ev.Message = message(e)
	ev.StatusID, ev.Status = 1, "Success"
	if e.Decision != audit.Allow {
		ev.StatusID, ev.Status = 2, "Failure"
	}
	if e.Status > 0 {
		ev.StatusCode = itoa(e.Status)
	}
	ev.StatusDetail = e.Reason
	switch {
	case e.Decision == audit.Allow:
		ev.ActionID, ev.Action, ev.DispositionID, ev.Disposition = 1, "Allowed", 1, "Allowed"
	case failed(e): // not a refusal: nothing to say of what the policy decided
		ev.DispositionID, ev.Disposition = 27, "Error"
	case e.Decision == audit.Challenge:
		ev.ActionID, ev.Action, ev.DispositionID, ev.Disposition = 2, "Denied", 23, "Challenge"
	default:
		ev.ActionID, ev.Action, ev.DispositionID, ev.Disposition = 2, "Denied", 2, "Blocked"
	}
	ev.Actor = agentActor(e.Agent)
	ev.SrcEndpoint = sourceEndpoint(e.SourceIP)
	u := unmappedOf(e, m)
	switch class {
	case classDNSActivity:
		ev.Query = &dnsQuery{Hostname: e.Host, Type: e.Method, Class: "IN"}
		rcode, name := 0, "NoError"
		if e.Decision != audit.Allow {
			rcode, name = 5, "Refused"
		}
		ev.RcodeID, ev.Rcode = &rcode, name
	case classNetworkActivity:
		ev.DstEndpoint = hostEndpoint(e.Host, e.Port)
		proto := "tcp"
		if e.Scheme == "tcp" || e.Scheme == "udp" { // a refused flow names its protocol
			proto = e.Scheme
		}
		ev.ConnectionInfo = &connectionInfo{DirectionID: 2, Direction: "Outbound", ProtocolName: proto}
		ev.Traffic = trafficOf(e)
	case classHTTPActivity:
		ev.DstEndpoint = hostEndpoint(e.Host, e.Port)
		ev.HTTPRequest = httpRequestOf(e)
		if e.Status > 0 {
			ev.HTTPResponse = &httpResponse{Code: e.Status}
			ev.HTTPStatus = e.Status
		}
		ev.Traffic = trafficOf(e)
	case classAPIActivity:
		if ev.Actor == nil { // required: a call no agent was identified for
			ev.Actor = &actor{User: &user{Name: "unidentified"}}
		}
		if ev.SrcEndpoint == nil {
			ev.SrcEndpoint = &endpoint{Name: "unknown"}
		}
		ev.DstEndpoint = hostEndpoint(e.Host, e.Port)
		if e.Postgres != nil { // a Postgres connection or statement: no HTTP under it
			ev.API = postgresAPI(e)
			ev.Resources = postgresResources(e.Postgres)
			break
		}
		if e.SSH != nil { // a git session: no HTTP under it
			ev.API = sshAPI(e)
			if e.SSH.Repository != "" {
				ev.Resources = []resource{{Name: e.SSH.Repository, Type: "git_repository"}}
			}
			break
		}
		ev.HTTPRequest = httpRequestOf(e)
		if e.Status > 0 {
			ev.HTTPResponse = &httpResponse{Code: e.Status}
		}
		ev.API = apiOf(e)
		if e.MCP != nil && e.MCP.Tool != "" {
			ev.Resources = []resource{{Name: e.MCP.Tool, Type: "mcp_tool"}}
		}
		if l := e.LLM; l != nil {
			ev.AIModel = &aiModel{AIProvider: l.Provider, Name: l.Model}
			mc := &messageContext{Service: &service{Name: l.Provider}}
			if l.Reported {
				in, out, total := l.TokensIn, l.TokensOut, l.TokensIn+l.TokensOut
				mc.PromptTokens, mc.CompletionTokens, mc.TotalTokens = &in, &out, &total
			}
			ev.MessageContext = mc
		}
	}
	if e.TraceID != "" {
		if class == classHTTPActivity || class == classAPIActivity {
			ev.Trace = &trace{UID: e.TraceID}
		} else {
			u.TraceID = e.TraceID
		}
	}
	ev.Metadata.Profiles = profilesOf(ev)
	ev.Unmapped = u
}

// classOf is the class and activity of a decision's event.
func classOf(e *audit.Event) (class, activity int, name string) {
	switch {
	case e.Phase == "dns":
		return classDNSActivity, 1, "Query"
	case e.Phase == "request" && (e.LLM != nil || e.MCP != nil || e.JSONRPC != nil):
		switch {
		case e.LLM != nil:
			return classAPIActivity, 99, "LLM Call"
		case e.MCP != nil:
			return classAPIActivity, 99, "MCP Call"
		}
		return classAPIActivity, 99, "JSON-RPC Call"
	case e.Phase == "request":
		if id, ok := httpActivities[e.Method]; ok {
			return classHTTPActivity, id, httpActivityNames[id]
		}
		return classHTTPActivity, 99, e.Method
	case e.Postgres != nil:
		return postgresActivity(e.Postgres)
	case e.SSH != nil: // a git command over SSH: a fetch reads the repository, a push updates it
		switch e.SSH.Service {
		case "fetch", "archive":
			return classAPIActivity, 2, "Read"
		case "push":
			return classAPIActivity, 3, "Update"
		}
		return classAPIActivity, 99, "Other" // a shell, a subsystem, a command git never runs
	}
	// connect, a refused flow, an SSH connection refused before any command, and the phases
	// of other protocols
	if e.Decision == audit.Allow {
		return classNetworkActivity, 1, "Open"
	}
	return classNetworkActivity, 5, "Refuse"
}

var httpActivities = map[string]int{
	"CONNECT": 1, "DELETE": 2, "GET": 3, "HEAD": 4, "OPTIONS": 5, "POST": 6, "PUT": 7, "TRACE": 8, "PATCH": 9,
}

var httpActivityNames = map[int]string{
	1: "Connect", 2: "Delete", 3: "Get", 4: "Head", 5: "Options", 6: "Post", 7: "Put", 8: "Trace", 9: "Patch",
}

func message(e *audit.Event) string {
	target, method := e.Host, e.Method
	if e.Port != 0 {
		target += ":" + itoa(e.Port)
	}
	switch {
	case e.Phase == "request":
		target = e.Scheme + "://" + target + e.Path
	case e.SSH != nil:
		target, method = "ssh://"+target+"/"+e.SSH.Repository, sshOperation(e.SSH)
	case e.Postgres != nil: // the command only: never the statement's text
		target = "postgres://" + target + "/" + e.Postgres.Database
	case method == "":
		method = e.Phase
	}
	s := e.Decision + " " + method + " " + target
	if e.Agent != "" {
		s = e.Agent + ": " + s
	}
	return s
}

func trafficOf(e *audit.Event) *traffic {
	if e.BytesIn == 0 && e.BytesOut == 0 {
		return nil
	}
	return &traffic{BytesIn: e.BytesIn, BytesOut: e.BytesOut}
}

func httpRequestOf(e *audit.Event) *httpRequest {
	u := &url{Scheme: e.Scheme, Hostname: e.Host, Port: e.Port, Path: e.Path}
	if e.Path == "" {
		u.Path = "/"
	}
	u.URLString = e.Scheme + "://" + e.Host
	if e.Port != 0 && !(e.Scheme == "https" && e.Port == 443) && !(e.Scheme == "http" && e.Port == 80) {
		u.URLString += ":" + itoa(e.Port)
	}
	u.URLString += u.Path
	r := &httpRequest{URL: u, UID: e.RequestID}
	if _, ok := httpActivities[e.Method]; ok { // the schema's enum; another method is in activity_name
		r.HTTPMethod = e.Method
	}
	return r
}

func apiOf(e *audit.Event) *api {
	a := &api{Service: &service{Name: e.Host}, Request: &request{UID: e.RequestID}}
	switch {
	case e.MCP != nil:
		a.Operation = e.MCP.Method
	case e.JSONRPC != nil:
		a.Operation = e.JSONRPC.Method
	default:
		a.Operation = e.Method + " " + e.Path
	}
	if a.Operation == "" {
		a.Operation = e.Method + " " + e.Path
	}
	if e.LLM != nil && e.LLM.Provider != "" {
		a.Service.Name = e.LLM.Provider
	}
	return a
}

// sshAPI is a git command over SSH as an API call: the service (fetch, push, archive) is
// the operation, the git host the service.
func sshAPI(e *audit.Event) *api {
	return &api{Operation: sshOperation(e.SSH), Service: &service{Name: e.Host}, Request: &request{UID: e.RequestID}}
}

// sshOperation is the git service of a session, or "none" for one that ran no git command
// (the metrics' label).
func sshOperation(x *audit.SSHSession) string {
	if x.Service == "" {
		return "none"
	}
	return x.Service
}

// postgresActivity is the API activity of a Postgres connection (Other 99, "Connect") or of
// one of its statements: a read Read 2; a write Create 1 (INSERT), Delete 4 (DELETE,
// TRUNCATE) or Update 3; DDL and the rest Other 99.
func postgresActivity(p *audit.PostgresCall) (class, activity int, name string) {
	st := p.Statement
	switch {
	case st == nil:
		return classAPIActivity, 99, "Connect"
	case st.Kind == "read":
		return classAPIActivity, 2, "Read"
	case st.Kind != "write":
		return classAPIActivity, 99, "Other"
	case st.Command == "INSERT":
		return classAPIActivity, 1, "Create"
	case st.Command == "DELETE" || st.Command == "TRUNCATE":
		return classAPIActivity, 4, "Delete"
	}
	return classAPIActivity, 3, "Update"
}

// postgresAPI is a Postgres connection or statement as an API call: the command (CONNECT,
// SELECT, INSERT...) is the operation, the configured upstream the service.
func postgresAPI(e *audit.Event) *api {
	a := &api{Operation: e.Method, Request: &request{UID: e.RequestID}}
	if e.Postgres.Upstream != "" { // none: a database no upstream is configured for
		a.Service = &service{Name: e.Postgres.Upstream}
	}
	if a.Operation == "" {
		a.Operation = "CONNECT"
	}
	return a
}

// postgresResources is the database of a Postgres event, when it names one.
func postgresResources(p *audit.PostgresCall) []resource {
	if p.Database == "" {
		return nil
	}
	return []resource{{Name: p.Database, Type: "database"}}
}

// Kinds of finding.
const (
	findDenied    = "denied"
	findWouldDeny = "would_deny"
	findBudget    = "budget_exceeded"
	findRedacted  = "secret_redacted"
)

// failed reports whether the exchange failed rather than was refused: an upstream, credential
// or policy evaluation error (the event's error), written as a deny. It is no finding.
func failed(e *audit.Event) bool { return e.Error != "" && e.Budget == "" }

// findingsOf names the findings a decision calls for.
func findingsOf(e *audit.Event) []string {
	var fs []string
	switch {
	case e.Budget != "":
		fs = append(fs, findBudget)
	case e.Decision == audit.Deny && !failed(e):
		fs = append(fs, findDenied)
	case e.WouldDeny:
		fs = append(fs, findWouldDeny)
	}
	if e.Redacted > 0 {
		fs = append(fs, findRedacted)
	}
	return fs
}

// finding fills a Detection Finding about a decision.
func (c *Encoder) finding(ev *event, e *audit.Event, m audit.Meta, kind string) {
	var title, desc string
	an := &analytic{Name: "capbroker policy", TypeID: 1, Type: "Rule", UID: e.DecisionID}
	switch kind {
	case findDenied:
		ev.SeverityID, title = sevLow, "Request denied by policy"
		ev.ActionID, ev.Action, ev.DispositionID, ev.Disposition = 2, "Denied", 2, "Blocked"
		desc = e.Reason
	case findWouldDeny:
		ev.SeverityID, title = sevInformational, "Request would be denied (monitor mode)"
		ev.ActionID, ev.Action, ev.DispositionID, ev.Disposition = 1, "Allowed", 15, "Detected"
		desc = e.Reason
	case findBudget:
		ev.SeverityID, title = sevLow, "Request refused: budget exceeded"
		ev.ActionID, ev.Action, ev.DispositionID, ev.Disposition = 2, "Denied", 2, "Blocked"
		an = &analytic{Name: "capbroker budget " + e.Budget, TypeID: 1, Type: "Rule"}
		desc = e.Reason
	case findRedacted:
		ev.SeverityID, title = sevHigh, "Secret redacted from a response"
		ev.ActionID, ev.Action, ev.DispositionID, ev.Disposition = 1, "Allowed", 11, "Corrected"
		an = &analytic{Name: "capbroker scrubber", TypeID: 9, Type: "Exact Data Match"}
		desc = "the response carried a value the broker injected; each was replaced with [REDACTED] (" + itoa(e.Redacted) + ")"
		ev.IsAlert = true
	}
	c.base(ev, classDetectionFinding, 1, "Create", m, e.RequestID)
	ev.Metadata.UID = e.RequestID + "/" + kind
	ev.StatusID, ev.Status = 1, "New"
	ev.ConfidenceID, ev.Confidence = 3, "High"
	ev.Message = title + ": " + message(e)
	ev.FindingInfo = &findingInfo{UID: e.RequestID + "/" + kind, Title: title, Desc: desc, Types: []string{kind}, Analytic: an}
	ev.Actor = agentActor(e.Agent)
	ev.Evidences = []evidence{evidenceOf(e)}
	ev.Resources = []resource{{Name: e.Host, Type: "host"}}
	if e.Postgres != nil { // the database too; its host, unless none was reached
		if e.Host == "" {
			ev.Resources = nil
		}
		ev.Resources = append(ev.Resources, postgresResources(e.Postgres)...)
	}
	ev.Metadata.Profiles = profilesOf(ev)
	u := unmappedOf(e, m)
	u.TraceID = e.TraceID
	ev.Unmapped = u
}

func evidenceOf(e *audit.Event) evidence {
	ev := evidence{Actor: agentActor(e.Agent), SrcEndpoint: sourceEndpoint(e.SourceIP)}
	switch e.Phase {
	case "dns":
		ev.Query = &dnsQuery{Hostname: e.Host, Type: e.Method, Class: "IN"}
	case "request":
		ev.DstEndpoint = hostEndpoint(e.Host, e.Port)
		ev.HTTPRequest = httpRequestOf(e)
	default:
		if e.SSH != nil {
			ev.API = sshAPI(e)
		}
		if e.Postgres != nil {
			ev.API = postgresAPI(e)
		}
		ev.DstEndpoint = hostEndpoint(e.Host, e.Port)
	}
	if ev.Actor == nil && ev.SrcEndpoint == nil && ev.DstEndpoint == nil && ev.Query == nil && ev.API == nil {
		ev.DstEndpoint = &endpoint{Hostname: e.Host}
	}
	return ev
}

// native is the broker's own fields of a decision that OCSF has no attribute for, with its
// names in the JSON line (CONTRACT §6, §8).
type native struct {
	Decision       string         `json:"decision"`
	Phase          string         `json:"phase"`
	Mode           string         `json:"mode,omitempty"`
	PolicyMode     string         `json:"policy_mode,omitempty"`
	PolicyRevision string         `json:"policy_revision,omitempty"`
	DecisionID     string         `json:"decision_id,omitempty"`
	Credentials    []string       `json:"credentials"`
	WouldDeny      bool           `json:"would_deny,omitzero"`
	Error          string         `json:"error,omitempty"`
	Budget         string         `json:"budget,omitempty"`
	Redacted       int            `json:"redacted,omitzero"`
	Via            string         `json:"via,omitempty"`
	TLSInspected   bool           `json:"tls_inspected,omitzero"`
	TraceID        string         `json:"trace_id,omitempty"`
	AWS            *awsCall       `json:"aws,omitempty"`
	GraphQL        *graphQLCall   `json:"graphql,omitempty"`
	MCP            *mcpCall       `json:"mcp,omitempty"`
	JSONRPC        *jsonrpcCall   `json:"jsonrpc,omitempty"`
	LLM            *llmCall       `json:"llm,omitempty"`
	SSH            *sshSession    `json:"ssh,omitempty"`
	Postgres       *postgresCall  `json:"postgres,omitempty"`
	BytesIn        int64          `json:"bytes_in,omitzero"`
	BytesOut       int64          `json:"bytes_out,omitzero"`
	Approval       *approval      `json:"approval,omitempty"`
	InputLevel     string         `json:"input_level,omitempty"`
	Input          map[string]any `json:"input,omitempty"`
}

type awsCall struct {
	Service   string `json:"service"`
	Operation string `json:"operation"`
}

type graphQLCall struct {
	Type string `json:"type"`
	Name string `json:"name"`
}

type mcpCall struct {
	Method string    `json:"method"`
	Tool   string    `json:"tool"`
	Batch  []mcpCall `json:"batch,omitempty"`
}

type jsonrpcCall struct {
	Method string   `json:"method"`
	Batch  []string `json:"batch,omitempty"`
}

type llmCall struct {
	Provider       string  `json:"provider"`
	Model          string  `json:"model"`
	TokensIn       int64   `json:"tokens_in"`
	TokensOut      int64   `json:"tokens_out"`
	TokensCached   int64   `json:"tokens_cached"`
	Cost           float64 `json:"cost"`
	UsageReported  bool    `json:"usage_reported"`
	UsageEstimated bool    `json:"usage_estimated,omitzero"`
}

// sshSession is the JSON line's "ssh" object (CONTRACT §8b).
type sshSession struct {
	Host       string   `json:"host"`
	Port       int      `json:"port"`
	User       string   `json:"user"`
	Service    string   `json:"service"`
	Repository string   `json:"repository"`
	Refs       []sshRef `json:"refs"`
}

type sshRef struct {
	Name string `json:"name"`
	Old  string `json:"old"`
	New  string `json:"new"`
}

// postgresCall is the JSON line's "postgres" object (CONTRACT §8b).
type postgresCall struct {
	Database        string             `json:"database"`
	Upstream        string             `json:"upstream"`
	User            string             `json:"user"`
	ApplicationName string             `json:"application_name"`
	TLS             bool               `json:"tls"`
	Role            string             `json:"role,omitempty"`
	LeaseID         string             `json:"lease_id,omitempty"`
	Statements      *postgresCounts    `json:"statements,omitempty"`
	Statement       *postgresStatement `json:"statement,omitempty"`
}

type postgresCounts struct {
	Read  int64 `json:"read"`
	Write int64 `json:"write"`
	DDL   int64 `json:"ddl"`
	Other int64 `json:"other"`
}

// postgresStatement is a refused or held statement. Text is as the JSON line has it: its
// literals replaced by "?" unless audit.include_input is full.
type postgresStatement struct {
	Kind      string   `json:"kind"`
	Command   string   `json:"command"`
	Tables    []string `json:"tables"`
	Functions []string `json:"functions"`
	Text      string   `json:"text"`
}

type approval struct {
	ID      string `json:"id"`
	Outcome string `json:"outcome"`
	By      string `json:"by"`
	Scope   string `json:"scope"`
	Comment string `json:"comment,omitempty"`
	Grant   string `json:"grant,omitempty"`
}

func unmappedOf(e *audit.Event, m audit.Meta) *native {
	u := &native{Decision: e.Decision, Phase: e.Phase, Mode: e.Mode, PolicyMode: e.PolicyMode,
		PolicyRevision: e.PolicyRevision, DecisionID: e.DecisionID, Credentials: e.Credentials,
		WouldDeny: e.WouldDeny, Error: e.Error, Budget: e.Budget, Redacted: e.Redacted, Via: e.Via,
		TLSInspected: e.TLSInspected}
	if u.Credentials == nil {
		u.Credentials = []string{}
	}
	if a := e.AWS; a != nil {
		u.AWS = &awsCall{Service: a.Service, Operation: a.Operation}
	}
	if g := e.GraphQL; g != nil {
		u.GraphQL = &graphQLCall{Type: g.Type, Name: g.Name}
	}
	if c := e.MCP; c != nil {
		u.MCP = &mcpCall{Method: c.Method, Tool: c.Tool}
		if len(c.Batch) > 1 {
			for _, b := range c.Batch {
				u.MCP.Batch = append(u.MCP.Batch, mcpCall{Method: b.Method, Tool: b.Tool})
			}
		}
	}
	if j := e.JSONRPC; j != nil {
		u.JSONRPC = &jsonrpcCall{Method: j.Method}
		if len(j.Batch) > 1 {
			u.JSONRPC.Batch = j.Batch
		}
	}
	if l := e.LLM; l != nil {
		u.LLM = &llmCall{Provider: l.Provider, Model: l.Model, TokensIn: l.TokensIn, TokensOut: l.TokensOut,
			TokensCached: l.TokensCached, Cost: l.Cost, UsageReported: l.Reported, UsageEstimated: l.Estimated}
	}
	if x := e.SSH; x != nil {
		u.SSH = &sshSession{Host: x.Host, Port: x.Port, User: x.User, Service: x.Service, Repository: x.Repository,
			Refs: make([]sshRef, len(x.Refs))}
		for i, r := range x.Refs {
			u.SSH.Refs[i] = sshRef(r)
		}
		// API Activity has no traffic attribute: the bytes each way stay here
		u.BytesIn, u.BytesOut = e.BytesIn, e.BytesOut
	}
	if p := e.Postgres; p != nil {
		u.Postgres = postgresOf(p)
		u.BytesIn, u.BytesOut = e.BytesIn, e.BytesOut // as for SSH: API Activity has no traffic
	}
	if a := e.Approval; a != nil {
		u.Approval = &approval{ID: a.ID, Outcome: a.Outcome, By: a.By, Scope: a.Scope, Comment: a.Comment, Grant: a.Grant}
	}
	if in := e.LoggedInput(); in != nil {
		u.InputLevel, u.Input = string(e.InputLevel), in
	}
	return u
}

// profilesOf names the OCSF profiles whose attributes ev has (metadata.profiles).
func profilesOf(ev *event) []string {
	ps := make([]string, 0, 4)
	if ev.ActionID != 0 || ev.DispositionID != 0 {
		ps = append(ps, "security_control")
	}
	if ev.Actor != nil {
		ps = append(ps, "host")
	}
	if ev.Trace != nil {
		ps = append(ps, "trace")
	}
	if ev.AIModel != nil || ev.MessageContext != nil {
		ps = append(ps, "ai_operation")
	}
	return ps
}

// postgresOf is the "postgres" object of the JSON line: the same fields, and the statement's
// text as the Postgres front door gave it (literals replaced unless include_input is full).
func postgresOf(p *audit.PostgresCall) *postgresCall {
	c := &postgresCall{Database: p.Database, Upstream: p.Upstream, User: p.User, ApplicationName: p.ApplicationName,
		TLS: p.TLS, Role: p.Role, LeaseID: p.LeaseID}
	if n := p.Statements; n != nil {
		c.Statements = &postgresCounts{Read: n["read"], Write: n["write"], DDL: n["ddl"], Other: n["other"]}
	}
	if s := p.Statement; s != nil {
		c.Statement = &postgresStatement{Kind: s.Kind, Command: s.Command, Tables: nonNil(s.Tables),
			Functions: nonNil(s.Functions), Text: s.Text}
	}
	return c
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
