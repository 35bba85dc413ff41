package github

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/capbroker/capbroker/credentials"
	"github.com/capbroker/capbroker/credentials/github/githubtest"
)

// TestNoRoomNoMint: when the broker's registry of known secrets has no room for one more token,
// the App asks GitHub for none: Token fails with ErrUnavailable, and mints once there is room.
func TestNoRoomNoMint(t *testing.T) {
	var full atomic.Bool
	full.Store(true)
	f := setup(t, func(_ *githubtest.Options, o *Options) {
		o.Room = func() error {
			if full.Load() {
				return fmt.Errorf("%w: registry full", credentials.ErrUnavailable)
			}
			return nil
		}
	})
	if _, err := f.app.Token(context.Background(), r1write); !errors.Is(err, credentials.ErrUnavailable) {
		t.Fatalf("Token with no room: %v", err)
	}
	if n := f.srv.Mints(); n != 0 {
		t.Fatalf("%d mints with no room", n)
	}
	full.Store(false)
	f.clk.Advance(retryMax + time.Second)
	tok, err := f.app.Token(context.Background(), r1write)
	if err != nil || f.srv.Mints() != 1 {
		t.Fatalf("Token with room: %v, %d mints", err, f.srv.Mints())
	}
	if !tok.Expires().After(f.clk.Now()) {
		t.Error("a minted token does not say when it expires")
	}
}
