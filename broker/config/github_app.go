package config

import (
	"net/url"
	"regexp"
	"strings"
)

var appIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// validate checks a github_app credential at path p; it reports whether it signs with Vault.
// Its token is injected by the kind itself (Bearer for the API, Basic for git), so no inject.
func (g *GitHubApp) validate(e *errs, p string, in Inject) (usesVault bool) {
	c := p + ".github_app"
	if g.AppID == "" {
		e.add(c+".app_id", "required")
	} else if !appIDRe.MatchString(g.AppID) {
		e.add(c+".app_id", "%q must be the numeric app ID or the App's client ID", g.AppID)
	}
	if g.InstallationID <= 0 {
		e.add(c+".installation_id", "required (a positive number)")
	}
	if g.APIURL != "" {
		if u, err := url.Parse(g.APIURL); err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" {
			e.add(c+".api_url", "must be an https:// URL, not %q", g.APIURL)
		}
	}
	if t := g.Transit; t != nil {
		if t.Key == "" {
			e.add(c+".transit.key", "required: the transit key (rsa-2048) that signs the app JWT")
		}
		if strings.Contains(t.Key, "/") {
			e.add(c+".transit.key", "%q must be a key name", t.Key)
		}
		usesVault = true
	}
	if in != (Inject{}) {
		e.add(p+".inject", "not used with github_app: the token goes as Bearer for the API and Basic x-access-token for git")
	}
	return usesVault
}
