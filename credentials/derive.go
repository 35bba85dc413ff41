package credentials

import (
	"context"
	"net/http"
	"time"
)

// Root secrets and what is derived from them.
//
// A static credential (an API key) is sent as it is read. A derived credential is not: the
// broker holds a root secret (an AWS secret key, a GitHub App's private key, an OAuth2 client
// secret or refresh token, a Google service account key) and derives, for each request, only
// what that request needs, narrowed to what the policy granted. The root secret never leaves
// the broker; what is derived is short-lived, cached, and scrubbed from responses like any
// other secret.

// Scope is what a decision narrowed a grant to: the "scope" object of a credentials item
// {"name": "gh_app", "scope": {...}}. Nil when the decision named the credential alone.
// GitHub Apps read "repositories" and "permissions", OAuth2 "scopes".
type Scope map[string]any

// A Minter turns a root secret into short-lived bearer tokens (GitHub App installation tokens,
// OAuth2 access tokens, Google service account tokens). The broker injects the token with the
// credential's inject rule, as it would a static value.
type Minter interface {
	// Token returns a token for scope, from the cache while it is good for a while yet, minted
	// otherwise (one mint in flight per credential and scope however many requests wait).
	// The token's Expires is when it stops working: the broker scrubs it from responses until
	// then. Failures wrap ErrUnavailable and never carry a secret or a response body.
	Token(ctx context.Context, scope Scope) (Secret, error)
	// Reject is told that the upstream refused tok (a 401): it is not handed out again.
	Reject(tok Secret)
	// Status reports the credential's state for /readyz and the metrics.
	Status() DerivedStatus
	// Close revokes what can be revoked (GitHub installation tokens) when the broker stops.
	Close(ctx context.Context) error
}

// Room is asked by a minter before each mint: nil when the broker can remember one more
// token of the credential until it expires, an error wrapping ErrUnavailable when it could
// only by forgetting one that may still be valid. A minter then refuses to mint: a token the
// broker cannot scrub from responses must not exist. Nil Room means always room (tests).
type Room func() error

// A Signer authorises a request by signing it (AWS SigV4): it replaces the agent's signature,
// made with placeholder keys, by one made with the root secret. It is the last thing done to
// an outbound request, as any later change to a signed header would break the signature. A
// body that must be re-signed as it streams (aws-chunked uploads) is wrapped, not buffered.
type Signer interface {
	Sign(ctx context.Context, req *http.Request) error
}

// DerivedStatus is the state of a derived credential, for /readyz and the metrics. It never
// holds a value.
type DerivedStatus struct {
	Ready       bool      // a token is cached and good, or one can be minted
	ValidUntil  time.Time // expiry of the newest cached token (zero: none)
	LastRefresh time.Time // when a token was last minted
	LastError   string    // class of the last failure ("" after a success): no secret, no body
}
