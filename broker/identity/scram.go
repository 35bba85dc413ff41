package identity

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"

	"github.com/capbroker/capbroker/broker/config"
)

// SCRAMIterations is the PBKDF2 iteration count of the agents' SCRAM-SHA-256 verifiers
// (Postgres's own default).
const SCRAMIterations = 4096

// SCRAMKeys is what a SCRAM-SHA-256 server keeps of a password (RFC 5802): never the password.
type SCRAMKeys struct {
	Salt                 []byte
	Iterations           int
	StoredKey, ServerKey [sha256.Size]byte
}

// Options change what New keeps of the agents' tokens.
type Options struct {
	// SCRAM keeps, for each agent whose token the broker reads (token_env, token_file), a
	// SCRAM-SHA-256 verifier of it: the Postgres front door checks the token as a database
	// password without it ever crossing the wire. An agent given by token_sha256 has none.
	SCRAM bool
}

// NewWith is New with options.
func NewWith(agents []config.Agent, opts Options) (*Identifier, error) {
	return newIdentifier(agents, opts)
}

// SCRAM returns the verifier of the token of the agent named id, and the agent.
func (id *Identifier) SCRAM(agentID string) (Agent, SCRAMKeys, bool) {
	a, ok := id.byID[agentID]
	if !ok || a.scram == nil {
		return Agent{}, SCRAMKeys{}, false
	}
	return a.Agent, *a.scram, true
}

// ByAddress returns the agent identified by a source address alone.
func (id *Identifier) ByAddress(source Addr) (Agent, bool) {
	return id.addrs.lookup(source.Unmap())
}

func scramKeys(token string) *SCRAMKeys {
	k := &SCRAMKeys{Salt: make([]byte, 16), Iterations: SCRAMIterations}
	_, _ = rand.Read(k.Salt)
	salted, err := pbkdf2.Key(sha256.New, token, k.Salt, k.Iterations, sha256.Size)
	if err != nil {
		return nil
	}
	ck := hmac.New(sha256.New, salted)
	ck.Write([]byte("Client Key"))
	k.StoredKey = sha256.Sum256(ck.Sum(nil))
	sk := hmac.New(sha256.New, salted)
	sk.Write([]byte("Server Key"))
	copy(k.ServerKey[:], sk.Sum(nil))
	return k
}
