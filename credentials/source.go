package credentials

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
)

// ErrUnavailable is wrapped by every failure to produce a credential value.
var ErrUnavailable = errors.New("credential unavailable")

// Source produces the current value of one credential.
type Source interface {
	Fetch(ctx context.Context) (Secret, error)
}

// Env reads the value from an environment variable each time it is fetched.
type Env struct {
	Name string
	// Fields: the value is a JSON object whose string members are the secret's fields.
	Fields bool
}

// Fetch implements Source.
func (e Env) Fetch(context.Context) (Secret, error) {
	v, ok := os.LookupEnv(e.Name)
	if !ok || v == "" {
		return Secret{}, fmt.Errorf("%w: environment variable %s is not set", ErrUnavailable, e.Name)
	}
	if e.Fields {
		s, err := ParseFields([]byte(v))
		if err != nil {
			return Secret{}, fmt.Errorf("environment variable %s: %w", e.Name, err)
		}
		return s, nil
	}
	return NewSecret(v), nil
}

// EnvFields reads a secret with fields from several environment variables, one per field
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN); unset ones are left out.
type EnvFields map[string]string // field name -> variable

// Fetch implements Source.
func (e EnvFields) Fetch(context.Context) (Secret, error) {
	f := make(map[string]string, len(e))
	for field, name := range e {
		f[field] = os.Getenv(name)
	}
	s := NewFields(f)
	if s.IsZero() {
		return Secret{}, fmt.Errorf("%w: none of the environment variables %s is set", ErrUnavailable, strings.Join(slices.Sorted(maps.Values(e)), ", "))
	}
	return s, nil
}

// File reads the value from a file (trailing newlines trimmed), as mounted secrets are.
type File struct {
	Path string
	// Fields: the file holds a JSON object whose string members are the secret's fields.
	Fields bool
}

// Fetch implements Source.
func (f File) Fetch(context.Context) (Secret, error) {
	b, err := os.ReadFile(f.Path)
	if err != nil {
		// The path is not secret; the content never reaches the error.
		return Secret{}, fmt.Errorf("%w: reading %s: %v", ErrUnavailable, f.Path, errors.Unwrap(err))
	}
	v := strings.TrimRight(string(b), "\r\n")
	if v == "" {
		return Secret{}, fmt.Errorf("%w: %s is empty", ErrUnavailable, f.Path)
	}
	if f.Fields {
		s, err := ParseFields(b)
		if err != nil {
			return Secret{}, fmt.Errorf("%s: %w", f.Path, err)
		}
		return s, nil
	}
	return NewSecret(v), nil
}

var (
	_ Source = Env{}
	_ Source = File{}
	_ Source = EnvFields{}
)
