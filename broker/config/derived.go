package config

// Derived credentials: the source holds a root secret, and the broker derives what each
// request needs from it (a signature, a minted token). At most one of these is set on a
// credential; with none, the source's value is injected as it is read.

// AWSSigV4 re-signs AWS requests with the root access key (see credentials/aws).
type AWSSigV4 struct{}

// GitHubApp mints GitHub App installation tokens (see credentials/github). The App's private
// key is the credential's source (a PEM), or with Transit a key that never leaves Vault.
type GitHubApp struct {
	AppID          string            `yaml:"app_id"`          // numeric app ID, or the App's client ID
	InstallationID int64             `yaml:"installation_id"` // the installation tokens are minted for
	APIURL         string            `yaml:"api_url"`         // "" is https://api.github.com
	Transit        *GitHubAppTransit `yaml:"transit"`
}

// GitHubAppTransit names the Vault transit key (rsa-2048) that signs the app JWT.
type GitHubAppTransit struct {
	Mount string `yaml:"mount"` // "" is "transit"
	Key   string `yaml:"key"`
}

// OAuth2 obtains OAuth2 access tokens (see credentials/oauth2).
type OAuth2 struct{}

// GoogleServiceAccount turns a service account key into access tokens (see credentials/oauth2).
type GoogleServiceAccount struct{}

// Derived reports whether the credential derives what it sends rather than sending its source's value.
func (c *Credential) Derived() bool {
	return c.AWSSigV4 != nil || c.GitHubApp != nil || c.OAuth2 != nil || c.GoogleServiceAccount != nil
}
