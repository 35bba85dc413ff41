// Package credentials is where secrets come from: environment variables, files, and HashiCorp
// Vault (KV v1/v2 and dynamic secrets with leases, see Vault). A Store caches the values,
// refreshes them, keeps serving them through a Vault outage up to a limit, and remembers
// rotated-out values for scrubbing. It knows nothing of the broker's pipeline; the broker asks
// it for values by credential name.
package credentials

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/rs/zerolog"
)

// redacted is what a Secret prints as, wherever it ends up.
const redacted = "[REDACTED]"

// Secret holds a credential value. It redacts itself in fmt, JSON and zerolog, so a value that
// slips into a log line or an error shows as [REDACTED]. Only Reveal returns the value, and only
// the injection step calls it.
type Secret struct {
	v string
	// For values with a lifetime (Vault leases): refreshBy is when the Store must ask the
	// source again even if its refresh interval has not passed, expires is when the value
	// stops working and must no longer be served. Zero means no such limit.
	refreshBy, expires time.Time
}

// NewSecret wraps a value.
func NewSecret(v string) Secret { return Secret{v: v} }

// expiringSecret wraps a value that must be fetched again by refreshBy and is unusable after
// expires (zero times mean no limit).
func expiringSecret(v string, refreshBy, expires time.Time) Secret {
	return Secret{v: v, refreshBy: refreshBy, expires: expires}
}

// Reveal returns the value. Call it only where the value is put on the wire.
func (s Secret) Reveal() string { return s.v }

// IsZero reports whether the secret is empty.
func (s Secret) IsZero() bool { return s.v == "" }

func (Secret) String() string                        { return redacted }
func (Secret) GoString() string                      { return redacted }
func (Secret) Format(f fmt.State, _ rune)            { _, _ = f.Write([]byte(redacted)) }
func (Secret) MarshalJSON() ([]byte, error)          { return json.Marshal(redacted) }
func (Secret) MarshalText() ([]byte, error)          { return []byte(redacted), nil }
func (Secret) MarshalZerologObject(e *zerolog.Event) { e.Str("secret", redacted) }

var (
	_ fmt.Stringer               = Secret{}
	_ fmt.Formatter              = Secret{}
	_ json.Marshaler             = Secret{}
	_ zerolog.LogObjectMarshaler = Secret{}
)
