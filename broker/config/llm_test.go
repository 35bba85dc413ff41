package config

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestValidateLLM(t *testing.T) {
	const base = "ca: {cert_file: ca.pem, key_file: ca.key}\npolicy: {dir: policies}\n"
	cases := map[string]struct {
		yaml string
		want []string // key paths of the problems
	}{
		"good":         {`[{name: vllm, hosts: [llm.internal, "*.example.com"], path_prefix: /openai/v1, request_usage: false}]`, nil},
		"no name":      {`[{hosts: [a.internal]}]`, []string{"llm.openai_compatible[0].name"}},
		"builtin name": {`[{name: openai, hosts: [a.internal]}]`, []string{"llm.openai_compatible[0].name"}},
		"twice":        {`[{name: a, hosts: [a.internal]}, {name: a, hosts: [b.internal]}]`, []string{"llm.openai_compatible[1].name"}},
		"no hosts":     {`[{name: a}]`, []string{"llm.openai_compatible[0].hosts"}},
		"bad host":     {`[{name: a, hosts: ["https://a.internal/"]}]`, []string{"llm.openai_compatible[0].hosts[0]"}},
		"bad prefix":   {`[{name: a, hosts: [a.internal], path_prefix: v1}]`, []string{"llm.openai_compatible[0].path_prefix"}},
		"anthropic":    {"[{name: a, hosts: [a.internal]}]\n  anthropic_compatible: [{name: b, hosts: [a.internal]}]", nil},
		"anthropic dup": {"[{name: a, hosts: [a.internal]}]\n  anthropic_compatible: [{name: a, hosts: [a.internal], request_usage: true}]",
			[]string{"llm.anthropic_compatible[0].request_usage", "llm.anthropic_compatible[0].name"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(base + "llm:\n  openai_compatible: " + c.yaml + "\n"))
			var got []string
			var ps Problems
			if errors.As(err, &ps) {
				for _, p := range ps {
					got = append(got, p.Path)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("problems at %q, want %q: %v", got, c.want, err)
			}
			if err != nil && !strings.Contains(err.Error(), "(line ") {
				t.Errorf("no line in %v", err)
			}
		})
	}
}

// A credential substituted into request bodies may not be sent to an LLM API's host (built in,
// or a compatible endpoint, by any overlap of host patterns).
func TestBodyOnLLMHost(t *testing.T) {
	const base = "ca: {cert_file: ca.pem, key_file: ca.key}\npolicy: {dir: policies}\nllm:\n  openai_compatible: [{name: vllm, hosts: [\"*.inference.example\", llm.internal]}]\n"
	cred := func(hosts string, body bool) string {
		return "credentials:\n  - {name: c, hosts: " + hosts + ", source: {env: C}, inject: {placeholder: PLACEHOLDER_c_12345, body: " + map[bool]string{true: "true", false: "false"}[body] + "}}\n"
	}
	cases := map[string]struct {
		yaml string
		bad  bool
	}{
		"openai":             {cred("[api.openai.com]", true), true},
		"anthropic":          {cred("[a.example, api.anthropic.com]", true), true},
		"compatible":         {cred("[llm.internal]", true), true},
		"under a wildcard":   {cred("[a.inference.example]", true), true},
		"wildcard over":      {cred(`["*.example"]`, true), true},
		"wildcard under":     {cred(`["*.a.inference.example"]`, true), true},
		"header placeholder": {cred("[api.openai.com]", false), false},
		"another host":       {cred("[api.example.com]", true), false},
		"apex":               {cred("[inference.example]", true), false},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(base + c.yaml))
			var ps Problems
			got := false
			if errors.As(err, &ps) {
				for _, p := range ps {
					got = got || p.Path == "credentials[0].inject.body"
				}
			}
			if got != c.bad {
				t.Errorf("refused %v, want %v: %v", got, c.bad, err)
			}
		})
	}
}
