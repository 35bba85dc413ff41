package github

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

const (
	// jwtBackdate is how far in the past the app JWT says it was issued, as GitHub advises,
	// so a clock slightly ahead of GitHub's is not refused.
	jwtBackdate = 60 * time.Second
	// jwtLifetime is how long after now the app JWT expires. GitHub refuses more than 10
	// minutes; the broker needs one request's worth.
	jwtLifetime = 9 * time.Minute
)

// appJWT returns the app's JWT (RS256, iss = app ID) issued at GitHub's now, which is ours
// plus skew. The private key is either the PEM the root getter returns or, with transit,
// never seen: Vault signs.
func (a *App) appJWT(ctx context.Context, skew time.Duration) (string, error) {
	now := a.now().Add(skew)
	claims := jwt.MapClaims{
		"iat": now.Add(-jwtBackdate).Unix(),
		"exp": now.Add(jwtLifetime).Unix(),
		"iss": a.iss,
	}
	t := jwt.NewWithClaims(jwt.SigningMethodRS256, claims)
	if a.opts.SignRS256 != nil {
		input, err := t.SigningString()
		if err != nil {
			return "", err
		}
		sig, err := a.opts.SignRS256(ctx, []byte(input))
		if err != nil {
			return "", err
		}
		return input + "." + base64.RawURLEncoding.EncodeToString(sig), nil
	}
	pem, err := a.opts.PrivateKey(ctx)
	if err != nil {
		return "", err
	}
	key, err := jwt.ParseRSAPrivateKeyFromPEM([]byte(pem.Reveal()))
	if err != nil {
		// The parser's message never quotes the key; ours does not either.
		return "", fmt.Errorf("the private key is not an RSA private key in PEM form")
	}
	return t.SignedString(key)
}

// issuer is the JWT's iss claim: a numeric app ID as a number (as GitHub's examples send
// it), a client ID as a string.
func issuer(appID string) any {
	if n, err := strconv.ParseInt(appID, 10, 64); err == nil {
		return n
	}
	return appID
}
