package oauth2

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/capbroker/capbroker/credentials"
	"github.com/capbroker/capbroker/credentials/oauth2/oauth2test"
)

// TestNoRoomNoMint: when the broker's registry of known secrets has no room for one more token
// (it would have to forget one still valid), the minter does not ask the endpoint: Token fails
// with ErrUnavailable, and mints again once there is room.
func TestNoRoomNoMint(t *testing.T) {
	f := newFixture(t)
	f.srv.AddClient(oauth2test.Client{ID: "broker", Auth: "client_secret_basic", Secret: canarySecret,
		Grants: []string{GrantClientCredentials}, Scopes: []string{"read"}})
	var full atomic.Bool
	full.Store(true)
	deps := f.deps(canarySecret)
	deps.Room = func() error {
		if full.Load() {
			return fmt.Errorf("%w: registry full", credentials.ErrUnavailable)
		}
		return nil
	}
	m, err := New("api", Config{TokenURL: f.srv.TokenURL, ClientID: "broker", ClientAuth: "client_secret_basic"}, deps)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	if _, err := m.Token(context.Background(), nil); !errors.Is(err, credentials.ErrUnavailable) {
		t.Fatalf("Token with no room: %v", err)
	}
	if f.srv.Calls() != 0 {
		t.Fatalf("the endpoint was asked %d times with no room", f.srv.Calls())
	}
	if st := m.Status(); st.Ready {
		t.Errorf("status with no room: %+v", st)
	}
	full.Store(false)
	f.clock.advance(retryMax)
	tok, err := m.Token(context.Background(), nil)
	if err != nil || tok.IsZero() || f.srv.Calls() != 1 {
		t.Fatalf("Token with room: %v, %d calls", err, f.srv.Calls())
	}
	if tok.Expires().IsZero() {
		t.Error("a minted token does not say when it expires")
	}
}
