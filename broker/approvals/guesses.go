package approvals

import (
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// Guessing the admin token is throttled: each client address may present a wrong one
// GuessBurst times in a row, then once every GuessInterval. While a client waits, every
// attempt it makes is answered 429 with Retry-After without being checked, the right token
// included: an answer that told a right guess apart would leave the guessing unthrottled.
// IPv6 clients are counted by their /64, which one host usually holds whole.
const (
	GuessBurst    = 10
	GuessInterval = time.Second
	// maxGuessers bounds the clients remembered; beyond, new ones share one allowance.
	maxGuessers = 4096
)

// guesses is a GCRA limiter per client: next[c] is when c's allowance is back to full.
type guesses struct {
	mu   sync.Mutex
	next map[string]time.Time
}

// guessKey is the client a request counts against.
func guessKey(r *http.Request) string {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	ip := ap.Addr().Unmap().WithZone("")
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// wait is how long the client must wait before it may try again; 0 when it may now.
func (g *guesses) wait(key string, now time.Time) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.next[key]; !ok && len(g.next) >= maxGuessers {
		key = ""
	}
	next, ok := g.next[key]
	if !ok || !next.After(now) {
		return 0
	}
	return next.Sub(now) - (GuessBurst-1)*GuessInterval
}

// failed counts a wrong guess.
func (g *guesses) failed(key string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.next == nil {
		g.next = map[string]time.Time{}
	}
	if _, ok := g.next[key]; !ok && len(g.next) >= maxGuessers {
		for k, t := range g.next { // forget the clients back to a full allowance
			if !t.After(now) {
				delete(g.next, k)
			}
		}
		if len(g.next) >= maxGuessers {
			key = ""
		}
	}
	t := g.next[key]
	if t.Before(now) {
		t = now
	}
	g.next[key] = t.Add(GuessInterval)
}

// throttled answers 429 to a client that has guessed wrong too often, and reports whether it did.
func (a *API) throttled(w http.ResponseWriter, r *http.Request) bool {
	d := a.guesses.wait(guessKey(r), a.o.Now())
	if d <= 0 {
		return false
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.Seconds()))))
	apiError(w, http.StatusTooManyRequests, "too_many_attempts",
		fmt.Sprintf("too many wrong admin tokens from this address: the next attempt is checked after %s", d.Round(time.Second)))
	return true
}

// guessed counts a wrong admin token presented by r's client.
func (a *API) guessed(r *http.Request) { a.guesses.failed(guessKey(r), a.o.Now()) }
