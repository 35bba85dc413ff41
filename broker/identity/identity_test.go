package identity

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/broker/config"
)

func basic(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

func TestIdentify(t *testing.T) {
	t.Setenv("IDENTITY_TEST_TOKEN", "env-token")
	file := filepath.Join(t.TempDir(), "tok")
	if err := os.WriteFile(file, []byte("file-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("hashed-token"))
	id, err := New([]config.Agent{
		{ID: "env", TokenEnv: "IDENTITY_TEST_TOKEN", Labels: map[string]string{"team": "a"}},
		{ID: "file", TokenFile: file},
		{ID: "hash", TokenSHA256: hex.EncodeToString(sum[:])},
		{ID: "side", Addresses: []string{"10.1.0.0/16"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	src := netip.MustParseAddr("192.0.2.1")
	cases := map[string]struct {
		auth   string
		source netip.Addr
		want   string // "" = unauthenticated
	}{
		"env token":                      {basic("env", "env-token"), src, "env"},
		"file token, newline trimmed":    {basic("file", "file-token"), src, "file"},
		"hashed token":                   {basic("hash", "hashed-token"), src, "hash"},
		"wrong token":                    {basic("env", "env-token2"), src, ""},
		"another agent's token":          {basic("file", "env-token"), src, ""},
		"unknown agent":                  {basic("nobody", "env-token"), src, ""},
		"no colon":                       {"Basic " + base64.StdEncoding.EncodeToString([]byte("env")), src, ""},
		"bearer scheme":                  {"Bearer env-token", src, ""},
		"bad base64":                     {"Basic !!!", src, ""},
		"lower-case scheme":              {strings.Replace(basic("env", "env-token"), "Basic", "basic", 1), src, "env"},
		"source address":                 {"", netip.MustParseAddr("10.1.2.3"), "side"},
		"mapped source address":          {"", netip.MustParseAddr("::ffff:10.1.2.3"), "side"},
		"other address":                  {"", netip.MustParseAddr("10.2.0.1"), ""},
		"bad password from good address": {basic("env", "nope"), netip.MustParseAddr("10.1.2.3"), ""},
		"nothing":                        {"", src, ""},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			a, err := id.Identify(c.auth, c.source)
			if c.want == "" {
				if !errors.Is(err, ErrUnauthenticated) {
					t.Fatalf("got %v, %v; want ErrUnauthenticated", a, err)
				}
				return
			}
			if err != nil || a.ID != c.want {
				t.Fatalf("got %v, %v; want %s", a, err, c.want)
			}
		})
	}
}

func TestNewErrorsNameKeyPathsNotTokens(t *testing.T) {
	_, err := New([]config.Agent{
		{ID: "a", TokenEnv: "IDENTITY_TEST_UNSET_VARIABLE"},
		{ID: "b", TokenFile: "/nonexistent/token"},
	})
	if err == nil {
		t.Fatal("want errors")
	}
	for _, want := range []string{"agents[0].token_env: credential unavailable: environment variable IDENTITY_TEST_UNSET_VARIABLE is not set", "agents[1].token_file: credential unavailable: reading /nonexistent/token"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// Overlapping address prefixes identify the first agent in config order, whatever the
// prefixes' lengths, as a scan of the agents in order would.
func TestIdentifyAddressFirstAgentWins(t *testing.T) {
	id, err := New([]config.Agent{
		{ID: "one", Addresses: []string{"192.0.2.7", "10.9.0.0/16"}},
		{ID: "wide", Addresses: []string{"10.0.0.0/8"}},
		{ID: "narrow", Addresses: []string{"10.1.0.0/16", "10.2.3.4/32"}},
		{ID: "six", Addresses: []string{"2001:db8::/32"}},
		{ID: "host6", Addresses: []string{"2001:db8::1"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for src, want := range map[string]string{
		"10.1.2.3":           "wide",
		"10.2.3.4":           "wide",
		"10.9.1.1":           "one",
		"192.0.2.7":          "one",
		"192.0.2.8":          "",
		"11.0.0.1":           "",
		"::ffff:10.1.2.3":    "wide",
		"2001:db8::1":        "six",
		"2001:db9::1":        "",
		"fe80::1%eth0":       "",
		"::ffff:192.0.2.7":   "one",
		"2001:db8:ffff::abc": "six",
	} {
		a, err := id.Identify("", netip.MustParseAddr(src))
		if got := a.ID; got != want || (want == "") != errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%s: got %q, %v; want %q", src, got, err, want)
		}
	}
}
