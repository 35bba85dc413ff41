package policy

import "slices"

// Reasons for the checks the broker makes after the policy has allowed a request. They are
// the texts the broker writes in the audit event and shows the agent.
const (
	ReasonOpaqueTunnelCredentials = "credentials cannot be injected into an opaque tunnel (intercept: false)"
	ReasonCredentialNotBound      = "the policy granted a credential that may not be sent to this host"
	ReasonCredentialsNeedHTTPS    = "credentials are only sent over HTTPS"
)

// Effective applies to a decision the checks the broker makes after the policy, from what
// the input carries: an opaque tunnel (connect phase, intercept false) carries no credentials;
// every granted credential must be one of input.credentials (the configured credentials
// whose hosts match the request's host); credentials are only sent over https. It is what
// `broker policy eval` prints and what `broker policy replay` compares, so that both show
// what the broker would do, not only what the policy said. An ask is checked as the allow an
// approval would make of it: a person is not asked about a request that would be refused.
func Effective(input any, d Decision) Decision {
	if !d.Allow && d.Ask == nil {
		return d
	}
	doc, _ := input.(map[string]any)
	req, _ := doc["request"].(map[string]any)
	deny := func(reason string) Decision {
		d.Allow, d.Reason, d.Credentials, d.Scopes, d.Ask = false, reason, nil, nil, nil
		return d
	}
	if doc["phase"] == PhaseConnect {
		if !d.Intercept && len(d.Credentials) > 0 {
			return deny(ReasonOpaqueTunnelCredentials)
		}
		d.Credentials, d.Scopes = nil, nil // nothing is injected at connect time
		return d
	}
	var bound []string
	if list, ok := doc["credentials"].([]any); ok {
		for _, c := range list {
			if s, ok := c.(string); ok {
				bound = append(bound, s)
			}
		}
	} else if list, ok := doc["credentials"].([]string); ok {
		bound = list
	}
	for _, c := range d.Credentials {
		if !slices.Contains(bound, c) {
			return deny(ReasonCredentialNotBound)
		}
	}
	if scheme, _ := req["scheme"].(string); len(d.Credentials) > 0 && scheme != "https" {
		return deny(ReasonCredentialsNeedHTTPS)
	}
	return d
}
