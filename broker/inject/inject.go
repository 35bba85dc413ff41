// Package inject binds credentials to hosts and puts granted secrets into outbound requests.
// A credential is only ever applied to a request whose host matches its configured hosts.
package inject

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/scrub"
	"github.com/capbroker/capbroker/credentials"
)

// ErrNotBound means a credential was granted for a host it is not bound to.
var ErrNotBound = errors.New("credential not bound to host")

// Binding is one configured credential: its name, hosts and injection rule.
type Binding struct {
	Name  string
	hosts []string
	rule  config.Inject
	// revealed holds the forms of the values Reveals was last asked about, by value.
	revealed atomic.Pointer[map[string][]string]
	// alone is the slice of this binding alone, which Resolve answers a grant of it with.
	alone []*Binding
	// key identifies the binding across reloads (bindingKey), for Known; known is the entry
	// of the value it last recorded there.
	key   string
	known atomic.Pointer[knownEntry]
}

// Set is the configured bindings. Immutable after NewSet.
type Set struct {
	byName map[string]*Binding
	order  []*Binding
	// headers lists the lower-case header names any credential sets, so the policy input and the
	// outbound request can treat agent-supplied values of them as credential-bearing.
	headers map[string]bool
	// hosts memoises Matching and Exposed by host (*hostBindings), for up to maxHosts hosts:
	// both are asked for every request, and would otherwise each allocate and try every
	// binding's hosts.
	hosts  sync.Map
	memoMu sync.Mutex // serialises storing into hosts
	nHosts int        // how many hosts holds; under memoMu
}

// maxHosts bounds the hosts Set remembers the bindings of; past it, they are worked out each time.
const maxHosts = 4096

// hostBindings are the bindings of one host.
type hostBindings struct {
	matching []string
	exposed  []*Binding
}

// of returns the bindings of host, memoised.
func (s *Set) of(host string) *hostBindings {
	if h, ok := s.hosts.Load(host); ok {
		return h.(*hostBindings)
	}
	h := &hostBindings{}
	for _, b := range s.order {
		m := b.Matches(host)
		if m {
			h.matching = append(h.matching, b.Name)
		}
		if m || b.rule.Placeholder != "" {
			h.exposed = append(h.exposed, b)
		}
	}
	// Full capacity: a caller appending to a result gets a copy, never a change to the memo.
	h.matching, h.exposed = slices.Clip(h.matching), slices.Clip(h.exposed)
	// A miss is rare (a host's first request): the bound is kept under a lock, which a
	// check of the count before storing, by two goroutines at once, would overstep.
	s.memoMu.Lock()
	if s.nHosts < maxHosts {
		if _, loaded := s.hosts.LoadOrStore(host, h); !loaded {
			s.nHosts++
		}
	}
	s.memoMu.Unlock()
	return h
}

// NewSet builds the bindings from the config.
func NewSet(creds []config.Credential) *Set {
	s := &Set{byName: map[string]*Binding{}, headers: map[string]bool{}}
	for _, c := range creds {
		b := &Binding{Name: c.Name, hosts: c.Hosts, rule: c.Inject, key: bindingKey(c.Name, c.Hosts, c.Inject)}
		b.alone = []*Binding{b}
		s.byName[c.Name] = b
		s.order = append(s.order, b)
		switch {
		case c.Inject.Header != "":
			s.headers[strings.ToLower(c.Inject.Header)] = true
		case c.Inject.BasicAuth != nil:
			s.headers["authorization"] = true
		}
	}
	return s
}

// Matching returns the names of the credentials bound to host, in config order.
// The slice is shared: it must not be changed.
func (s *Set) Matching(host string) []string {
	if len(s.order) == 0 {
		return nil
	}
	return s.of(host).matching
}

// Exposed returns, in config order, the bindings whose values may come back in a response
// from host: those bound to host, and every placeholder binding. An agent chooses where a
// placeholder's value goes (any header, the query, the path, the body), so it can have an
// upstream store it, and the service may serve what it stored under another name (an API
// host and its raw-content host, say). The slice is shared: it must not be changed.
func (s *Set) Exposed(host string) []*Binding {
	if len(s.order) == 0 {
		return nil
	}
	return s.of(host).exposed
}

// All returns every binding, in config order. The slice is shared: it must not be changed.
func (s *Set) All() []*Binding { return s.order }

// Resolve returns the bindings for granted names, checking that each is bound to host. The
// slice of one binding, the usual grant, is shared: it must not be changed.
func (s *Set) Resolve(names []string, host string) ([]*Binding, error) {
	if len(names) == 1 {
		b, err := s.resolve(names[0], host)
		if err != nil {
			return nil, err
		}
		return b.alone, nil
	}
	out := make([]*Binding, 0, len(names))
	for _, n := range names {
		b, err := s.resolve(n, host)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// resolve returns the binding of a granted name, checking that it is bound to host.
func (s *Set) resolve(name, host string) (*Binding, error) {
	b, ok := s.byName[name]
	if !ok {
		return nil, fmt.Errorf("%w: the policy granted unknown credential %q", ErrNotBound, name)
	}
	if !b.Matches(host) {
		return nil, fmt.Errorf("%w: credential %q may not be sent to %s", ErrNotBound, name, host)
	}
	return b, nil
}

// CredentialHeader reports whether a lower-case header name carries credentials: the
// standard ones, and any header a configured credential sets.
func (s *Set) CredentialHeader(name string) bool {
	switch name {
	case "authorization", "proxy-authorization", "cookie", "x-api-key", "api-key":
		return true
	}
	return s.headers[name]
}

// Matches reports whether host (lower-case, no port) is one the credential may be sent to.
// "*.example.com" matches any name below example.com, not example.com itself.
func (b *Binding) Matches(host string) bool {
	for _, h := range b.hosts {
		if config.HostMatches(h, host) {
			return true
		}
	}
	return false
}

// Apply puts the secret into req as the binding says, replacing any value the agent supplied,
// and returns the strings that reveal the secret (Reveals), for scrubbing the response.
func (b *Binding) Apply(req *http.Request, secret credentials.Secret) []string {
	v := secret.Reveal()
	r := b.rule
	switch {
	case r.Header != "":
		req.Header.Set(r.Header, strings.ReplaceAll(r.Value, "{{secret}}", v)) // every value the agent sent goes
	case r.Query != "":
		q := req.URL.Query()
		q.Set(r.Query, v)
		req.URL.RawQuery = q.Encode()
	case r.BasicAuth != nil:
		req.Header.Del("Authorization")
		req.SetBasicAuth(r.BasicAuth.Username, v)
	default:
		b.replacePlaceholder(req, v)
	}
	return b.Reveals(secret)
}

// InBody reports whether Apply substitutes the secret into request bodies (a placeholder
// with body: true).
func (b *Binding) InBody() bool { return b.rule.Placeholder != "" && b.rule.Body }

func (b *Binding) replacePlaceholder(req *http.Request, v string) {
	ph := b.rule.Placeholder
	for name, vals := range req.Header {
		for i, s := range vals {
			vals[i] = strings.ReplaceAll(s, ph, v)
		}
		req.Header[name] = vals
	}
	escaped := url.QueryEscape(v)
	if strings.Contains(req.URL.RawQuery, ph) {
		req.URL.RawQuery = strings.ReplaceAll(req.URL.RawQuery, ph, escaped)
	}
	if strings.Contains(req.URL.Path, ph) {
		// The path is sent as written (RawPath: the one the policy decided on), with only the
		// placeholder replaced: re-escaping the whole path would change the rest of it.
		raw := req.URL.EscapedPath()
		req.URL.Path = strings.ReplaceAll(req.URL.Path, ph, v)
		req.URL.RawPath = strings.ReplaceAll(raw, ph, url.PathEscape(v))
	}
	if b.rule.Body && req.Body != nil && req.Body != http.NoBody {
		req.Body = scrub.New(ph, v).Reader(req.Body)
		req.GetBody = nil // a replay would send the placeholder
		req.ContentLength = -1
		req.Header.Del("Content-Length")
	}
}
