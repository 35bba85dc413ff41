package broker

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/credentials"
)

// Derivers finds what derives a credential's value per request: the Minter of a credential
// that mints tokens, the Signer of one that signs requests, nil for both when the credential
// is sent as its source reads it. A Secrets that implements it gives the broker derived
// credentials. The tokens minted are recorded in the registry of known secrets as they are
// put into a request (minted.put), and scrubbed from responses until they expire.
type Derivers interface {
	Minter(name string) credentials.Minter
	Signer(name string) credentials.Signer
}

// staticOnly is the Derivers of a Secrets that has no derived credentials.
type staticOnly struct{}

func (staticOnly) Minter(string) credentials.Minter { return nil }
func (staticOnly) Signer(string) credentials.Signer { return nil }

// A TokenInjector is a Minter that puts its token into a request itself, where one inject rule
// does not fit every request (a GitHub App token: Bearer for the API, Basic for git).
type TokenInjector interface {
	Inject(req *http.Request, tok credentials.Secret)
}

// minted is a token a request was sent with, so that an upstream's 401 can retire it.
type minted struct {
	binding *inject.Binding
	minter  credentials.Minter
	known   *inject.Known
	scope   credentials.Scope
	tok     credentials.Secret
}

// checkScopes refuses a grant narrowed to a scope that its credential cannot narrow: the
// agent would get more than the policy said.
func (g *generation) checkScopes(granted []*inject.Binding, scopes map[string]map[string]any) error {
	for _, b := range granted {
		if _, scoped := scopes[b.Name]; scoped && g.derived.Minter(b.Name) == nil {
			return denial{fmt.Sprintf("the policy narrowed credential %q to a scope, which it cannot be narrowed to", b.Name)}
		}
	}
	return nil
}

// inject puts every granted credential that is not signed into out: a static one as read, a
// minted one as a token for the scope the policy granted. It returns the minted tokens.
func (g *generation) inject(ctx context.Context, out *http.Request, granted []*inject.Binding, scopes map[string]map[string]any) ([]minted, error) {
	var toks []minted
	for _, b := range granted {
		switch m := g.derived.Minter(b.Name); {
		case m != nil:
			t := minted{binding: b, minter: m, known: g.known, scope: credentials.Scope(scopes[b.Name])}
			if err := t.put(ctx, out); err != nil {
				return nil, err
			}
			toks = append(toks, t)
		case g.derived.Signer(b.Name) != nil:
			// Signed last (sign), once the request will change no more. The key's id goes
			// out in the signature: the key is known from now on.
			secret, err := g.secrets.Get(ctx, b.Name)
			if err != nil {
				return nil, err
			}
			if err := g.known.Record(b, secret, false); err != nil {
				return nil, err
			}
		default:
			secret, err := g.secrets.Get(ctx, b.Name)
			if err != nil {
				return nil, err // never forward without a credential the decision granted
			}
			if err := g.known.Record(b, secret, false); err != nil {
				return nil, err // never send what could not be scrubbed from responses
			}
			b.Apply(out, secret)
		}
		if b.InBody() && out.Body != nil && out.Body != http.NoBody {
			// The secret is now in a body the agent wrote. An upstream that does not read the
			// body of this request would read it as the next request on the connection, one
			// the policy never saw: the connection ends with this request instead.
			out.Close = true
		}
	}
	return toks, nil
}

// put mints (or takes from the cache) a token, records it as known until it expires, and puts
// it into out.
func (t *minted) put(ctx context.Context, out *http.Request) error {
	tok, err := t.minter.Token(ctx, t.scope)
	if err != nil {
		return err
	}
	if err := t.known.Record(t.binding, tok, true); err != nil {
		return err
	}
	t.tok = tok
	if in, ok := t.minter.(TokenInjector); ok {
		in.Inject(out, tok)
	} else {
		t.binding.Apply(out, tok)
	}
	return nil
}

// sign signs out with every granted signing credential. It is the last change to out.
func (g *generation) sign(ctx context.Context, out *http.Request, granted []*inject.Binding) error {
	for _, b := range granted {
		if s := g.derived.Signer(b.Name); s != nil {
			if err := s.Sign(ctx, out); err != nil {
				if errors.Is(err, credentials.ErrUnavailable) {
					return err
				}
				// A request the signer cannot sign (its text names the form, never a value).
				return badRequest{fmt.Sprintf("credential %q cannot sign this request: %v", b.Name, err)}
			}
		}
	}
	return nil
}

// renewRejected handles an upstream's 401 to a request sent with minted tokens: a token can be
// revoked or expire early. When the request can be sent again (no body, or one held whole), it
// closes resp, retires the tokens, puts fresh ones in out, rewinds out's body and reports true:
// out is to be sent once more. Otherwise resp is the agent's answer.
func renewRejected(resp *http.Response, out *http.Request, toks []minted) (bool, error) {
	if resp.StatusCode != http.StatusUnauthorized || len(toks) == 0 {
		return false, nil
	}
	// An HTTP/2 request without a body still has a Body (empty, ContentLength 0).
	hasBody := out.Body != nil && out.Body != http.NoBody && out.ContentLength != 0
	if hasBody && out.GetBody == nil {
		return false, nil // the body went upstream as it streamed: it cannot be sent again
	}
	_ = resp.Body.Close()
	for i := range toks {
		toks[i].minter.Reject(toks[i].tok)
		if err := toks[i].put(out.Context(), out); err != nil {
			return false, err
		}
	}
	if hasBody {
		body, err := out.GetBody()
		if err != nil {
			return false, err
		}
		out.Body = body
	}
	return true, nil
}
