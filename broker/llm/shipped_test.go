package llm

import (
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/capbroker/capbroker/policies"
)

// Every endpoint the shipped policy lets agents call on an LLM API's host is metered, or free
// (llm.Free): a tokens budget then never meets a call it cannot count, and the broker need not
// refuse one the shipped policy allows. So are its read paths.
func TestShippedEndpointsMetered(t *testing.T) {
	raw, err := policies.FS.ReadFile("data.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var data struct {
		Settings struct {
			LLM map[string]struct {
				Endpoints []string `yaml:"endpoints"`
				ReadPaths []string `yaml:"read_paths"`
			} `yaml:"llm"`
		} `yaml:"settings"`
	}
	if err := yaml.Unmarshal(raw, &data); err != nil {
		t.Fatal(err)
	}
	if len(data.Settings.LLM) == 0 {
		t.Fatal("no settings.llm in the shipped data")
	}
	var e *Endpoints
	for host, s := range data.Settings.LLM {
		if e.Provider(host) == "" {
			t.Errorf("%s is not known as an LLM API's host", host)
		}
		for _, p := range s.Endpoints {
			if _, ok := e.Match(host, p); !ok && !Free("POST", p, false) {
				t.Errorf("POST %s%s is allowed by the shipped policy but neither metered nor free", host, p)
			}
		}
		for _, p := range s.ReadPaths {
			if !Free("GET", p, false) {
				t.Errorf("GET %s%s is not free", host, p)
			}
		}
	}
}
