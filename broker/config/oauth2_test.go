package config

import "testing"

func TestOAuth2Config(t *testing.T) {
	c, err := Parse([]byte(`
ca: {cert_file: a, key_file: b}
policy: {dir: p}
vault: {address: "http://127.0.0.1:8200", auth: {method: token, token_env: VAULT_TOKEN}}
credentials:
  - name: api
    hosts: [api.example.com]
    source: {file: /run/key.pem}
    oauth2:
      token_url: https://auth.example.com/token
      grant: refresh_token
      client_id: broker
      client_auth: private_key_jwt
      private_key_jwt: {alg: ES256, key_id: k1}
      scopes: [read, write]
      params: {audience: "https://api.example.com"}
      refresh_token: {vault: {mount: secret, path: oauth/api, field: refresh_token}}
  - name: gcs
    hosts: [storage.googleapis.com]
    source: {env: GCP_KEY}
    google_service_account: {scopes: ["https://www.googleapis.com/auth/cloud-platform"]}
`))
	if err != nil {
		t.Fatal(err)
	}
	o := c.Credentials[0].OAuth2
	if o.PrivateKeyJWT.KeyID != "k1" || o.RefreshToken.Vault.Field != "refresh_token" || o.Params["audience"] == "" {
		t.Errorf("decoded %+v", o)
	}
	for _, cr := range c.Credentials {
		if cr.Inject.Header != "Authorization" || cr.Inject.Value != "Bearer {{secret}}" {
			t.Errorf("%s: inject default %+v", cr.Name, cr.Inject)
		}
	}
}
