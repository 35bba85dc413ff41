package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAdminTokenStrength: a token carrying fewer than 128 bits stops the broker, with the key
// path and how to make one, and never the value.
func TestAdminTokenStrength(t *testing.T) {
	cases := map[string]struct {
		token string
		ok    bool
	}{
		"two characters":        {"q7", false},
		"31 hex digits":         {"0123456789abcdef0123456789abcde", false},
		"32 hex digits":         {"0123456789abcdef0123456789abcdef", true},
		"32 hex, upper":         {"0123456789ABCDEF0123456789ABCDEF", true},
		"25 base32":             {"MZXW6YTBOJRGC6TRPV4HC5LV4", false},
		"26 base32 (rand.Text)": {"MZXW6YTBOJRGC6TRPV4HC5LV4A", true},
		"21 base64":             {"Zm9vYmFyYmF6cXV4cXV1e", false},
		"22 base64url":          {"Zm9vYmFy_mF6cXV4-XV1eX", true},
		"22 base64 + pad":       {"Zm9vYmFyYmF6cXV4cXV1eQ==", true},
		"19 printable":          {"p@ss!w0rd#L0ng%X?*^", false},
		"20 printable":          {"p@ss!w0rd#L0ng%X?*^~", true},
		"one repeated":          {strings.Repeat("a", 64), false},
		"seven different":       {strings.Repeat("abcdefg", 10), false},
		"s3cret-admin":          {"s3cret-admin", false},
		"white space around":    {"  0123456789abcdef0123456789abcdef\n", true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Setenv("ADMIN_TOKEN_T", c.token)
			tok, err := Admin{TokenEnv: "ADMIN_TOKEN_T"}.Token()
			if c.ok != (err == nil) {
				t.Fatalf("bits %.0f: %v", AdminTokenBits(strings.TrimSpace(c.token)), err)
			}
			if err != nil {
				msg := err.Error()
				if !strings.HasPrefix(msg, "admin.token_env: ") || !strings.Contains(msg, "ADMIN_TOKEN_T") || !strings.Contains(msg, "128") ||
					strings.Contains(msg, strings.TrimSpace(c.token)) {
					t.Fatalf("error: %s", msg)
				}
				return
			}
			if tok != strings.TrimSpace(c.token) {
				t.Fatalf("token %q", tok)
			}
		})
	}
	file := filepath.Join(t.TempDir(), "admin.token")
	_ = os.WriteFile(file, []byte("xy\n"), 0o600)
	if _, err := (Admin{TokenFile: file}).Token(); err == nil || !strings.HasPrefix(err.Error(), "admin.token_file: ") {
		t.Fatalf("token file: %v", err)
	}
	if tok, err := (Admin{}).Token(); tok != "" || err != nil {
		t.Fatalf("none: %q %v", tok, err)
	}
}
