// Package credentials is where secrets come from: environment variables and files now, Vault later.
// It knows nothing of the broker's pipeline; the broker asks it for values by credential name.
package credentials

import (
	"encoding/json"
	"fmt"

	"github.com/rs/zerolog"
)

// redacted is what a Secret prints as, wherever it ends up.
const redacted = "[REDACTED]"

// Secret holds a credential value. It redacts itself in fmt, JSON and zerolog, so a value that
// slips into a log line or an error shows as [REDACTED]. Only Reveal returns the value, and only
// the injection step calls it.
type Secret struct{ v string }

// NewSecret wraps a value.
func NewSecret(v string) Secret { return Secret{v: v} }

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
