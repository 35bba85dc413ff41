package broker

import (
	"context"
	"crypto/sha1"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
)

// The only protocol switch the broker passes on is a WebSocket handshake (RFC 6455 §4): what
// follows a 101 is relayed without HTTP framing and without a decision per request, so a 101
// must show that the upstream really switched, to the protocol the request asked for.

// errBadSwitch is an upstream 101 that does not complete the request's WebSocket handshake.
var errBadSwitch = errors.New("upstream sent 101 Switching Protocols without completing a WebSocket handshake")

// checkSwitch accepts a 101 only as the answer to a WebSocket upgrade request, naming
// websocket in its Upgrade header and carrying the Sec-WebSocket-Accept the request's key
// calls for. Anything else may be an upstream that did not switch, whose next bytes would
// reach the agent (or take the agent's) as an unframed stream.
func checkSwitch(req *http.Request, resp *http.Response) error {
	if resp.StatusCode != http.StatusSwitchingProtocols {
		return nil
	}
	key := req.Header.Get("Sec-WebSocket-Key")
	if !isWebSocketUpgrade(req.Header) || key == "" ||
		!strings.EqualFold(strings.TrimSpace(resp.Header.Get("Upgrade")), "websocket") ||
		resp.Header.Get("Sec-WebSocket-Accept") != webSocketAccept(key) {
		resp.Body.Close()
		return errBadSwitch
	}
	return nil
}

// webSocketAccept is the Sec-WebSocket-Accept a server answers key with (RFC 6455 §4.2.2).
func webSocketAccept(key string) string {
	h := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	return base64.StdEncoding.EncodeToString(h[:])
}

// switcher is the agent's connection as the framing guard sees it (*wire.Conn).
type switcher interface{ Switch() }

// switched tells the framing guard of the agent's connection that the protocol was switched:
// a 101 is being forwarded, and what follows is no longer HTTP/1.1.
func switched(ctx context.Context) {
	if ac, ok := ctx.Value(admittedKey{}).(*admittedConn); ok {
		if s, ok := ac.Conn.(switcher); ok {
			s.Switch()
		}
	}
}
