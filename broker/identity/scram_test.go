package identity

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/sha256"
	"testing"

	"github.com/capbroker/capbroker/broker/config"
)

// The verifier is RFC 5802's for the token: StoredKey = H(HMAC(SaltedPassword, "Client Key")).
func TestSCRAMKeys(t *testing.T) {
	t.Setenv("SCRAM_AGENT_TOKEN", "tok-123")
	id, err := NewWith([]config.Agent{{ID: "a", TokenEnv: "SCRAM_AGENT_TOKEN"}, {ID: "h", TokenSHA256: "0000000000000000000000000000000000000000000000000000000000000000"}}, Options{SCRAM: true})
	if err != nil {
		t.Fatal(err)
	}
	a, k, ok := id.SCRAM("a")
	if !ok || a.ID != "a" || k.Iterations != SCRAMIterations || len(k.Salt) != 16 {
		t.Fatalf("SCRAM(a) = %v %v %v", a, k, ok)
	}
	salted, _ := pbkdf2.Key(sha256.New, "tok-123", k.Salt, k.Iterations, sha256.Size)
	m := hmac.New(sha256.New, salted)
	m.Write([]byte("Client Key"))
	if sha256.Sum256(m.Sum(nil)) != k.StoredKey {
		t.Fatal("StoredKey is not the token's")
	}
	if _, _, ok := id.SCRAM("h"); ok {
		t.Fatal("an agent known by its token's hash alone has no verifier")
	}
	if _, _, ok := id.SCRAM("nobody"); ok {
		t.Fatal("an unknown agent has a verifier")
	}
	plain, err := New([]config.Agent{{ID: "a", TokenEnv: "SCRAM_AGENT_TOKEN"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := plain.SCRAM("a"); ok {
		t.Fatal("New keeps verifiers it was not asked for")
	}
}
