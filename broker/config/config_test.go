package config

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the testdata/*.errors golden files")

// TestBadConfigs checks each testdata/*.yaml that has a *.errors file beside it: loading must
// fail with exactly those lines, in order (go test -update rewrites them).
func TestBadConfigs(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.errors")
	if len(files) == 0 {
		t.Fatal("no testdata")
	}
	for _, ef := range files {
		name := strings.TrimSuffix(filepath.Base(ef), ".errors")
		t.Run(name, func(t *testing.T) {
			want, _ := os.ReadFile(ef)
			_, err := Load(filepath.Join("testdata", name+".yaml"))
			if err == nil {
				t.Fatal("config loaded, want errors")
			}
			got := strings.TrimSpace(err.Error())
			if *update {
				if err := os.WriteFile(ef, []byte(got+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if w := strings.TrimSpace(string(want)); got != w {
				t.Fatalf("errors differ.\n got:\n%s\nwant:\n%s", got, w)
			}
		})
	}
}

func TestValidConfig(t *testing.T) {
	c, err := Load("testdata/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Admin.Listen != "127.0.0.1:9090" || c.Policy.Mode != ModeMonitor || len(c.Credentials) != 4 {
		t.Fatalf("decoded: %+v", c)
	}
	if c.Vault.RefreshInterval != time.Minute || c.Vault.MaxStale != 15*time.Minute {
		t.Fatalf("vault defaults: %+v", c.Vault)
	}
	if c.Credentials[0].Source.Vault.KVVersion != 2 {
		t.Fatal("kv_version default")
	}
}

func TestBundleConfig(t *testing.T) {
	c, err := Parse([]byte(`ca: {cert_file: ca.crt, key_file: ca.key}
policy:
  bundle: {url: "https://bundles.example.com/broker.tar.gz", public_key_file: /etc/broker/bundle.pem, algorithm: ES256}
`))
	if err != nil {
		t.Fatal(err)
	}
	b := c.Policy.Bundle
	if c.Policy.Dir != "" || b == nil || b.URL != "https://bundles.example.com/broker.tar.gz" || b.PollInterval != DefaultBundlePollInterval || b.Algorithm != "ES256" {
		t.Fatalf("decoded: %+v %+v", c.Policy, b)
	}
	c, err = Parse([]byte("ca: {cert_file: ca.crt, key_file: ca.key}\npolicy: {bundle: {url: \"http://127.0.0.1:8181/b.tar.gz\", poll_interval: 5s}}\n"))
	if err != nil || c.Policy.Bundle.PollInterval != 5*time.Second {
		t.Fatalf("poll_interval: %v %+v", err, c)
	}
}

func TestDevConfigIsValid(t *testing.T) {
	c := Dev()
	if c.Proxy.Listen != "127.0.0.1:8080" || c.Admin.Listen != "127.0.0.1:9090" || len(c.Agents) != 1 {
		t.Fatalf("dev config: %+v", c)
	}
}

func TestParsePrefix(t *testing.T) {
	for in, want := range map[string]string{"10.0.0.0/8": "10.0.0.0/8", "10.1.2.3/8": "10.0.0.0/8", "127.0.0.1": "127.0.0.1/32", "::1": "::1/128"} {
		p, err := ParsePrefix(in)
		if err != nil || p.String() != want {
			t.Errorf("ParsePrefix(%q) = %v, %v; want %s", in, p, err, want)
		}
	}
	for _, bad := range []string{"", "10.0.0.0/33", "host.example", "1.2.3"} {
		if _, err := ParsePrefix(bad); err == nil {
			t.Errorf("ParsePrefix(%q) accepted", bad)
		}
	}
}

// TestBodyLimitAndInputLevel: policy.max_body_bytes defaults to 8 MiB; audit.include_input
// takes a level or a boolean (true is the headers level, which writes no body or query value).
func TestBodyLimitAndInputLevel(t *testing.T) {
	const base = "ca: {cert_file: c, key_file: k}\n"
	for src, want := range map[string]string{
		"policy: {dir: p}\n": "8388608 ",
		"policy: {dir: p, max_body_bytes: 1024}\naudit: {include_input: false}\n": "1024 none",
		"policy: {dir: p}\naudit: {include_input: true}\n":                        "8388608 headers",
		"policy: {dir: p}\naudit: {include_input: metadata}\n":                    "8388608 metadata",
		"policy: {dir: p}\naudit: {include_input: full}\n":                        "8388608 full",
	} {
		c, err := Parse([]byte(base + src))
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		if got := fmt.Sprintf("%d %s", c.Policy.MaxBodyBytes, c.Audit.IncludeInput); got != want {
			t.Errorf("%s: got %q, want %q", src, got, want)
		}
	}
	for src, want := range map[string]string{
		"policy: {dir: p, max_body_bytes: -1}\n":          "policy.max_body_bytes: must be positive",
		"policy: {dir: p}\naudit: {include_input: all}\n": `audit.include_input: must be false, true, metadata, headers or full, not "all"`,
	} {
		if _, err := Parse([]byte(base + src)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", src, err, want)
		}
	}
}

// TestAnchorsAndMerge: YAML anchors, aliases and merge keys work as yaml.v3 decodes them, and
// an unknown key brought in by a merge is reported at its own line.
func TestAnchorsAndMerge(t *testing.T) {
	c, err := Parse([]byte(`ca: {cert_file: ca.crt, key_file: ca.key}
policy: {dir: p}
agents:
  - &base {id: a, token_sha256: "` + strings.Repeat("ab", 32) + `", labels: {team: x}}
  - <<: *base
    id: b
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Agents) != 2 || c.Agents[1].ID != "b" || c.Agents[1].Labels["team"] != "x" {
		t.Fatalf("agents: %+v", c.Agents)
	}
	_, err = Parse([]byte("x: &bad {colour: blue}\nproxy:\n  <<: *bad\n"))
	if err == nil || !strings.Contains(err.Error(), "proxy.colour: unknown key (line 1)") || !strings.Contains(err.Error(), "x: unknown key (line 1)") {
		t.Fatalf("merged unknown key: %v", err)
	}
}
