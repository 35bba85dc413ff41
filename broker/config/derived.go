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

// GitHubApp mints GitHub App installation tokens (see credentials/github).
type GitHubApp struct{}

// OAuth2 obtains OAuth2 access tokens (see credentials/oauth2).
type OAuth2 struct{}

// GoogleServiceAccount turns a service account key into access tokens (see credentials/oauth2).
type GoogleServiceAccount struct{}

// Derived reports whether the credential derives what it sends rather than sending its source's value.
func (c *Credential) Derived() bool {
	return c.AWSSigV4 != nil || c.GitHubApp != nil || c.OAuth2 != nil || c.GoogleServiceAccount != nil
}
