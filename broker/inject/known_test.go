package inject

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/credentials"
)

// knownClock is a clock the test moves.
type knownClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *knownClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *knownClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newKnownForTest(max int) (*Known, *knownClock) {
	clk := &knownClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	return NewKnown(KnownOptions{Retain: time.Hour, Max: max, Now: clk.now}), clk
}

func bindingOf(t *testing.T, set *Set, name string) *Binding {
	t.Helper()
	b := set.byName[name]
	if b == nil {
		t.Fatalf("no binding %q", name)
	}
	return b
}

// scrubs reports whether a response from host is scrubbed of v.
func scrubs(k *Known, host, v string) bool {
	in := "x " + v + " y"
	return k.Scrubber(host).String(in) != in
}

var (
	headerCred = config.Credential{Name: "api", Hosts: []string{"api.example.com"},
		Inject: config.Inject{Header: "Authorization", Value: "Bearer {{secret}}"}}
	placeholderCred = config.Credential{Name: "ph", Hosts: []string{"ph.example.com"},
		Inject: config.Inject{Placeholder: "PLACEHOLDER_PH"}}
)

// TestKnownExpiry: a minted token is known until it expires, and not after; any other value
// for Retain after it was last sent, each send extending it.
func TestKnownExpiry(t *testing.T) {
	k, clk := newKnownForTest(8)
	b := bindingOf(t, NewSet([]config.Credential{headerCred}), "api")
	tok := credentials.NewSecret("tok-minted-0123456789abcdef").Until(clk.now().Add(10 * time.Minute))
	static := credentials.NewSecret("sk-static-0123456789abcdef")
	if err := k.Record(b, tok, true); err != nil {
		t.Fatal(err)
	}
	if err := k.Record(b, static, false); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{tok.Reveal(), static.Reveal()} {
		if !scrubs(k, "api.example.com", v) {
			t.Fatalf("%s not scrubbed from its host", v[:4])
		}
		if scrubs(k, "other.example.com", v) {
			t.Fatalf("%s scrubbed from a host it was not bound to", v[:4])
		}
	}
	// Its reflections too: the Authorization header in base64 (as a header dump shows it).
	if !scrubs(k, "api.example.com", base64.StdEncoding.EncodeToString([]byte("Bearer "+tok.Reveal()))) {
		t.Error("a form of the token is not scrubbed")
	}

	clk.advance(9 * time.Minute)
	_ = k.Record(b, static, false) // sent again: known for another hour from now
	clk.advance(2 * time.Minute)
	if scrubs(k, "api.example.com", tok.Reveal()) {
		t.Error("an expired token is still scrubbed")
	}
	if !scrubs(k, "api.example.com", static.Reveal()) {
		t.Error("a static value sent 2 minutes ago is forgotten")
	}
	clk.advance(time.Hour)
	if scrubs(k, "api.example.com", static.Reveal()) {
		t.Error("a static value is still scrubbed Retain after its last use")
	}
	if n := len(k.entries); n != 0 {
		t.Errorf("%d ended entries kept", n)
	}
}

// TestKnownBoundRefuses: past Max values of one credential, none still within its time, a new
// value is refused (Record and Room), never an older one forgotten; other credentials are not
// affected, and room comes back when one ends.
func TestKnownBoundRefuses(t *testing.T) {
	k, clk := newKnownForTest(3)
	set := NewSet([]config.Credential{headerCred, placeholderCred})
	b := bindingOf(t, set, "api")
	tok := func(i int, life time.Duration) credentials.Secret {
		return credentials.NewSecret(fmt.Sprintf("tok-%02d-0123456789abcdef", i)).Until(clk.now().Add(life))
	}
	first := tok(0, 10*time.Minute)
	if err := k.Record(b, first, true); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 3; i++ {
		if err := k.Record(b, tok(i, time.Hour), true); err != nil {
			t.Fatal(err)
		}
	}
	if err := k.Room("api"); !errors.Is(err, credentials.ErrUnavailable) {
		t.Fatalf("Room when full: %v", err)
	}
	err := k.Record(b, tok(3, time.Hour), true)
	if !errors.Is(err, credentials.ErrUnavailable) {
		t.Fatalf("Record past the bound: %v", err)
	}
	if !scrubs(k, "api.example.com", first.Reveal()) {
		t.Fatal("a refusal made the registry forget a valid token")
	}
	if scrubs(k, "api.example.com", "tok-03-0123456789abcdef") {
		t.Error("a refused value is known")
	}
	if err := k.Record(b, first, true); err != nil {
		t.Errorf("a value already known is refused when full: %v", err)
	}
	if err := k.Room("ph"); err != nil {
		t.Errorf("another credential has no room: %v", err)
	}
	clk.advance(11 * time.Minute) // the first token has expired
	if err := k.Room("api"); err != nil {
		t.Fatalf("no room after a token expired: %v", err)
	}
	if err := k.Record(b, tok(4, time.Hour), true); err != nil {
		t.Fatal(err)
	}
	if err := k.Room("api"); err == nil {
		t.Fatal("the registry is not full again")
	}
	// The store rotates while the registry is full: the new value is not sent (no room), but
	// the upstream that issued it may show it, and responses are scrubbed of it.
	rotated := credentials.NewSecret("rotated-while-full-0123456789")
	k.Hold(b, rotated)
	if !scrubs(k, "api.example.com", rotated.Reveal()) {
		t.Error("a value the store holds is not scrubbed because the registry is full")
	}
	if err := k.Record(b, rotated, false); err != nil {
		t.Errorf("a held value is refused when sent: %v", err)
	}
}

// TestKnownSurvivesReload: values sent under one config stay scrubbed from the hosts they
// were sent to after a reload that renames the credential, moves it to other hosts or removes
// it; a placeholder's value from every host. A reload that keeps a credential as it was does
// not count its values twice.
func TestKnownSurvivesReload(t *testing.T) {
	k, _ := newKnownForTest(4)
	old := NewSet([]config.Credential{headerCred, placeholderCred})
	static := credentials.NewSecret("sk-static-0123456789abcdef")
	phv := credentials.NewSecret("ph-value-0123456789abcdef")
	if err := k.Record(bindingOf(t, old, "api"), static, false); err != nil {
		t.Fatal(err)
	}
	if err := k.Record(bindingOf(t, old, "ph"), phv, false); err != nil {
		t.Fatal(err)
	}
	before := k.Scrubber("api.example.com")

	// Same config again: the same bindings by key, so nothing new is recorded.
	same := NewSet([]config.Credential{headerCred, placeholderCred})
	_ = k.Record(bindingOf(t, same, "api"), static, false)
	if len(k.entries) != 2 || k.Scrubber("api.example.com") != before {
		t.Errorf("an unchanged binding after a reload made a new entry (%d entries)", len(k.entries))
	}

	// ph renamed ph_v2 and api moved elsewhere; or both removed: the registry does not care.
	renamed := placeholderCred
	renamed.Name = "ph_v2"
	moved := headerCred
	moved.Hosts = []string{"new.example.com"}
	_ = NewSet([]config.Credential{moved, renamed})
	for _, host := range []string{"api.example.com", "ph.example.com", "anywhere.example.org"} {
		if !scrubs(k, host, phv.Reveal()) {
			t.Errorf("the old placeholder value is not scrubbed from %s", host)
		}
	}
	if !scrubs(k, "api.example.com", static.Reveal()) {
		t.Error("the value sent to api.example.com is forgotten after the credential moved")
	}
	if scrubs(k, "new.example.com", static.Reveal()) {
		t.Error("a value is scrubbed from a host it was never sent to")
	}
	if vals := k.Values(); len(vals) != 2 || !slices.Contains(vals, static.Reveal()) || !slices.Contains(vals, phv.Reveal()) {
		t.Errorf("Values has %d values, want both sent", len(vals))
	}
}

// TestKnownScrubberCache: hosts with the same values share a Replacer, which is rebuilt when
// a value is recorded.
func TestKnownScrubberCache(t *testing.T) {
	k, _ := newKnownForTest(4)
	set := NewSet([]config.Credential{placeholderCred})
	if !k.Scrubber("a.example").Empty() {
		t.Fatal("an empty registry scrubs")
	}
	if err := k.Record(bindingOf(t, set, "ph"), credentials.NewSecret("ph-value-0123456789abcdef"), false); err != nil {
		t.Fatal(err)
	}
	a := k.Scrubber("a.example")
	if a.Empty() || k.Scrubber("b.example") != a || k.Scrubber("a.example") != a {
		t.Error("hosts with the same values do not share one Replacer")
	}
	_ = k.Record(bindingOf(t, set, "ph"), credentials.NewSecret("ph-value-2-0123456789abcdef"), false)
	if k.Scrubber("a.example") == a || !scrubs(k, "a.example", "ph-value-2-0123456789abcdef") {
		t.Error("a new value did not rebuild the Replacer")
	}
}

// TestKnownConcurrent: recording and scrubbing at once (for the race detector).
func TestKnownConcurrent(t *testing.T) {
	k, _ := newKnownForTest(64)
	b := bindingOf(t, NewSet([]config.Credential{headerCred}), "api")
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				v := fmt.Sprintf("sk-%d-%02d-0123456789abcdef", g, i%10)
				if err := k.Record(b, credentials.NewSecret(v), false); err != nil {
					t.Error(err)
					return
				}
				if !scrubs(k, "api.example.com", v) {
					t.Errorf("%s not scrubbed right after it was recorded", v)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestKnownFollowing: a response's Following scrubber keeps the Replacer it was given while
// the registry does not change (it is asked at every read of the body), and takes up a value
// recorded meanwhile at its next read: what the upstream writes after it was sent is scrubbed.
func TestKnownFollowing(t *testing.T) {
	k, _ := newKnownForTest(8)
	b := bindingOf(t, NewSet([]config.Credential{headerCred}), "api")
	first := credentials.NewSecret("sk-first-0123456789abcdef")
	if err := k.Record(b, first, false); err != nil {
		t.Fatal(err)
	}
	second := "sk-second-0123456789abcdef"
	var reads int
	src := readFunc(func(p []byte) (int, error) {
		reads++
		switch reads {
		case 1:
			return copy(p, "1: "+first.Reveal()+" "+second+"\n"), nil
		case 2:
			// The value is sent while the response is read.
			if err := k.Record(b, credentials.NewSecret(second), false); err != nil {
				t.Fatal(err)
			}
			return copy(p, "2: "+first.Reveal()+" "+second+"\n"), nil
		}
		return 0, io.EOF
	})
	out, err := io.ReadAll(k.Following("api.example.com").Reader(io.NopCloser(src)))
	if err != nil {
		t.Fatal(err)
	}
	want := "1: [REDACTED] " + second + "\n2: [REDACTED] [REDACTED]\n"
	if string(out) != want {
		t.Fatalf("got %q, want %q", out, want)
	}
}

type readFunc func([]byte) (int, error)

func (f readFunc) Read(p []byte) (int, error) { return f(p) }
