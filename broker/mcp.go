package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"

	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/broker/rpc"
)

// mcpSessionsMax bounds the MCP sessions the broker remembers the agent of (rpc.Sessions).
const mcpSessionsMax = 1 << 16

// MCPSessions remembers which agent each MCP session was issued to: in this broker's memory,
// or shared by a fleet of brokers (rpc.SharedSessions). An error of Owner is the store's,
// when it fails closed (503).
type MCPSessions interface {
	Issued(ctx context.Context, host, id, agent string) error
	Owner(ctx context.Context, host, id string) (agent string, ok bool, err error)
}

var _ MCPSessions = (*rpc.SharedSessions)(nil)

// localSessions are the MCP sessions of one broker.
type localSessions struct{ s *rpc.Sessions }

func (l localSessions) Issued(_ context.Context, host, id, agent string) error {
	l.s.Issued(host, id, agent)
	return nil
}

func (l localSessions) Owner(_ context.Context, host, id string) (string, bool, error) {
	a, ok := l.s.Owner(host, id)
	return a, ok, nil
}

// protocolAt reports whether a request to host and path is to one of endpoints.
func protocolAt(endpoints []config.ProtocolEndpoint, host, path string) bool {
	for _, e := range endpoints {
		if e.Matches(host, path) {
			return true
		}
	}
	return false
}

// describeRPC lets the policy see what a request to a configured MCP server or JSON-RPC
// endpoint asks for: input.mcp and input.jsonrpc, derived from the body only if the policy
// reads them (policy.Input.ReadMCP). A request without a body (an MCP client's GET for the
// server's stream, its DELETE of the session) has no messages; a body that is not JSON-RPC
// (or not JSON, or not sent as JSON) is rpc.ErrNotJSONRPC, which denies it; an ambiguous one
// (strictjson.ErrAmbiguous) is refused as such. Every refusal of a request to these endpoints
// is a JSON-RPC error (shapeJSONRPC), which the client reads.
func (g *generation) describeRPC(x *exchange, r *http.Request, in *policy.Input) {
	hasBody := r.Body != nil && r.Body != http.NoBody
	derive := func(meaning func([]rpc.Message) ([]any, error), isMCP bool) func([]byte) ([]any, error) {
		return func(text []byte) ([]any, error) {
			if !hasBody {
				return []any{}, nil
			}
			msgs, err := rpc.Parse(text)
			if err != nil {
				return nil, err
			}
			l, err := meaning(msgs)
			if err != nil {
				return nil, err
			}
			if isMCP {
				x.ev.MCP = mcpCall(l)
			} else {
				x.ev.JSONRPC = jsonRPCCall(l)
			}
			return l, nil
		}
	}
	if protocolAt(g.protocols.MCP, in.Host, in.Path) {
		in.ReadMCP, x.jsonRPC, x.mcp = derive(rpc.MCP, true), true, true
	}
	if protocolAt(g.protocols.JSONRPC, in.Host, in.Path) {
		in.ReadJSONRPC, x.jsonRPC = derive(rpc.JSONRPC, false), true
	}
}

// rpcText is the request body's text, if the broker has read it (for the policy, or as a
// small body), else nil.
func (x *exchange) rpcText() []byte {
	if x.body.text != nil {
		return x.body.text
	}
	return x.small
}

// nameRPC names in the audit event the messages of a request to an MCP or JSON-RPC endpoint
// whose policy did not read them, if the broker read its body: every event of these
// endpoints names its methods when they are known. A body that is not JSON-RPC names none.
func (x *exchange) nameRPC() {
	if !x.jsonRPC || x.ev.MCP != nil || x.ev.JSONRPC != nil {
		return
	}
	text := x.rpcText()
	if text == nil {
		return
	}
	msgs, err := rpc.Parse(text)
	if err != nil {
		return
	}
	if x.mcp {
		if l, err := rpc.MCP(msgs); err == nil {
			x.ev.MCP = mcpCall(l)
		}
		return
	}
	l, _ := rpc.JSONRPC(msgs)
	x.ev.JSONRPC = jsonRPCCall(l)
}

// mcpCall is the audit event's mcp object for input.mcp l (never empty).
func mcpCall(l []any) *audit.MCPCall {
	calls := make([]audit.MCPCall, len(l))
	for i, m := range l {
		item := m.(map[string]any)
		calls[i] = audit.MCPCall{Method: item["method"].(string), Tool: item["tool"].(string)}
	}
	c := calls[0]
	if len(calls) > 1 {
		c.Batch = calls
	}
	return &c
}

// jsonRPCCall is the audit event's jsonrpc object for input.jsonrpc l (never empty).
func jsonRPCCall(l []any) *audit.JSONRPCCall {
	methods := make([]string, len(l))
	for i, m := range l {
		methods[i] = m.(map[string]any)["method"].(string)
	}
	c := &audit.JSONRPCCall{Method: methods[0]}
	if len(methods) > 1 {
		c.Batch = methods
	}
	return c
}

// errMCPSessionUnknown answers a request carrying an MCP session id the broker does not know
// to be the agent's: as a server answers a session it no longer has (404), so that the
// client starts a new session.
var errMCPSessionUnknown = approvalRefusal{http.StatusNotFound, "mcp_session_unknown",
	"the broker knows of no MCP session with this id for this agent",
	"Start a new MCP session (initialize without the Mcp-Session-Id header)."}

// errMCPSessionStore answers a request whose MCP session the shared store could not be asked
// about, when the fleet's store fails closed.
var errMCPSessionStore = approvalRefusal{http.StatusServiceUnavailable, "fleet_store_unavailable",
	"the broker could not reach the fleet's shared store to check this MCP session; the request was not sent",
	"This is a problem on the broker's side. Retrying later may work."}

// checkMCPSession refuses a request to an MCP server carrying a session id the server issued
// to another agent (403), or one the broker has no record of (404): a session never serves an
// agent it was not issued to.
func (b *Broker) checkMCPSession(x *exchange, r *http.Request, in *policy.Input) error {
	ids := r.Header.Values(rpc.SessionHeader)
	if len(ids) == 0 || !protocolAt(x.g.protocols.MCP, in.Host, in.Path) {
		return nil
	}
	for _, id := range ids {
		owner, ok, err := b.sessions.Owner(r.Context(), in.Host, id)
		if err != nil {
			x.ev.Error = "mcp sessions store: " + err.Error()
			return errMCPSessionStore
		}
		if !ok {
			return errMCPSessionUnknown
		}
		if owner != x.agent.ID {
			return denial{"this MCP session was issued to another agent"}
		}
	}
	return nil
}

// noteMCPSession remembers the agent an MCP server's response issues a session to.
func (b *Broker) noteMCPSession(x *exchange, in *policy.Input, resp *http.Response) {
	id := resp.Header.Get(rpc.SessionHeader)
	if id == "" || !protocolAt(x.g.protocols.MCP, in.Host, in.Path) {
		return
	}
	if err := b.sessions.Issued(context.Background(), in.Host, id, x.agent.ID); err != nil {
		b.log.Warn().Err(err).Msg("an MCP session could not be recorded in the fleet's store: refused until it is (fail_closed), or served by this broker only (local)")
	}
}

// rpcRequests are the ids of the requests (messages with a method and an id) in a JSON-RPC
// body text, and whether it is a batch: those a refusal answers with an error response
// each (rpcRefusal). Nothing when text is not a JSON-RPC body the broker reads as the server
// would (rpc.Parse: an ambiguous or malformed one's ids are not trusted), or carries only
// notifications and responses. An id is echoed only if it is a string or a number, as
// JSON-RPC 2.0 has them.
func rpcRequests(text []byte) (ids []json.RawMessage, batch bool) {
	msgs, err := rpc.Parse(text)
	if err != nil {
		return nil, false
	}
	for _, m := range msgs {
		if !m.Response && (m.ID.Kind() == '"' || m.ID.Kind() == '0') {
			ids = append(ids, json.RawMessage(m.ID))
		}
	}
	return ids, bytes.TrimLeft(text, " \t\r\n")[0] == '['
}
