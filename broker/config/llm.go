package config

import (
	"fmt"
	"regexp"
	"strings"
)

// LLM configures metering of LLM calls (docs/llm.md). The OpenAI, Anthropic and Gemini APIs
// are known without it.
type LLM struct {
	OpenAICompatible []OpenAICompatible `yaml:"openai_compatible"`
	// AnthropicCompatible are endpoints that speak Anthropic's messages API
	// ({path_prefix}/messages); request_usage does not apply to them.
	AnthropicCompatible []OpenAICompatible `yaml:"anthropic_compatible"`
}

// OpenAICompatible is an endpoint that speaks OpenAI's chat completions and responses APIs.
type OpenAICompatible struct {
	// Name is the provider name in audit events, metrics and usage.
	Name string `yaml:"name"`
	// Hosts are host names, or *.domain.
	Hosts []string `yaml:"hosts"`
	// PathPrefix is what precedes /chat/completions and /responses (default /v1).
	PathPrefix string `yaml:"path_prefix"`
	// RequestUsage lets the broker ask for usage in streams that do not (default true); set
	// false for a server that refuses stream_options.
	RequestUsage *bool `yaml:"request_usage"`
}

// PathOrDefault is PathPrefix, or /v1 when it is not set.
func (c OpenAICompatible) PathOrDefault() string {
	if c.PathPrefix == "" {
		return "/v1"
	}
	return c.PathPrefix
}

var providerNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

func (c *Config) validateLLM(e *errs) {
	seen := map[string]bool{"openai": true, "anthropic": true, "gemini": true}
	for i, oc := range append(c.LLM.OpenAICompatible[:len(c.LLM.OpenAICompatible):len(c.LLM.OpenAICompatible)], c.LLM.AnthropicCompatible...) {
		p := fmt.Sprintf("llm.openai_compatible[%d]", i)
		if j := i - len(c.LLM.OpenAICompatible); j >= 0 {
			p = fmt.Sprintf("llm.anthropic_compatible[%d]", j)
			if oc.RequestUsage != nil {
				e.add(p+".request_usage", "only for openai_compatible: Anthropic streams always report usage")
			}
		}
		switch {
		case !providerNameRe.MatchString(oc.Name):
			e.add(p+".name", "must be 1 to 32 lower-case letters, digits, - or _, not %q", oc.Name)
		case seen[oc.Name]:
			e.add(p+".name", "%q is already a provider's name", oc.Name)
		}
		seen[oc.Name] = true
		if len(oc.Hosts) == 0 {
			e.add(p+".hosts", "required")
		}
		for j, h := range oc.Hosts {
			if err := checkHostPattern(h); err != nil {
				e.add(fmt.Sprintf("%s.hosts[%d]", p, j), "%v", err)
			}
		}
		if pp := oc.PathPrefix; pp != "" && (!strings.HasPrefix(pp, "/") || strings.ContainsAny(pp, "?#%") || strings.Contains(pp, "//")) {
			e.add(p+".path_prefix", "must be a path starting with /, without query or escapes, not %q", pp)
		}
	}
	c.validateBodyOnLLM(e)
}

// LLMHosts are the hosts of the LLM APIs the broker knows: the built-in providers' and the
// configured compatible endpoints' (patterns as the config spells them).
func (c *Config) LLMHosts() []string {
	hosts := []string{"api.openai.com", "api.anthropic.com", "generativelanguage.googleapis.com"}
	for _, oc := range append(c.LLM.OpenAICompatible[:len(c.LLM.OpenAICompatible):len(c.LLM.OpenAICompatible)], c.LLM.AnthropicCompatible...) {
		hosts = append(hosts, oc.Hosts...)
	}
	return hosts
}

// validateBodyOnLLM refuses a credential substituted into request bodies (inject.body) that
// may be sent to an LLM API's host: a prompt carrying the secret reaches the model, which can
// stream it back a few characters per event, where no scrubber sees it whole (docs/llm.md).
func (c *Config) validateBodyOnLLM(e *errs) {
	llm := c.LLMHosts()
next:
	for i, cr := range c.Credentials {
		if !cr.Inject.Body || cr.Inject.Placeholder == "" {
			continue
		}
		for _, h := range cr.Hosts {
			for _, l := range llm {
				if hostsOverlap(h, l) {
					e.add(fmt.Sprintf("credentials[%d].inject.body", i), "the credential may be sent to %q, an LLM API's host (%s): a secret substituted into a prompt can come back streamed a few characters per event, which the broker cannot scrub; substitute it in a header instead", h, l)
					continue next
				}
			}
		}
	}
}

// hostsOverlap reports whether some host is named by both patterns (HostMatches).
func hostsOverlap(a, b string) bool {
	if a == b || HostMatches(a, b) || HostMatches(b, a) {
		return true
	}
	sa, wa := strings.CutPrefix(a, "*")
	sb, wb := strings.CutPrefix(b, "*")
	return wa && wb && (strings.HasSuffix(sa, sb) || strings.HasSuffix(sb, sa))
}
