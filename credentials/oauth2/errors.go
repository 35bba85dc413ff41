package oauth2

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"

	"golang.org/x/oauth2"

	"github.com/capbroker/capbroker/credentials"
)

// ErrScope is wrapped (with credentials.ErrUnavailable) when a decision asks for scopes the
// credential is not configured with.
var ErrScope = errors.New("scope not allowed")

// mintError is a failure to obtain a token. Its text is a class ("token endpoint answered
// 400 invalid_grant"): it never holds a response body, a secret or a token.
type mintError struct {
	class string
	code  string // the OAuth2 error code, when the endpoint gave a known one
}

func (e *mintError) Error() string        { return e.class }
func (e *mintError) Is(target error) bool { return target == credentials.ErrUnavailable }

func failure(format string, args ...any) error {
	return &mintError{class: fmt.Sprintf(format, args...)}
}

// knownCodes are the error codes of RFC 6749 §5.2 and its extensions. Only these are repeated
// in an error: any other text an endpoint puts there is dropped, as it may echo a secret.
var knownCodes = []string{
	"invalid_request", "invalid_client", "invalid_grant", "unauthorized_client",
	"unsupported_grant_type", "invalid_scope", "access_denied", "server_error",
	"temporarily_unavailable", "invalid_target", "invalid_dpop_proof", "use_dpop_nonce",
	"unsupported_token_type", "slow_down", "expired_token",
}

// classify turns an error from the OAuth2 library into a mintError. The library's own texts
// may carry the response body (RetrieveError does); none of them is kept.
func classify(err error) error {
	var me *mintError
	if errors.As(err, &me) {
		return me
	}
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		status := 0
		if re.Response != nil {
			status = re.Response.StatusCode
		}
		code := re.ErrorCode
		if code == "" && len(re.Body) > 0 {
			// golang.org/x/oauth2/jwt does not parse the error; read only its "error" member.
			var body struct {
				Error string `json:"error"`
			}
			if json.Unmarshal(re.Body, &body) == nil {
				code = body.Error
			}
		}
		if slices.Contains(knownCodes, code) {
			return &mintError{class: fmt.Sprintf("token endpoint answered %d %s", status, code), code: code}
		}
		if code != "" {
			return failure("token endpoint answered %d with an unknown error code", status)
		}
		return failure("token endpoint answered %d", status)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return failure("token endpoint did not answer in time")
	case errors.Is(err, context.Canceled):
		return failure("token request cancelled")
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		// Transport errors (refused, DNS, TLS verification) carry addresses, never bodies.
		var ne net.Error
		if errors.As(ue.Err, &ne) && ne.Timeout() {
			return failure("token endpoint did not answer in time")
		}
		return failure("token endpoint unreachable: %v", ue.Err)
	}
	// "oauth2: cannot parse json: ...", "server response missing access_token", ...: the
	// answer was not a token response. The library's text is not repeated.
	return failure("token endpoint answer is not a token response")
}

// code returns the OAuth2 error code of a classified error, "" if none.
func code(err error) string {
	var me *mintError
	if errors.As(err, &me) {
		return me.code
	}
	return ""
}
