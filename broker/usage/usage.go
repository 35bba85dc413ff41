// Package usage is what metered LLM calls cost: the calls read from responses (broker/llm) and
// the counters budgets are kept with (broker/budget) meet here.
package usage

// Call is one LLM call, metered from its response once the response has ended (or the agent
// went away).
type Call struct {
	RequestID string
	Agent     string
	Labels    map[string]string
	// Provider is "openai", "anthropic", "gemini", or the name a config gives an
	// OpenAI-compatible endpoint.
	Provider string
	Model    string
	// Tokens as the provider reported them; Cached is the part of In served from its cache.
	In, Out, Cached int64
	// Reported is false when the response carried no usage, or usage that did not parse: the
	// call is counted as such, never guessed.
	Reported bool
	// Estimated is true for a stream the broker cut at a hard budget before its usage came:
	// In and Out are then what it let through, the output estimated from the text, and are
	// counted, so that cut calls cannot each take a budget's whole remainder again.
	Estimated bool
}

// A Recorder takes the usage of each metered call and returns what it cost (0 when the price
// is unknown), for the audit event.
type Recorder interface {
	Record(c Call) (cost float64)
}
