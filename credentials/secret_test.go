package credentials

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

const canary = "sk-canary-do-not-print"

func TestSecretRedactsItself(t *testing.T) {
	s := NewSecret(canary)
	var zl bytes.Buffer
	logger := zerolog.New(&zl)
	logger.Info().Object("s", s).Interface("i", s).Msg("x")
	j, _ := json.Marshal(map[string]any{"s": s})
	outputs := map[string]string{
		"%v":      fmt.Sprintf("%v", s),
		"%s":      fmt.Sprintf("%s", s),
		"%+v":     fmt.Sprintf("%+v", struct{ S Secret }{s}),
		"%#v":     fmt.Sprintf("%#v", s),
		"%q":      fmt.Sprintf("%q", s),
		"error":   fmt.Errorf("wrapped: %v", s).Error(),
		"json":    string(j),
		"zerolog": zl.String(),
	}
	for name, out := range outputs {
		if strings.Contains(out, canary) || !strings.Contains(out, "[REDACTED]") {
			t.Errorf("%s: %q", name, out)
		}
	}
	if s.Reveal() != canary {
		t.Fatal("Reveal")
	}
}

func TestSourcesNeverPutValuesInErrors(t *testing.T) {
	_, err := Env{Name: "CAPBROKER_TEST_UNSET"}.Fetch(t.Context())
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "CAPBROKER_TEST_UNSET") {
		t.Fatalf("env: %v", err)
	}
	t.Setenv("CAPBROKER_TEST_SET", canary)
	if v, err := (Env{Name: "CAPBROKER_TEST_SET"}).Fetch(t.Context()); err != nil || v.Reveal() != canary {
		t.Fatalf("env: %v", err)
	}
	_, err = File{Path: t.TempDir() + "/missing"}.Fetch(t.Context())
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("file: %v", err)
	}
}
