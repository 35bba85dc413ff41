// Package aws re-signs AWS requests (Signature Version 4) with a root key the agent never
// holds. The agent runs the unmodified AWS CLI or SDK with placeholder keys; its signature is
// worthless, but it says what the agent meant to sign: the credential scope (date, region,
// service), the signed headers and the declared payload hash. Sign drops it and signs the same
// request again with the real access key, secret key and session token, in the same form
// (Authorization header, presigned query, aws-chunked upload with chunk and trailer
// signatures). Describe tells the policy what the request does (input.aws).
//
// Only what AWS requires to be hashed is hashed: a payload whose hash the agent declared in
// x-amz-content-sha256 is not read again (AWS checks the body against that hash, and the
// signature covers it), an aws-chunked upload is re-signed one chunk at a time as it streams,
// and only a request that declares no hash at all (the JSON and query APIs) has its body read
// and hashed, up to a limit.
package aws

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/capbroker/capbroker/credentials"
)

// ErrUnsupported is wrapped by Sign when the request's signature is not one it can re-sign
// (SigV2, SigV4a, an unsigned request, a malformed one): such a request is refused, never
// forwarded as it is.
var ErrUnsupported = errors.New("aws: request signature not supported")

// Options tunes a Signer. Zero values are fine.
type Options struct {
	// Region and Service, when set, replace those of the agent's credential scope.
	Region, Service string
	// Now is the clock header signatures are dated by (default time.Now).
	Now func() time.Time
	// MaxHashedBody bounds the body read to hash it when the agent declared no payload hash
	// (default 64 MiB); a larger one is refused.
	MaxHashedBody int64
}

// DefaultMaxHashedBody is Options.MaxHashedBody when it is not set.
const DefaultMaxHashedBody = 64 << 20

// Signer re-signs requests with the key its root getter returns.
type Signer struct {
	opts Options
	root func(context.Context) (credentials.Secret, error)

	mu   sync.Mutex
	keys map[keyID][]byte // derived signing keys, per secret key and scope
}

var _ credentials.Signer = (*Signer)(nil)

// New returns a Signer. root returns the current root key (a secret with fields: see Key);
// it is called for every request, so the credential store's caching, Vault leases and
// rotation apply as they do to any credential.
func New(root func(context.Context) (credentials.Secret, error), opts Options) (*Signer, error) {
	if root == nil {
		return nil, errors.New("aws: no root credential")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxHashedBody <= 0 {
		opts.MaxHashedBody = DefaultMaxHashedBody
	}
	return &Signer{opts: opts, root: root, keys: map[keyID][]byte{}}, nil
}

// Key is an AWS access key.
type Key struct {
	ID, Secret, SessionToken string
}

// fieldNames are the names a root secret's fields go by: AWS's own (credentials files,
// credential_process, STS), Vault's AWS secrets engine's, and the usual KV layouts.
var fieldNames = struct{ id, secret, token []string }{
	id:     []string{"access_key_id", "access_key", "aws_access_key_id", "AccessKeyId"},
	secret: []string{"secret_access_key", "secret_key", "aws_secret_access_key", "SecretAccessKey"},
	token:  []string{"session_token", "security_token", "aws_session_token", "SessionToken"},
}

// KeyOf reads an access key from a secret with fields. The error names the fields it looked
// for, never a value.
func KeyOf(s credentials.Secret) (Key, error) {
	pick := func(names []string) string {
		for _, n := range names {
			if v, ok := s.Field(n); ok {
				return v
			}
		}
		return ""
	}
	k := Key{ID: pick(fieldNames.id), Secret: pick(fieldNames.secret), SessionToken: pick(fieldNames.token)}
	switch {
	case !s.HasFields():
		return Key{}, fmt.Errorf("%w: aws key: the source holds one value, not the fields of a key", credentials.ErrUnavailable)
	case k.ID == "":
		return Key{}, fmt.Errorf("%w: aws key: no access key id (field %s)", credentials.ErrUnavailable, strings.Join(fieldNames.id, " or "))
	case k.Secret == "":
		return Key{}, fmt.Errorf("%w: aws key: no secret key (field %s)", credentials.ErrUnavailable, strings.Join(fieldNames.secret, " or "))
	case strings.ContainsAny(k.ID, "/, \r\n") || strings.ContainsAny(k.SessionToken, "\r\n"):
		return Key{}, fmt.Errorf("%w: aws key: access key id or session token has characters a key cannot have", credentials.ErrUnavailable)
	}
	return k, nil
}

// Sign implements credentials.Signer: it replaces the agent's signature by one made with the
// root key. It fails, wrapping ErrUnsupported, on a request it cannot re-sign faithfully, and
// wrapping credentials.ErrUnavailable when the root key cannot be had.
func (s *Signer) Sign(ctx context.Context, req *http.Request) error {
	sig, err := parseSignature(req)
	if err != nil {
		return err
	}
	region, service := sig.region, sig.service
	if s.opts.Region != "" {
		region = s.opts.Region
	}
	if s.opts.Service != "" {
		service = s.opts.Service
	}
	root, err := s.root(ctx)
	if err != nil {
		return err
	}
	key, err := KeyOf(root)
	if err != nil {
		return err
	}
	if sig.presigned {
		return s.signQuery(req, sig, key, region, service)
	}
	return s.signHeader(req, sig, key, region, service)
}

// keyID names a derived signing key: secret key, date, region, service.
type keyID struct{ secret, date, region, service string }

// maxKeys bounds the cache of derived signing keys (it starts over past it).
const maxKeys = 64

// signingKey derives (or recalls) the key that signs for one day, region and service.
func (s *Signer) signingKey(secret, date, region, service string) []byte {
	id := keyID{secret, date, region, service}
	s.mu.Lock()
	defer s.mu.Unlock()
	if k, ok := s.keys[id]; ok {
		return k
	}
	k := deriveKey(secret, date, region, service)
	if len(s.keys) >= maxKeys {
		clear(s.keys)
	}
	s.keys[id] = k
	return k
}

// hashBody reads the body to hash it (only for a request that declared no payload hash),
// and puts it back to be sent.
func (s *Signer) hashBody(req *http.Request) (string, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return emptySHA256, nil
	}
	if req.ContentLength > s.opts.MaxHashedBody {
		return "", fmt.Errorf("%w: body of %d bytes declares no payload hash and is over the %d bytes the broker hashes", ErrUnsupported, req.ContentLength, s.opts.MaxHashedBody)
	}
	b, err := io.ReadAll(io.LimitReader(req.Body, s.opts.MaxHashedBody+1))
	_ = req.Body.Close()
	if err != nil {
		return "", fmt.Errorf("aws: reading the request body to hash it: %w", err)
	}
	if int64(len(b)) > s.opts.MaxHashedBody {
		return "", fmt.Errorf("%w: body declares no payload hash and is over the %d bytes the broker hashes", ErrUnsupported, s.opts.MaxHashedBody)
	}
	req.Body = io.NopCloser(bytes.NewReader(b))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	req.ContentLength = int64(len(b))
	return hexSHA256(b), nil
}

// KeySource is the source of an aws_sigv4 credential: a secret that is not an access key (a
// field missing) is a failure of the source, so that /readyz and check-config name it rather
// than the first request.
type KeySource struct{ credentials.Source }

// Fetch implements credentials.Source.
func (k KeySource) Fetch(ctx context.Context) (credentials.Secret, error) {
	s, err := k.Source.Fetch(ctx)
	if err != nil {
		return credentials.Secret{}, err
	}
	if _, err := KeyOf(s); err != nil {
		return credentials.Secret{}, err
	}
	return s, nil
}
