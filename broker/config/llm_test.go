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
