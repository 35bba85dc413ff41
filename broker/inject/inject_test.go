package inject

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/credentials"
)

const secret = "s3cr3t/+value"

func set() *Set {
	return NewSet([]config.Credential{
		{Name: "hdr", Hosts: []string{"api.example.com"}, Inject: config.Inject{Header: "Authorization", Value: "Bearer {{secret}}"}},
		{Name: "key", Hosts: []string{"*.example.org"}, Inject: config.Inject{Header: "X-Custom-Key", Value: "{{secret}}"}},
		{Name: "q", Hosts: []string{"api.example.com"}, Inject: config.Inject{Query: "api_key"}},
		{Name: "basic", Hosts: []string{"git.example.com"}, Inject: config.Inject{BasicAuth: &config.BasicAuth{Username: "x-access-token"}}},
		{Name: "ph", Hosts: []string{"llm.example.com"}, Inject: config.Inject{Placeholder: "PLACEHOLDER_llm", Body: true}},
		{Name: "phnobody", Hosts: []string{"llm.example.com"}, Inject: config.Inject{Placeholder: "PLACEHOLDER_nb"}},
	})
}

func apply(t *testing.T, name string, r *http.Request) []string {
	t.Helper()
	bs, err := set().Resolve([]string{name}, r.URL.Hostname())
	if err != nil {
		t.Fatal(err)
	}
	return bs[0].Apply(r, credentials.NewSecret(secret))
}

func TestInjectModes(t *testing.T) {
	t.Run("header replaces the agent's value", func(t *testing.T) {
		r := httptest.NewRequest("GET", "https://api.example.com/x", nil)
		r.Header.Add("Authorization", "Bearer agent")
		r.Header.Add("Authorization", "Bearer agent2")
		scrub := apply(t, "hdr", r)
		if got := r.Header.Values("Authorization"); len(got) != 1 || got[0] != "Bearer "+secret {
			t.Fatalf("Authorization = %q", got)
		}
		if len(scrub) == 0 || scrub[0] != secret || !contains(scrub, "s3cr3t%2F%2Bvalue") {
			t.Fatalf("scrub = %q", scrub)
		}
	})
	t.Run("query", func(t *testing.T) {
		r := httptest.NewRequest("GET", "https://api.example.com/x?api_key=agent&a=1", nil)
		scrub := apply(t, "q", r)
		if got := r.URL.Query(); got.Get("api_key") != secret || got.Get("a") != "1" || len(got["api_key"]) != 1 {
			t.Fatalf("query = %v", got)
		}
		if !contains(scrub, secret) || !contains(scrub, "s3cr3t%2F%2Bvalue") {
			t.Fatalf("scrub = %q", scrub)
		}
	})
	t.Run("basic auth", func(t *testing.T) {
		r := httptest.NewRequest("GET", "https://git.example.com/r.git", nil)
		r.SetBasicAuth("agent", "guess")
		scrub := apply(t, "basic", r)
		u, p, ok := r.BasicAuth()
		if !ok || u != "x-access-token" || p != secret {
			t.Fatalf("basic = %q %q", u, p)
		}
		if !contains(scrub, base64.RawStdEncoding.EncodeToString([]byte("x-access-token:"+secret))) {
			t.Fatalf("scrub = %q", scrub)
		}
	})
	t.Run("placeholder in header, path, query and body", func(t *testing.T) {
		body := strings.Repeat("x", 5000) + `{"key":"PLACEHOLDER_llm"}` + "PLACEHOLDER_"
		r := httptest.NewRequest("POST", "https://llm.example.com/v1/PLACEHOLDER_llm/x?k=PLACEHOLDER_llm", strings.NewReader(body))
		r.Header.Set("X-Api-Key", "PLACEHOLDER_llm")
		apply(t, "ph", r)
		if r.Header.Get("X-Api-Key") != secret || r.URL.Path != "/v1/"+secret+"/x" || r.URL.Query().Get("k") != secret {
			t.Fatalf("header %q path %q query %q", r.Header.Get("X-Api-Key"), r.URL.Path, r.URL.RawQuery)
		}
		b, _ := io.ReadAll(r.Body)
		if want := strings.Repeat("x", 5000) + `{"key":"` + secret + `"}` + "PLACEHOLDER_"; string(b) != want {
			t.Fatalf("body = %q", b[5000:])
		}
		if r.ContentLength != -1 {
			t.Fatal("content length not reset")
		}
	})
	t.Run("placeholder in a path keeps the rest of it as written", func(t *testing.T) {
		r := httptest.NewRequest("GET", "https://llm.example.com/v1/@scope%2Fname/PLACEHOLDER_llm/!", nil)
		apply(t, "ph", r)
		if got, want := r.URL.EscapedPath(), "/v1/@scope%2Fname/"+url.PathEscape(secret)+"/!"; got != want {
			t.Fatalf("path sent as %q, want %q", got, want)
		}
	})
	t.Run("placeholder leaves the body alone without body: true", func(t *testing.T) {
		r := httptest.NewRequest("POST", "https://llm.example.com/", strings.NewReader("PLACEHOLDER_nb"))
		apply(t, "phnobody", r)
		if b, _ := io.ReadAll(r.Body); string(b) != "PLACEHOLDER_nb" {
			t.Fatalf("body = %q", b)
		}
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func TestBindingHosts(t *testing.T) {
	s := set()
	cases := map[string]struct {
		names []string
		host  string
		ok    bool
	}{
		"bound host":                      {[]string{"hdr"}, "api.example.com", true},
		"other host":                      {[]string{"hdr"}, "evil.example.com", false},
		"suffix trick":                    {[]string{"hdr"}, "api.example.com.evil.net", false},
		"wildcard subdomain":              {[]string{"key"}, "a.example.org", true},
		"wildcard deeper":                 {[]string{"key"}, "a.b.example.org", true},
		"wildcard does not match apex":    {[]string{"key"}, "example.org", false},
		"wildcard needs a dot":            {[]string{"key"}, "badexample.org", false},
		"unknown credential":              {[]string{"nope"}, "api.example.com", false},
		"one bad name spoils the request": {[]string{"hdr", "basic"}, "api.example.com", false},
		"two credentials":                 {[]string{"hdr", "q"}, "api.example.com", true},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			bs, err := s.Resolve(c.names, c.host)
			if c.ok != (err == nil) {
				t.Fatalf("err = %v", err)
			}
			var got []string
			for _, b := range bs {
				got = append(got, b.Name)
			}
			if c.ok && !slices.Equal(got, c.names) {
				t.Fatalf("Resolve(%q) = %q", c.names, got)
			}
			if err != nil && !errors.Is(err, ErrNotBound) {
				t.Fatalf("err %v is not ErrNotBound", err)
			}
		})
	}
	if got := s.Matching("llm.example.com"); strings.Join(got, ",") != "ph,phnobody" {
		t.Fatalf("Matching = %v", got)
	}
	for _, h := range []string{"authorization", "x-custom-key", "cookie", "proxy-authorization"} {
		if !s.CredentialHeader(h) {
			t.Errorf("%s is credential-bearing", h)
		}
	}
}

// TestExposed: a response from a host is scrubbed of the credentials bound to it and of every
// placeholder credential, wherever it comes from.
func TestExposed(t *testing.T) {
	s := set()
	cases := map[string]string{
		"api.example.com":  "hdr q ph phnobody",
		"a.example.org":    "key ph phnobody",
		"unrelated.test":   "ph phnobody",
		"git.example.com":  "basic ph phnobody",
		"llm.example.com":  "ph phnobody",
		"api.example.com.": "ph phnobody", // not normalised: no exact match
	}
	for host, want := range cases {
		var names []string
		for _, b := range s.Exposed(host) {
			names = append(names, b.Name)
		}
		if got := strings.Join(names, " "); got != want {
			t.Errorf("Exposed(%q) = %q, want %q", host, got, want)
		}
	}
}

// TestHostBindingsAreMemoised: Matching and Exposed answer the same for a host asked again,
// for hosts past the memo's bound, and from many goroutines at once, as trying every binding
// does; and a caller appending to an answer changes no later one.
func TestHostBindingsAreMemoised(t *testing.T) {
	s := set()
	want := func(host string) (string, string) {
		var m, e []string
		for _, b := range s.order {
			if b.Matches(host) {
				m = append(m, b.Name)
			}
			if b.Matches(host) || b.rule.Placeholder != "" {
				e = append(e, b.Name)
			}
		}
		return strings.Join(m, " "), strings.Join(e, " ")
	}
	hosts := []string{"api.example.com", "a.example.org", "unrelated.test", "git.example.com", "llm.example.com"}
	for i := range maxHosts + 10 {
		hosts = append(hosts, fmt.Sprintf("h%d.example.org", i))
	}
	check := func(host string) error {
		var e []string
		for _, b := range s.Exposed(host) {
			e = append(e, b.Name)
		}
		wm, we := want(host)
		if gm, ge := strings.Join(s.Matching(host), " "), strings.Join(e, " "); gm != wm || ge != we {
			return fmt.Errorf("%s: Matching %q, Exposed %q; want %q, %q", host, gm, ge, wm, we)
		}
		return nil
	}
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for _, h := range hosts {
				if err := check(h); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	s.memoMu.Lock()
	n := s.nHosts
	s.memoMu.Unlock()
	if n != maxHosts {
		t.Errorf("%d hosts remembered, want the bound %d", n, maxHosts)
	}
	_ = append(s.Matching("api.example.com"), "extra")
	_ = append(s.Exposed("api.example.com"), nil)
	if err := check("api.example.com"); err != nil {
		t.Fatal(err)
	}
	if err := check(hosts[len(hosts)-1]); err != nil { // past the bound: worked out again
		t.Fatal(err)
	}
}
