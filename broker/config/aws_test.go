package config

import (
	"maps"
	"testing"
)

func TestAWSSigV4Config(t *testing.T) {
	c, err := Parse([]byte(`ca: {cert_file: ca.crt, key_file: ca.key}
policy: {dir: p}
vault:
  address: http://127.0.0.1:8200
  auth: {method: token, token_env: VAULT_TOKEN}
credentials:
  - name: aws-env
    hosts: ["*.amazonaws.com"]
    aws_sigv4: {}
  - name: aws-vault
    hosts: ["s3.eu-west-1.amazonaws.com"]
    source: {vault: {path: aws/creds/deploy, lease: true}}
    aws_sigv4: {region: eu-west-1, service: s3}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Credentials[0].Source.EnvFields; !maps.Equal(got, AWSEnvFields) {
		t.Errorf("default source = %v, want the standard AWS variables", got)
	}
	if !c.Credentials[0].Derived() || c.Credentials[1].AWSSigV4.Region != "eu-west-1" {
		t.Errorf("decoded: %+v", c.Credentials)
	}
	if c.Credentials[1].Source.EnvFields != nil {
		t.Error("a vault source got the default env_fields too")
	}
}
