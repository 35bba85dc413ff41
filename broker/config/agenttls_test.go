package config

import (
	"crypto/tls"
	"errors"
	"slices"
	"testing"
)

// TestAgentCurves: tls.agent_curves takes crypto/tls's names in any case, in order; an
// unknown or repeated one is refused at its key path; none leaves crypto/tls's default.
func TestAgentCurves(t *testing.T) {
	const base = "ca: {cert_file: ca.pem, key_file: ca.key}\npolicy: {dir: policies}\n"
	cases := map[string]struct {
		yaml  string
		want  []tls.CurveID
		wrong []string
	}{
		"default":       {"", nil, nil},
		"x25519 only":   {"tls: {agent_curves: [X25519]}\n", []tls.CurveID{tls.X25519}, nil},
		"hybrid first":  {"tls: {agent_curves: [x25519mlkem768, x25519, CurveP256]}\n", []tls.CurveID{tls.X25519MLKEM768, tls.X25519, tls.CurveP256}, nil},
		"unknown":       {"tls: {agent_curves: [X448]}\n", nil, []string{"tls.agent_curves[0]"}},
		"twice":         {"tls: {agent_curves: [X25519, x25519]}\n", nil, []string{"tls.agent_curves[1]"}},
		"empty element": {"tls: {agent_curves: [\"\"]}\n", nil, []string{"tls.agent_curves[0]"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			cfg, err := Parse([]byte(base + c.yaml))
			var got []string
			var ps Problems
			if errors.As(err, &ps) {
				for _, p := range ps {
					got = append(got, p.Path)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.wrong) {
				t.Fatalf("problems at %q, want %q: %v", got, c.wrong, err)
			}
			if err == nil && !slices.Equal(cfg.TLS.Curves(), c.want) {
				t.Errorf("curves %v, want %v", cfg.TLS.Curves(), c.want)
			}
		})
	}
}
