package credentials

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
)

// ErrUnavailable is wrapped by every failure to produce a credential value.
var ErrUnavailable = errors.New("credential unavailable")

// Source produces the current value of one credential.
type Source interface {
	Fetch(ctx context.Context) (Secret, error)
}

// Env reads the value from an environment variable each time it is fetched.
type Env struct{ Name string }

// Fetch implements Source.
func (e Env) Fetch(context.Context) (Secret, error) {
	v, ok := os.LookupEnv(e.Name)
	if !ok || v == "" {
		return Secret{}, fmt.Errorf("%w: environment variable %s is not set", ErrUnavailable, e.Name)
	}
	return NewSecret(v), nil
}

// File reads the value from a file (trailing newlines trimmed), as mounted secrets are.
type File struct{ Path string }

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
	return NewSecret(v), nil
}

var (
	_ Source = Env{}
	_ Source = File{}
)
