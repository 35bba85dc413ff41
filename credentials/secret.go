// Package credentials is where secrets come from: environment variables, files, and HashiCorp
// Vault (KV v1/v2 and dynamic secrets with leases, see Vault). A Store caches the values,
// refreshes them, keeps serving them through a Vault outage up to a limit, and remembers
// rotated-out values for scrubbing. It knows nothing of the broker's pipeline; the broker asks
// it for values by credential name.
package credentials

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
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
	// fields holds the parts of a secret with several (an AWS access key id, secret key and
	// session token), by name; v is then their JSON object, so that comparing and caching
	// values works alike for both kinds. Never modified once made.
	fields map[string]string
	// For values with a lifetime (Vault leases): refreshBy is when the Store must ask the
	// source again even if its refresh interval has not passed, expires is when the value
	// stops working and must no longer be served. Zero means no such limit.
	refreshBy, expires time.Time
}

// NewSecret wraps a value.
func NewSecret(v string) Secret { return Secret{v: v} }

// NewFields wraps a secret made of several named values (empty ones are dropped). It is zero
// when every value is empty.
func NewFields(fields map[string]string) Secret {
	f := make(map[string]string, len(fields))
	for k, v := range fields {
		if v != "" {
			f[k] = v
		}
	}
	if len(f) == 0 {
		return Secret{}
	}
	b, _ := json.Marshal(f) // sorted keys: equal fields give equal values
	return Secret{v: string(b), fields: f}
}

// ParseFields reads a JSON object of strings (other members are ignored) as a secret with
// fields. The error never quotes the input.
func ParseFields(b []byte) (Secret, error) {
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil || raw == nil {
		return Secret{}, fmt.Errorf("%w: not a JSON object", ErrUnavailable)
	}
	f := make(map[string]string, len(raw))
	for k, v := range raw {
		if s, ok := v.(string); ok {
			f[k] = s
		}
	}
	s := NewFields(f)
	if s.IsZero() {
		return Secret{}, fmt.Errorf("%w: JSON object has no string member", ErrUnavailable)
	}
	return s, nil
}

// Field returns the named part of a secret with fields ("" and false when it has none).
func (s Secret) Field(name string) (string, bool) {
	v, ok := s.fields[name]
	return v, ok
}

// HasFields reports whether the secret is made of named parts (NewFields).
func (s Secret) HasFields() bool { return s.fields != nil }

// FieldNames returns the names of the parts of a secret with fields, sorted.
func (s Secret) FieldNames() []string { return slices.Sorted(maps.Keys(s.fields)) }

// minFieldValue is the shortest part of a secret with fields that Values returns. A shorter
// one (a version number, a region) is no secret, and scrubbing it would corrupt responses.
const minFieldValue = 8

// Values returns what must be scrubbed from responses for this secret: the value itself, or
// for a secret with fields each part of it at least 8 bytes long (never the JSON object,
// which is not what an upstream would echo).
func (s Secret) Values() []Secret {
	if s.fields == nil {
		if s.v == "" {
			return nil
		}
		return []Secret{{v: s.v}}
	}
	out := make([]Secret, 0, len(s.fields))
	for _, name := range s.FieldNames() {
		if v := s.fields[name]; len(v) >= minFieldValue && !slices.ContainsFunc(out, func(o Secret) bool { return o.v == v }) {
			out = append(out, Secret{v: v})
		}
	}
	return out
}

// expiringSecret wraps a value that must be fetched again by refreshBy and is unusable after
// expires (zero times mean no limit).
func expiringSecret(v string, refreshBy, expires time.Time) Secret {
	return NewSecret(v).expiring(refreshBy, expires)
}

// expiring is s with the limits of its lifetime set.
func (s Secret) expiring(refreshBy, expires time.Time) Secret {
	s.refreshBy, s.expires = refreshBy, expires
	return s
}

// Until returns s marked as unusable after t: a minted token's end, which the broker keeps
// scrubbing it until.
func (s Secret) Until(t time.Time) Secret {
	s.expires = t
	return s
}

// Expires returns when the value stops working (a minted token's end, a Vault lease's), or
// zero when that is not known.
func (s Secret) Expires() time.Time { return s.expires }

// Reveal returns the value (for a secret with fields, their JSON object). Call it only where
// the value is put on the wire.
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
