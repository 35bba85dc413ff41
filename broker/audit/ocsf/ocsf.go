// Package ocsf encodes audit events as OCSF 1.x events (audit.format: ocsf), one JSON object
// per line, for a SIEM whose detections already read that schema. The mapping, field by
// field, is in docs/observability.md; the broker's own fields that OCSF has no place for are
// kept under "unmapped", never dropped.
//
// A decision becomes its activity event: HTTP Activity (4002) for a request, Network Activity
// (4001) for a CONNECT or a refused flow, DNS Activity (4003) for the sandbox's resolver, API
// Activity (6003) for an LLM, MCP or JSON-RPC call. A denial (or, in monitor mode, a decision
// that would deny), a budget refusal and a response the broker redacted a secret from add a
// Detection Finding (2004) on a line of its own, with the same metadata.correlation_uid (the
// request id). An approval event (a person's decision on a held request, or a grant) becomes
// a User Access Management event (3005).
package ocsf

import (
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/capbroker/capbroker/broker/audit"
)

// Version is the OCSF schema version the events follow (ocsfschema/schema holds it).
const Version = "1.8.0"

// Options are the encoder's settings.
type Options struct {
	// ProductVersion is the broker's version, in metadata.product.version.
	ProductVersion string
}

// Encoder is an audit.Encoder writing OCSF events.
type Encoder struct {
	product product
}

var _ audit.Encoder = (*Encoder)(nil)

// New returns an OCSF encoder.
func New(o Options) *Encoder {
	return &Encoder{product: product{Name: "capbroker", VendorName: "capbroker", Version: o.ProductVersion}}
}

// Categories and classes (category_uid*1000 + class).
const (
	catIAM         = 3
	catNetwork     = 4
	catFindings    = 2
	catApplication = 6

	classDetectionFinding = 2004
	classUserAccess       = 3005
	classNetworkActivity  = 4001
	classHTTPActivity     = 4002
	classDNSActivity      = 4003
	classAPIActivity      = 6003
)

var categoryNames = map[int]string{
	catIAM: "Identity & Access Management", catNetwork: "Network Activity",
	catFindings: "Findings", catApplication: "Application Activity",
}

var classNames = map[int]string{
	classDetectionFinding: "Detection Finding", classUserAccess: "User Access Management",
	classNetworkActivity: "Network Activity", classHTTPActivity: "HTTP Activity",
	classDNSActivity: "DNS Activity", classAPIActivity: "API Activity",
}

// Severities (severity_id).
const (
	sevInformational = 1
	sevLow           = 2
	sevMedium        = 3
	sevHigh          = 4
)

var severityNames = [...]string{"Unknown", "Informational", "Low", "Medium", "High"}

// event is every attribute the encoder writes, of any class; each class uses its own
// (the schema test checks that none is written where its class has no such attribute).
type event struct {
	ActivityID    int    `json:"activity_id"`
	ActivityName  string `json:"activity_name,omitempty"`
	CategoryUID   int    `json:"category_uid"`
	CategoryName  string `json:"category_name"`
	ClassUID      int    `json:"class_uid"`
	ClassName     string `json:"class_name"`
	TypeUID       int64  `json:"type_uid"`
	Time          int64  `json:"time"`
	StartTime     int64  `json:"start_time,omitzero"`
	Duration      *int64 `json:"duration,omitempty"`
	SeverityID    int    `json:"severity_id"`
	Severity      string `json:"severity"`
	StatusID      int    `json:"status_id,omitzero"`
	Status        string `json:"status,omitempty"`
	StatusCode    string `json:"status_code,omitempty"`
	StatusDetail  string `json:"status_detail,omitempty"`
	Message       string `json:"message,omitempty"`
	ActionID      int    `json:"action_id,omitzero"`
	Action        string `json:"action,omitempty"`
	DispositionID int    `json:"disposition_id,omitzero"`
	Disposition   string `json:"disposition,omitempty"`
	IsAlert       bool   `json:"is_alert,omitzero"`
	ConfidenceID  int    `json:"confidence_id,omitzero"`
	Confidence    string `json:"confidence,omitempty"`

	Metadata       metadata        `json:"metadata"`
	Actor          *actor          `json:"actor,omitempty"`
	SrcEndpoint    *endpoint       `json:"src_endpoint,omitempty"`
	DstEndpoint    *endpoint       `json:"dst_endpoint,omitempty"`
	ConnectionInfo *connectionInfo `json:"connection_info,omitempty"`
	Traffic        *traffic        `json:"traffic,omitempty"`
	HTTPRequest    *httpRequest    `json:"http_request,omitempty"`
	HTTPResponse   *httpResponse   `json:"http_response,omitempty"`
	HTTPStatus     int             `json:"http_status,omitzero"`
	Query          *dnsQuery       `json:"query,omitempty"`
	RcodeID        *int            `json:"rcode_id,omitempty"`
	Rcode          string          `json:"rcode,omitempty"`
	API            *api            `json:"api,omitempty"`
	AIModel        *aiModel        `json:"ai_model,omitempty"`
	MessageContext *messageContext `json:"message_context,omitempty"`
	Resources      []resource      `json:"resources,omitempty"`
	FindingInfo    *findingInfo    `json:"finding_info,omitempty"`
	Evidences      []evidence      `json:"evidences,omitempty"`
	User           *user           `json:"user,omitempty"`
	Privileges     []string        `json:"privileges,omitempty"`
	Trace          *trace          `json:"trace,omitempty"`
	Unmapped       any             `json:"unmapped,omitempty"`
}

type metadata struct {
	Version        string    `json:"version"`
	Product        product   `json:"product"`
	UID            string    `json:"uid,omitempty"`
	CorrelationUID string    `json:"correlation_uid,omitempty"`
	LogName        string    `json:"log_name"`
	Reporter       *reporter `json:"reporter,omitempty"`
	Profiles       []string  `json:"profiles,omitempty"`
}

// reporter is the broker replica that wrote the event (audit.instance).
type reporter struct {
	Name string `json:"name"`
}

type product struct {
	Name       string `json:"name"`
	VendorName string `json:"vendor_name"`
	Version    string `json:"version,omitempty"`
}

type actor struct {
	User *user `json:"user,omitempty"`
}

type user struct {
	Name   string `json:"name,omitempty"`
	UID    string `json:"uid,omitempty"`
	TypeID int    `json:"type_id,omitzero"`
	Type   string `json:"type,omitempty"`
}

type endpoint struct {
	Name     string `json:"name,omitempty"`
	Hostname string `json:"hostname,omitempty"`
	IP       string `json:"ip,omitempty"`
	Port     int    `json:"port,omitzero"`
}

type connectionInfo struct {
	DirectionID  int    `json:"direction_id"`
	Direction    string `json:"direction"`
	ProtocolName string `json:"protocol_name,omitempty"`
}

type traffic struct {
	BytesIn  int64 `json:"bytes_in"`
	BytesOut int64 `json:"bytes_out"`
}

type httpRequest struct {
	HTTPMethod string `json:"http_method,omitempty"`
	URL        *url   `json:"url,omitempty"`
	UID        string `json:"uid,omitempty"`
}

type url struct {
	Scheme    string `json:"scheme,omitempty"`
	Hostname  string `json:"hostname,omitempty"`
	Port      int    `json:"port,omitzero"`
	Path      string `json:"path,omitempty"`
	URLString string `json:"url_string,omitempty"`
}

type httpResponse struct {
	Code int `json:"code"`
}

type dnsQuery struct {
	Hostname string `json:"hostname"`
	Type     string `json:"type,omitempty"`
	Class    string `json:"class,omitempty"`
}

type api struct {
	Operation string   `json:"operation"`
	Service   *service `json:"service,omitempty"`
	Request   *request `json:"request,omitempty"`
}

type service struct {
	Name string `json:"name,omitempty"`
}

type request struct {
	UID string `json:"uid"`
}

type aiModel struct {
	AIProvider string `json:"ai_provider"`
	Name       string `json:"name"`
}

type messageContext struct {
	Service          *service `json:"service,omitempty"`
	PromptTokens     *int64   `json:"prompt_tokens,omitempty"`
	CompletionTokens *int64   `json:"completion_tokens,omitempty"`
	TotalTokens      *int64   `json:"total_tokens,omitempty"`
}

type resource struct {
	Name string `json:"name,omitempty"`
	Type string `json:"type,omitempty"`
}

type findingInfo struct {
	UID      string    `json:"uid"`
	Title    string    `json:"title"`
	Desc     string    `json:"desc,omitempty"`
	Types    []string  `json:"types,omitempty"`
	Analytic *analytic `json:"analytic,omitempty"`
}

type analytic struct {
	Name   string `json:"name"`
	TypeID int    `json:"type_id"`
	Type   string `json:"type"`
	UID    string `json:"uid,omitempty"`
}

type evidence struct {
	Actor       *actor       `json:"actor,omitempty"`
	SrcEndpoint *endpoint    `json:"src_endpoint,omitempty"`
	DstEndpoint *endpoint    `json:"dst_endpoint,omitempty"`
	HTTPRequest *httpRequest `json:"http_request,omitempty"`
	API         *api         `json:"api,omitempty"`
	Query       *dnsQuery    `json:"query,omitempty"`
}

type trace struct {
	UID string `json:"uid"`
}

// ms is an OCSF timestamp_t: milliseconds since the epoch.
func ms(t time.Time) int64 { return t.UnixMilli() }

// appendLine appends ev as one JSON line.
func appendLine(dst []byte, ev *event) []byte {
	out := w{b: dst}
	ev.write(&out)
	return append(out.b, '\n')
}

// base fills the attributes every class has.
func (c *Encoder) base(ev *event, class, activity int, activityName string, m audit.Meta, correlation string) {
	cat := class / 1000
	ev.ActivityID, ev.ActivityName = activity, activityName
	ev.CategoryUID, ev.CategoryName = cat, categoryNames[cat]
	ev.ClassUID, ev.ClassName = class, classNames[class]
	ev.TypeUID = int64(class)*100 + int64(activity)
	ev.Time = ms(m.Time)
	ev.Severity = severityNames[ev.SeverityID]
	ev.Metadata = metadata{Version: Version, Product: c.product, CorrelationUID: correlation, LogName: "audit"}
	if m.Instance != "" {
		ev.Metadata.Reporter = &reporter{Name: m.Instance}
	}
}

// agentActor is the agent as the OCSF actor (a service account: an agent is not a person).
func agentActor(agent string) *actor {
	if agent == "" {
		return nil
	}
	return &actor{User: &user{Name: agent, UID: agent, TypeID: 4, Type: "Service"}}
}

// hostEndpoint is a destination: an address literal as ip, a name as hostname.
func hostEndpoint(host string, port int) *endpoint {
	if host == "" && port == 0 {
		return nil
	}
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return &endpoint{IP: a.String(), Port: port}
	}
	return &endpoint{Hostname: host, Port: port}
}

func sourceEndpoint(ip string) *endpoint {
	if a, err := netip.ParseAddr(ip); err == nil {
		return &endpoint{IP: a.Unmap().String()}
	}
	return nil
}

func itoa(n int) string { return strconv.Itoa(n) }
