package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/singleflight"
)

const (
	defaultCacheSize = 10000
	leafLifetime     = 7 * 24 * time.Hour
	backdate         = time.Hour // leaf NotBefore, to tolerate client clock skew
	renewBefore      = time.Hour // a cached leaf this close to expiry is issued again
)

// Cache issues leaf certificates from the CA for intercepted hosts and keeps the most
// recently used ones. It is bounded and safe for concurrent use; concurrent requests for
// the same host generate one certificate.
type Cache struct {
	ca     *CA
	lru    *lru.Cache[string, leaf]
	group  singleflight.Group
	now    func() time.Time // time.Now; replaced in tests
	issued atomic.Int64     // leaves generated, for tests
}

// NewCache returns a cache of leaves signed by ca (which must not be nil), holding at most
// size of them; size <= 0 means 10000.
func NewCache(ca *CA, size int) *Cache {
	if size <= 0 {
		size = defaultCacheSize
	}
	l, _ := lru.New[string, leaf](size) // fails only for size <= 0
	return &Cache{ca: ca, lru: l, now: time.Now}
}

// leaf is a cached certificate, with its chain: that of the issuer that signed it, which may
// since have been replaced (vault_pki), so the leaf keeps being served with the chain that
// verifies it.
type leaf struct {
	cert *tls.Certificate
	// refresh is when it is issued again: renewBefore (or a quarter of its life, when that
	// is shorter) before it expires, and never after its issuer stops signing.
	refresh time.Time
}

// Ready returns nil when leaves can be issued now, else why not (matching ErrUnavailable).
func (c *Cache) Ready() error {
	_, err := c.ca.signer(c.now())
	return err
}

// Len returns the number of cached leaves.
func (c *Cache) Len() int { return c.lru.Len() }

// Get returns a leaf certificate for host, a DNS name or an IP literal (IPv6 without
// brackets). DNS names are lower-cased. The certificate has an ECDSA P-256 key, host as its
// only subject alternative name, ServerAuth usage, and is valid from an hour ago for 7 days
// or until the CA expires, whichever is sooner. Its chain is the leaf, its issuer and the
// CAs between that and the root, and its Leaf field is set. A cached leaf is reused until it
// is less than an hour (or a quarter of its life) from expiry, or its issuer stops signing.
// While the CA cannot sign, the error matches ErrUnavailable.
func (c *Cache) Get(host string) (*tls.Certificate, error) {
	// Keys are normalized hosts, so a host found as it is needs no checks.
	if l, ok := c.lru.Get(host); ok && c.fresh(l) {
		return l.cert, nil
	}
	name, ip, err := normalize(host)
	if err != nil {
		return nil, err
	}
	v, err, _ := c.group.Do(name, func() (any, error) {
		// Look again: name may differ from host, and a call that finished since the
		// lookup above may have added it.
		if l, ok := c.lru.Get(name); ok && c.fresh(l) {
			return l.cert, nil
		}
		l, err := c.issue(name, ip)
		if err != nil {
			return nil, err
		}
		c.lru.Add(name, l)
		return l.cert, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*tls.Certificate), nil
}

// Cached reports whether Get would return host's leaf from the cache, as host is written (a
// host Get normalizes is not found here): it issues nothing.
func (c *Cache) Cached(host string) bool {
	l, ok := c.lru.Get(host)
	return ok && c.fresh(l)
}

// fresh reports whether l is still to be served.
func (c *Cache) fresh(l leaf) bool {
	return c.now().Before(l.refresh)
}

// issue generates a leaf for name, which is ip's text form if ip is valid.
func (c *Cache) issue(name string, ip netip.Addr) (leaf, error) {
	now := c.now()
	is, err := c.ca.signer(now)
	if err != nil {
		return leaf{}, fmt.Errorf("certs: issue for %s: %w", name, err)
	}
	ca := is.cert
	notAfter := now.Add(leafLifetime)
	if ca.NotAfter.Before(notAfter) {
		notAfter = ca.NotAfter
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return leaf{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		NotBefore:             now.Add(-backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, // and IsCA false
	}
	// Clients match the SAN; CN is informational and limited to 64 bytes (RFC 5280).
	if len(name) <= 64 {
		tmpl.Subject.CommonName = name
	}
	if ip.IsValid() {
		tmpl.IPAddresses = []net.IP{ip.AsSlice()}
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), is.key)
	if err != nil {
		return leaf{}, fmt.Errorf("certs: issue for %s: %w", name, err)
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		return leaf{}, fmt.Errorf("certs: issue for %s: %w", name, err)
	}
	c.issued.Add(1)
	refresh := notAfter.Add(-min(renewBefore, notAfter.Sub(now)/4))
	if is.until.Before(refresh) {
		refresh = is.until
	}
	chain := append([][]byte{der}, is.chain...)
	return leaf{cert: &tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: parsed}, refresh: refresh}, nil
}

// normalize checks that host is an IP literal without zone or a DNS name made of labels of
// letters, digits, '-' and '_' (so no wildcards), and returns its canonical form: the IP's
// text form or the lower-cased name.
func normalize(host string) (string, netip.Addr, error) {
	if host == "" || len(host) > 253 {
		return "", netip.Addr{}, errors.New("certs: host name is empty or longer than 253 bytes")
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return "", netip.Addr{}, fmt.Errorf("certs: IP address %q has a zone", host)
		}
		return ip.String(), ip, nil
	}
	host = strings.ToLower(host)
	for label := range strings.SplitSeq(host, ".") {
		if label == "" || len(label) > 63 || strings.IndexFunc(label, notHostChar) >= 0 {
			return "", netip.Addr{}, fmt.Errorf("certs: invalid host name %q", host)
		}
	}
	return host, netip.Addr{}, nil
}

func notHostChar(r rune) bool {
	return !('a' <= r && r <= 'z' || '0' <= r && r <= '9' || r == '-' || r == '_')
}
