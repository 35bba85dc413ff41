package postgres

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/capbroker/capbroker/broker/identity"
)

const scramMechanism = "SCRAM-SHA-256"

var errAuth = errors.New("password authentication failed")

// scramServer runs the server side of SCRAM-SHA-256 (RFC 5802, RFC 7677) over be. keys may be
// a decoy (an unknown user): the exchange runs in full and fails, so an agent learns nothing
// of which ids exist. The token is never on the wire, and never with the broker.
func scramServer(be *pgproto3.Backend, keys identity.SCRAMKeys, known bool) error {
	be.Send(&pgproto3.AuthenticationSASL{AuthMechanisms: []string{scramMechanism}})
	if err := be.Flush(); err != nil {
		return err
	}
	if err := be.SetAuthType(pgproto3.AuthTypeSASL); err != nil {
		return err
	}
	msg, err := be.Receive()
	if err != nil {
		return err
	}
	init, ok := msg.(*pgproto3.SASLInitialResponse)
	if !ok || init.AuthMechanism != scramMechanism {
		return errAuth
	}
	// client-first-message: gs2-header "n,," or "y,," (no channel binding offered), then
	// client-first-message-bare "n=<ignored>,r=<nonce>".
	cfm := string(init.Data)
	var gs2 string
	switch {
	case strings.HasPrefix(cfm, "n,,"), strings.HasPrefix(cfm, "y,,"):
		gs2 = cfm[:3]
	default:
		return errAuth
	}
	bare := cfm[3:]
	attrs := strings.Split(bare, ",")
	if len(attrs) < 2 || !strings.HasPrefix(attrs[0], "n=") || !strings.HasPrefix(attrs[1], "r=") || len(attrs[1]) < 3 {
		return errAuth
	}
	clientNonce := attrs[1][2:]
	var sn [18]byte
	_, _ = rand.Read(sn[:])
	nonce := clientNonce + base64.RawStdEncoding.EncodeToString(sn[:])
	serverFirst := "r=" + nonce + ",s=" + base64.StdEncoding.EncodeToString(keys.Salt) + ",i=" + strconv.Itoa(keys.Iterations)
	be.Send(&pgproto3.AuthenticationSASLContinue{Data: []byte(serverFirst)})
	if err := be.Flush(); err != nil {
		return err
	}
	if err := be.SetAuthType(pgproto3.AuthTypeSASLContinue); err != nil {
		return err
	}
	msg, err = be.Receive()
	if err != nil {
		return err
	}
	resp, ok := msg.(*pgproto3.SASLResponse)
	if !ok {
		return errAuth
	}
	// client-final-message: "c=<b64 gs2>,r=<nonce>,p=<proof>".
	final := string(resp.Data)
	i := strings.LastIndex(final, ",p=")
	if i < 0 {
		return errAuth
	}
	withoutProof, proofB64 := final[:i], final[i+3:]
	parts := strings.Split(withoutProof, ",")
	if len(parts) < 2 || parts[0] != "c="+base64.StdEncoding.EncodeToString([]byte(gs2)) || parts[1] != "r="+nonce {
		return errAuth
	}
	proof, err := base64.StdEncoding.DecodeString(proofB64)
	if err != nil || len(proof) != sha256.Size {
		return errAuth
	}
	authMessage := bare + "," + serverFirst + "," + withoutProof
	sig := hmacSHA256(keys.StoredKey[:], authMessage)
	clientKey := make([]byte, sha256.Size)
	for j := range clientKey {
		clientKey[j] = proof[j] ^ sig[j]
	}
	got := sha256.Sum256(clientKey)
	if subtle.ConstantTimeCompare(got[:], keys.StoredKey[:]) != 1 || !known {
		return errAuth
	}
	serverSig := hmacSHA256(keys.ServerKey[:], authMessage)
	be.Send(&pgproto3.AuthenticationSASLFinal{Data: []byte("v=" + base64.StdEncoding.EncodeToString(serverSig))})
	return nil
}

func hmacSHA256(key []byte, msg string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(msg))
	return h.Sum(nil)
}

// decoyKeys stand in for an unknown agent's verifier.
var decoyKeys = func() identity.SCRAMKeys {
	k := identity.SCRAMKeys{Salt: make([]byte, 16), Iterations: identity.SCRAMIterations}
	_, _ = rand.Read(k.Salt)
	_, _ = rand.Read(k.StoredKey[:])
	_, _ = rand.Read(k.ServerKey[:])
	return k
}()
