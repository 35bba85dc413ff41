// Package llm meters calls to LLM APIs: it recognises them by host and path, reads the model
// from the request and the token usage from the response (JSON or server-sent events) as the
// response passes through, and hands the call to a usage.Recorder when the response ends.
package llm

import (
	"slices"
	"strings"

	"github.com/capbroker/capbroker/broker/config"
)

// Providers the broker knows without configuration.
const (
	OpenAI    = "openai"
	Anthropic = "anthropic"
	Gemini    = "gemini"
)

// API is the shape of a metered API's requests and responses.
type API int

const (
	ChatCompletions API = iota + 1 // OpenAI /v1/chat/completions and compatible endpoints
	Responses                      // OpenAI /v1/responses
	Messages                       // Anthropic /v1/messages
	GenerateContent                // Gemini models/{model}:generateContent and :streamGenerateContent
	Completions                    // OpenAI /v1/completions (legacy text completions)
	Embeddings                     // OpenAI /v1/embeddings: usage, never streamed
)

// Endpoint is one metered call's API, as recognised from its host and path.
type Endpoint struct {
	Provider string
	API      API
	// Model is the model named by the path (Gemini), or "".
	Model string
	// AskUsage: a streamed chat completion that does not ask for usage may be made to
	// (stream_options.include_usage).
	AskUsage bool
}

// compatible is an OpenAI-compatible endpoint a config names.
type compatible struct {
	name     string
	hosts    []string
	prefix   string
	askUsage bool
	api      API // ChatCompletions (and Responses), or Messages
}

// Endpoints recognises LLM calls. The zero value, and nil, know the built-in providers.
type Endpoints struct {
	compatible []compatible
}

// NewEndpoints knows the built-in providers and the OpenAI-compatible endpoints of a
// validated config (llm.openai_compatible).
func NewEndpoints(cfg config.LLM) *Endpoints {
	e := &Endpoints{}
	for _, c := range cfg.OpenAICompatible {
		hosts := make([]string, len(c.Hosts))
		for i, h := range c.Hosts {
			hosts[i] = strings.ToLower(h)
		}
		e.compatible = append(e.compatible, compatible{
			name: c.Name, hosts: hosts, prefix: strings.TrimSuffix(c.PathOrDefault(), "/"),
			askUsage: c.RequestUsage == nil || *c.RequestUsage, api: ChatCompletions,
		})
	}
	for _, c := range cfg.AnthropicCompatible {
		hosts := make([]string, len(c.Hosts))
		for i, h := range c.Hosts {
			hosts[i] = strings.ToLower(h)
		}
		e.compatible = append(e.compatible, compatible{name: c.Name, hosts: hosts, prefix: strings.TrimSuffix(c.PathOrDefault(), "/"), api: Messages})
	}
	return e
}

// Match returns the endpoint of a request to host (lower case, no port) with path (as the
// broker sends it), or false when it is no metered API.
func (e *Endpoints) Match(host, path string) (Endpoint, bool) {
	switch host {
	case "api.openai.com":
		return openAIPath(OpenAI, "/v1", path, true)
	case "api.anthropic.com":
		if path == "/v1/messages" {
			return Endpoint{Provider: Anthropic, API: Messages}, true
		}
		return Endpoint{}, false
	case "generativelanguage.googleapis.com":
		return geminiPath(path)
	}
	if e == nil {
		return Endpoint{}, false
	}
	for _, c := range e.compatible {
		if !slices.ContainsFunc(c.hosts, func(h string) bool { return config.HostMatches(h, host) }) {
			continue
		}
		if c.api == Messages {
			if path == c.prefix+"/messages" {
				return Endpoint{Provider: c.name, API: Messages}, true
			}
		} else if ep, ok := openAIPath(c.name, c.prefix, path, c.askUsage); ok {
			return ep, true
		}
	}
	return Endpoint{}, false
}

func openAIPath(provider, prefix, path string, askUsage bool) (Endpoint, bool) {
	rest, ok := strings.CutPrefix(path, prefix)
	if !ok {
		return Endpoint{}, false
	}
	switch rest {
	case "/chat/completions":
		return Endpoint{Provider: provider, API: ChatCompletions, AskUsage: askUsage}, true
	case "/responses":
		return Endpoint{Provider: provider, API: Responses}, true
	case "/completions":
		return Endpoint{Provider: provider, API: Completions, AskUsage: askUsage}, true
	case "/embeddings":
		return Endpoint{Provider: provider, API: Embeddings}, true
	}
	return Endpoint{}, false
}

// Provider names the LLM API served at host (lower case, no port): a built-in provider's, or
// the name the config gives an endpoint with that host; "" for any other host. Every request
// to such a host is a metered call, a free one (Free), or, under a tokens or cost budget,
// refused.
func (e *Endpoints) Provider(host string) string {
	switch host {
	case "api.openai.com":
		return OpenAI
	case "api.anthropic.com":
		return Anthropic
	case "generativelanguage.googleapis.com":
		return Gemini
	}
	if e == nil {
		return ""
	}
	for _, c := range e.compatible {
		if slices.ContainsFunc(c.hosts, func(h string) bool { return config.HostMatches(h, host) }) {
			return c.name
		}
	}
	return ""
}

// Free reports whether a request to an LLM API's host that Match does not meter costs no
// tokens: a read (GET or HEAD that is no protocol upgrade: listing models, reading a stored
// response), or counting a prompt's tokens (Anthropic's /v1/messages/count_tokens, Gemini's
// :countTokens). Anything else on an LLM host may spend tokens the broker cannot read.
func Free(method, path string, upgrade bool) bool {
	if (method == "GET" || method == "HEAD") && !upgrade {
		return true
	}
	if method != "POST" {
		return false
	}
	return strings.HasSuffix(path, "/messages/count_tokens") ||
		(strings.Contains(path, "/models/") && strings.HasSuffix(path, ":countTokens"))
}

// geminiPath recognises /{version}/models/{model}:generateContent and :streamGenerateContent.
func geminiPath(path string) (Endpoint, bool) {
	_, rest, ok := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	if !ok {
		return Endpoint{}, false
	}
	rest, ok = strings.CutPrefix(rest, "models/")
	if !ok {
		return Endpoint{}, false
	}
	model, method, ok := strings.Cut(rest, ":")
	if !ok || model == "" || strings.Contains(model, "/") || (method != "generateContent" && method != "streamGenerateContent") {
		return Endpoint{}, false
	}
	return Endpoint{Provider: Gemini, API: GenerateContent, Model: model}, true
}
