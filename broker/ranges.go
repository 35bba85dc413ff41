package broker

import (
	"fmt"
	"net/http"
	"strings"
)

// A response is scrubbed as one whole: a secret split between two responses is in neither.
// With byte ranges an agent could ask for a reflected secret in pieces (bytes=0-19, then
// bytes=20-), each too short to match, and join them. So a request to a host that has a
// credential bound goes without Range and If-Range: a server may always answer such a request
// with the whole representation (RFC 9110 §14.2), which is then scrubbed whole. And such a
// host's answer that still says it is a part (206, Content-Range on a success,
// multipart/byteranges) is refused. Resuming downloads from those hosts does not work; it
// restarts them.

// dropRangeHeaders removes the agent's range request from out, a request to a host with a
// bound credential.
func dropRangeHeaders(out *http.Request) {
	out.Header.Del("Range")
	out.Header.Del("If-Range")
}

// refusePartial returns an error for a response that holds part of a representation.
func refusePartial(resp *http.Response) error {
	partial := resp.StatusCode == http.StatusPartialContent ||
		resp.StatusCode/100 == 2 && len(resp.Header.Values("Content-Range")) > 0
	for _, ct := range resp.Header.Values("Content-Type") {
		if strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "multipart/byteranges") {
			partial = true
		}
	}
	if partial {
		return errPartial
	}
	return nil
}

var errPartial = fmt.Errorf("%w: upstream answered with part of a representation (a byte range) from a host with a credential; a secret split across parts could not be scrubbed", errUnscrubbable)
