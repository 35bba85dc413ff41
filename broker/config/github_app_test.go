package config

import (
	"strings"
	"testing"
)

func TestGitHubAppConfig(t *testing.T) {
	const head = "ca: {cert_file: a, key_file: b}\npolicy: {dir: p}\n"
	const vault = "vault: {address: \"http://127.0.0.1:8200\", auth: {method: token, token_env: VT}}\n"
	cases := map[string]struct {
		yaml string
		want []string // every error line expected; none means valid
	}{
		"kv key": {yaml: vault + `credentials:
  - name: gh_app
    hosts: [api.github.com, github.com]
    source: {vault: {mount: secret, path: github-app, field: private_key}}
    github_app: {app_id: 12345, installation_id: 678}`},
		"transit, GHES": {yaml: vault + `credentials:
  - name: gh_app
    hosts: [ghe.example.com]
    github_app:
      app_id: Iv1.abc123
      installation_id: 9
      api_url: https://ghe.example.com/api/v3
      transit: {mount: transit, key: github-app}`},
		"transit needs vault": {yaml: `credentials:
  - name: gh_app
    hosts: [github.com]
    github_app: {app_id: 1, installation_id: 2, transit: {key: k}}`, want: []string{"vault: required"}},
		"everything wrong": {yaml: vault + `credentials:
  - name: gh_app
    hosts: [github.com]
    source: {env: GH_KEY}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
    github_app: {app_id: "a b", api_url: "http://api.github.com", transit: {}}`, want: []string{
			`credentials[0].source: not used with github_app.transit: the key stays in Vault`,
			`credentials[0].github_app.app_id: "a b" must be the numeric app ID or the App's client ID`,
			`credentials[0].github_app.installation_id: required (a positive number)`,
			`credentials[0].github_app.api_url: must be an https:// URL, not "http://api.github.com"`,
			`credentials[0].github_app.transit.key: required: the transit key (rsa-2048) that signs the app JWT`,
			`credentials[0].inject: not used with github_app: the token goes as Bearer for the API and Basic x-access-token for git`,
		}},
		"no key at all": {yaml: `credentials:
  - name: gh_app
    hosts: [github.com]
    github_app: {installation_id: 2}`, want: []string{
			`credentials[0].source: required: one of vault, env, file`,
			`credentials[0].github_app.app_id: required`,
		}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			cfg, err := Parse([]byte(head + c.yaml))
			if len(c.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if cfg.Credentials[0].GitHubApp == nil || cfg.Credentials[0].GitHubApp.AppID == "" {
					t.Fatal("github_app not decoded")
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			got := strings.Split(err.Error(), "\n")
			if len(got) != len(c.want) {
				t.Fatalf("got %d errors, want %d:\n%s", len(got), len(c.want), err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("missing %q in:\n%s", w, err)
				}
			}
		})
	}
}
