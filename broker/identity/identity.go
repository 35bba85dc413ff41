// Package identity tells which configured agent sent a request: by the proxy password in
// Proxy-Authorization (Basic, agent id + token), or by source address.
package identity

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/credentials"
)

// ErrUnauthenticated means the request carries no valid agent identity (the agent sees 407).
var ErrUnauthenticated = errors.New("no valid agent identity")

// Agent is an identified caller.
type Agent struct {
	ID     string
	Labels map[string]string
}

type tokenAgent struct {
	Agent
	digest [sha256.Size]byte // SHA-256 of the token; the token itself is not kept
	scram  *SCRAMKeys        // with Options.SCRAM, for a token the broker read
}

// Addr is a source address.
type Addr = netip.Addr

// addrTable finds the first configured agent (in config order) with an address prefix
// holding a source address, in one map lookup per distinct prefix length configured (at most
// 33 for IPv4 and 129 for IPv6) whatever the number of agents: a scan of every agent's
// prefixes cost 70-130 µs a request at 10,000 agents (issue 25).
type addrTable struct {
	lengths []prefixLen          // the distinct (family, length) pairs configured
	first   map[netip.Prefix]int // a masked prefix -> index in agents of its first agent
	agents  []Agent
}

type prefixLen struct {
	is4  bool
	bits int
}

func (t *addrTable) add(a Agent, p netip.Prefix) {
	if t.first == nil {
		t.first = map[netip.Prefix]int{}
	}
	if len(t.agents) == 0 || t.agents[len(t.agents)-1].ID != a.ID {
		t.agents = append(t.agents, a)
	}
	p = p.Masked()
	if _, seen := t.first[p]; !seen {
		t.first[p] = len(t.agents) - 1
	}
	l := prefixLen{p.Addr().Is4(), p.Bits()}
	if !slices.Contains(t.lengths, l) {
		t.lengths = append(t.lengths, l)
	}
}

// lookup returns the first agent with a prefix that contains src (netip.Prefix.Contains: no
// zone, same family).
func (t *addrTable) lookup(src netip.Addr) (Agent, bool) {
	if !src.IsValid() || src.Zone() != "" {
		return Agent{}, false
	}
	best := -1
	for _, l := range t.lengths {
		if l.is4 != src.Is4() {
			continue
		}
		p, err := src.Prefix(l.bits)
		if err != nil {
			continue
		}
		if i, ok := t.first[p]; ok && (best < 0 || i < best) {
			best = i
		}
	}
	if best < 0 {
		return Agent{}, false
	}
	return t.agents[best], true
}

// Identifier identifies agents. Immutable after New.
type Identifier struct {
	byID  map[string]*tokenAgent
	addrs addrTable
	all   map[string]Agent // every configured agent, for Lookup
}

// New reads the agents' tokens (from the environment, files, or hashes in the config).
// Errors name the key path and never contain a token.
func New(agents []config.Agent) (*Identifier, error) {
	return newIdentifier(agents, Options{})
}

func newIdentifier(agents []config.Agent, opts Options) (*Identifier, error) {
	id := &Identifier{byID: map[string]*tokenAgent{}, all: map[string]Agent{}}
	var errs []error
	for i, a := range agents {
		ag := Agent{ID: a.ID, Labels: a.Labels}
		if ag.Labels == nil {
			ag.Labels = map[string]string{}
		}
		p := fmt.Sprintf("agents[%d]", i)
		id.all[a.ID] = ag
		var digest []byte
		var src credentials.Source
		key := ""
		switch {
		case a.TokenEnv != "":
			src, key = credentials.Env{Name: a.TokenEnv}, "token_env"
		case a.TokenFile != "":
			src, key = credentials.File{Path: a.TokenFile}, "token_file"
		case a.TokenSHA256 != "":
			d, err := hex.DecodeString(a.TokenSHA256)
			if err != nil || len(d) != sha256.Size {
				errs = append(errs, fmt.Errorf("%s.token_sha256: must be 64 hex digits", p))
				continue
			}
			digest = d
		}
		var scram *SCRAMKeys
		if src != nil {
			token, err := src.Fetch(context.Background())
			if err != nil {
				errs = append(errs, fmt.Errorf("%s.%s: %w", p, key, err))
				continue
			}
			d := sha256.Sum256([]byte(token.Reveal()))
			digest = d[:]
			if opts.SCRAM {
				scram = scramKeys(token.Reveal())
			}
		}
		if digest != nil {
			ta := &tokenAgent{Agent: ag, scram: scram}
			copy(ta.digest[:], digest)
			id.byID[a.ID] = ta
		}
		for j, s := range a.Addresses {
			pr, err := config.ParsePrefix(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s.addresses[%d]: %w", p, j, err))
				continue
			}
			id.addrs.add(ag, pr)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return id, nil
}

// Identify returns the agent for a request's Proxy-Authorization header value (may be "") and
// source address. A present but invalid Proxy-Authorization is refused even if the source
// address would match: a wrong password is never silently downgraded to another identity.
func (id *Identifier) Identify(proxyAuth string, source netip.Addr) (Agent, error) {
	if proxyAuth != "" {
		return id.byToken(proxyAuth)
	}
	if a, ok := id.addrs.lookup(source.Unmap()); ok {
		return a, nil
	}
	return Agent{}, ErrUnauthenticated
}

// Lookup returns the configured agent with this id, for a front door that established who it
// is by other means (an SSH key listed for the agent).
func (id *Identifier) Lookup(agentID string) (Agent, bool) {
	a, ok := id.all[agentID]
	return a, ok
}

func (id *Identifier) byToken(header string) (Agent, error) {
	scheme, enc, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return Agent{}, ErrUnauthenticated
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return Agent{}, ErrUnauthenticated
	}
	user, token, ok := strings.Cut(string(raw), ":")
	if !ok {
		return Agent{}, ErrUnauthenticated
	}
	got := sha256.Sum256([]byte(token))
	a, known := id.byID[user]
	want := a.digestOrZero()
	// Compare digests in constant time, also for unknown agents, so timing says nothing about
	// which ids exist or how much of a token was right.
	if subtle.ConstantTimeCompare(got[:], want[:]) != 1 || !known {
		return Agent{}, ErrUnauthenticated
	}
	return a.Agent, nil
}

func (a *tokenAgent) digestOrZero() [sha256.Size]byte {
	if a == nil {
		return [sha256.Size]byte{}
	}
	return a.digest
}
