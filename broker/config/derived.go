package config

// Derived credentials: the source holds a root secret, and the broker derives what each
// request needs from it (a signature, a minted token). At most one of these is set on a
// credential; with none, the source's value is injected as it is read.

// AWSSigV4 re-signs AWS requests with the root access key (see credentials/aws). The source
// is read whole, as fields: access key id, secret key and optional session token, under the
// names AWS, Vault's AWS engine or a KV secret use (access_key_id or access_key,
// secret_access_key or secret_key, session_token or security_token). With no source, the
// broker's AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN are read. The
// credential has no inject: requests to its hosts are signed.
type AWSSigV4 struct {
	// Region and Service, when set, are signed for instead of those of the agent's
	// credential scope.
	Region  string `yaml:"region"`
	Service string `yaml:"service"`
}

// AWSEnvFields is an aws_sigv4 credential's source when it names none: the standard variables.
var AWSEnvFields = map[string]string{
	"access_key_id":     "AWS_ACCESS_KEY_ID",
	"secret_access_key": "AWS_SECRET_ACCESS_KEY",
	"session_token":     "AWS_SESSION_TOKEN",
}

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

// OAuth2 obtains OAuth2 access tokens (see credentials/oauth2). The credential's source holds
// the client secret, or the PEM private key for private_key_jwt.
type OAuth2 struct {
	TokenURL      string            `yaml:"token_url"`
	Grant         string            `yaml:"grant"`       // client_credentials (default) | refresh_token
	ClientID      string            `yaml:"client_id"`   //
	ClientAuth    string            `yaml:"client_auth"` // client_secret_basic (default) | client_secret_post | private_key_jwt
	PrivateKeyJWT *PrivateKeyJWT    `yaml:"private_key_jwt"`
	Scopes        []string          `yaml:"scopes"` // default; a grant's {"scopes": [...]} may only narrow them
	Params        map[string]string `yaml:"params"` // extra token request parameters (audience, resource)
	RefreshToken  *Source           `yaml:"refresh_token"`
}

// PrivateKeyJWT is how the client assertion of private_key_jwt is signed.
type PrivateKeyJWT struct {
	Alg   string `yaml:"alg"`    // RS256 (default), RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512, EdDSA
	KeyID string `yaml:"key_id"` // the assertion's "kid"
}

// GoogleServiceAccount turns a service account key into access tokens (see credentials/oauth2).
// The credential's source holds the JSON key.
type GoogleServiceAccount struct {
	Scopes  []string `yaml:"scopes"`
	Subject string   `yaml:"subject"` // a user to impersonate (domain-wide delegation)
}

// Derived reports whether the credential derives what it sends rather than sending its source's value.
func (c *Credential) Derived() bool {
	return c.AWSSigV4 != nil || c.GitHubApp != nil || c.OAuth2 != nil || c.GoogleServiceAccount != nil
}
