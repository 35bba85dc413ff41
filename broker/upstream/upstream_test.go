package upstream

import (
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// These addresses are only classified, never dialled.
func TestClassify(t *testing.T) {
	tests := map[string]struct {
		ip   string
		want string
	}{
		// public
		"v4 public google dns":    {"8.8.8.8", ""},
		"v4 public cloudflare":    {"1.1.1.1", ""},
		"v4 next to 172.16/12":    {"172.32.0.1", ""},
		"v4 next to cgnat":        {"100.128.0.1", ""},
		"v6 public cloudflare":    {"2606:4700::1111", ""},
		"v6 public google":        {"2001:4860:4860::8888", ""},
		"v4 just below multicast": {"223.255.255.255", ""},
		"v4 just above 0/8":       {"1.0.0.1", ""},
		"v6 public zoned":         {"2606:4700::1111%eth0", ""},
		// v4 classes
		"v4 unspecified":        {"0.0.0.0", "unspecified"},
		"v4 this-network":       {"0.1.2.3", "reserved"},
		"v4 loopback":           {"127.0.0.1", "loopback"},
		"v4 loopback other":     {"127.255.0.2", "loopback"},
		"v4 private 10":         {"10.1.2.3", "private"},
		"v4 private 172.16":     {"172.16.0.1", "private"},
		"v4 private 172.31":     {"172.31.255.255", "private"},
		"v4 private 192.168":    {"192.168.1.1", "private"},
		"v4 link-local":         {"169.254.1.1", "link-local"},
		"v4 link-local aws dns": {"169.254.169.253", "link-local"},
		"v4 cgnat":              {"100.64.0.1", "cgnat"},
		"v4 cgnat top":          {"100.127.255.254", "cgnat"},
		"v4 multicast":          {"224.0.0.1", "multicast"},
		"v4 multicast top":      {"239.255.255.250", "multicast"},
		"v4 broadcast":          {"255.255.255.255", "broadcast"},
		"v4 class e":            {"240.0.0.1", "reserved"},
		"v4 ietf protocol":      {"192.0.0.8", "reserved"},
		"v4 test-net-1":         {"192.0.2.1", "reserved"},
		"v4 test-net-2":         {"198.51.100.7", "reserved"},
		"v4 test-net-3":         {"203.0.113.9", "reserved"},
		"v4 benchmarking":       {"198.19.0.1", "reserved"},
		"v4 6to4 relay anycast": {"192.88.99.1", "reserved"},
		// metadata, named before the broader class
		"metadata aws/gcp/azure": {"169.254.169.254", "metadata"},
		"metadata ecs":           {"169.254.170.2", "metadata"},
		"metadata eks pod id":    {"169.254.170.23", "metadata"},
		"metadata alibaba":       {"100.100.100.200", "metadata"},
		"metadata azure wire":    {"168.63.129.16", "metadata"},
		"metadata aws v6":        {"fd00:ec2::254", "metadata"},
		"metadata gcp v6":        {"fd20:ce::254", "metadata"},
		"metadata mapped":        {"::ffff:169.254.169.254", "metadata"},
		"metadata nat64":         {"64:ff9b::a9fe:a9fe", "metadata"},
		// v6 classes
		"v6 unspecified":          {"::", "unspecified"},
		"v6 loopback":             {"::1", "loopback"},
		"v6 link-local":           {"fe80::1", "link-local"},
		"v6 link-local zoned":     {"fe80::1%eth0", "link-local"},
		"v6 site-local":           {"fec0::1", "site-local"},
		"v6 ula fc":               {"fc00::1", "ula"},
		"v6 ula fd":               {"fd12:3456::1", "ula"},
		"v6 multicast":            {"ff02::1", "multicast"},
		"v6 multicast global":     {"ff0e::1", "multicast"},
		"v6 documentation":        {"2001:db8::1", "reserved"},
		"v6 documentation 3fff":   {"3fff::1", "reserved"},
		"v6 discard-only":         {"100::1", "reserved"},
		"v6 ietf protocol":        {"2001:2::1", "reserved"},
		"v6 outside 2000::/3":     {"4000::1", "reserved"},
		"v6 ipv4-translated siit": {"::ffff:0:a00:1", "reserved"},
		// IPv4-mapped
		"mapped loopback":    {"::ffff:127.0.0.1", "loopback"},
		"mapped private":     {"::ffff:10.0.0.1", "private"},
		"mapped unspecified": {"::ffff:0.0.0.0", "unspecified"},
		"mapped public":      {"::ffff:8.8.8.8", ""},
		// IPv4-compatible
		"compat loopback":     {"::127.0.0.1", "loopback"},
		"compat private":      {"::192.168.0.1", "private"},
		"compat this-network": {"::0.0.0.2", "reserved"},
		"compat public":       {"::8.8.8.8", ""},
		// NAT64 well-known and local-use
		"nat64 loopback":         {"64:ff9b::127.0.0.1", "loopback"},
		"nat64 private":          {"64:ff9b::10.0.0.1", "private"},
		"nat64 public":           {"64:ff9b::8.8.8.8", ""},
		"nat64 local private":    {"64:ff9b:1::172.16.0.1", "private"},
		"nat64 local cgnat":      {"64:ff9b:1::100.64.0.1", "cgnat"},
		"nat64 local public":     {"64:ff9b:1::1.1.1.1", ""},
		"nat64 local non-/96":    {"64:ff9b:1:a00:1::808:808", "reserved"},
		"nat64 outside prefixes": {"64:ff9b:2::8.8.8.8", "reserved"},
		// 6to4
		"6to4 private":  {"2002:c0a8:0101::1", "private"},
		"6to4 loopback": {"2002:7f00:1::", "loopback"},
		"6to4 metadata": {"2002:a9fe:a9fe::1", "metadata"},
		"6to4 public":   {"2002:0808:0808::1", ""},
		// Teredo is refused whatever it embeds
		"teredo":      {"2001:0:4136:e378:8000:63bf:3fff:fdd2", "teredo"},
		"teredo zero": {"2001::", "teredo"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ip, err := netip.ParseAddr(tc.ip)
			if err != nil {
				t.Fatalf("ParseAddr(%q): %v", tc.ip, err)
			}
			if got := Classify(ip); got != tc.want {
				t.Errorf("Classify(%s) = %q, want %q", tc.ip, got, tc.want)
			}
		})
	}
}

func TestClassifyInvalid(t *testing.T) {
	if got := Classify(netip.Addr{}); got == "" {
		t.Errorf("Classify(zero Addr) = %q, want a refusal", got)
	}
}

func TestDialerCheck(t *testing.T) {
	tests := map[string]struct {
		allow   []netip.Prefix
		address string
		wantErr bool
	}{
		"public":                       {address: "8.8.8.8:443"},
		"public v6":                    {address: "[2606:4700::1111]:443"},
		"loopback refused":             {address: "127.0.0.1:443", wantErr: true},
		"metadata refused":             {address: "169.254.169.254:80", wantErr: true},
		"mapped loopback refused":      {address: "[::ffff:127.0.0.1]:443", wantErr: true},
		"unparseable refused":          {address: "localhost:443", wantErr: true},
		"allowed v4":                   {allow: pfx("127.0.0.1/32"), address: "127.0.0.1:443"},
		"allow v4 covers mapped":       {allow: pfx("127.0.0.1/32"), address: "[::ffff:127.0.0.1]:443"},
		"allow mapped covers v4":       {allow: pfx("::ffff:127.0.0.1/128"), address: "127.0.0.1:443"},
		"allow mapped /104 covers v4":  {allow: pfx("::ffff:10.0.0.0/104"), address: "10.9.8.7:443"},
		"allow is exact":               {allow: pfx("127.0.0.1/32"), address: "127.0.0.2:443", wantErr: true},
		"allow v4 not v6 loopback":     {allow: pfx("127.0.0.0/8"), address: "[::1]:443", wantErr: true},
		"allow link-local zoned":       {allow: pfx("fe80::/10"), address: "[fe80::1%eth0]:443"},
		"allow overrides metadata":     {allow: pfx("169.254.169.254/32"), address: "169.254.169.254:80"},
		"allow unmasked prefix masked": {allow: []netip.Prefix{netip.MustParsePrefix("10.1.2.3/8")}, address: "10.200.0.1:443"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := NewDialer(tc.allow, 0).check(tc.address)
			if tc.wantErr {
				if !errors.Is(err, ErrForbiddenDestination) {
					t.Fatalf("check(%s) = %v, want ErrForbiddenDestination", tc.address, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("check(%s): %v", tc.address, err)
			}
		})
	}
}

// Live dials go to loopback only.
func TestDialerLoopback(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)

	tests := map[string]struct {
		allow   []netip.Prefix
		addr    string
		wantMsg string // "" means the dial must succeed
	}{
		"allowed":                {allow: pfx("127.0.0.1/32"), addr: "127.0.0.1:" + port},
		"not in allow list":      {allow: pfx("127.0.0.1/32"), addr: "127.0.0.2:" + port, wantMsg: "dial 127.0.0.2:" + port + ": destination address not allowed (loopback)"},
		"no allow list":          {addr: "127.0.0.1:" + port, wantMsg: "dial 127.0.0.1:" + port + ": destination address not allowed (loopback)"},
		"localhost no allow":     {addr: "localhost:" + port, wantMsg: "destination address not allowed (loopback)"},
		"mapped literal refused": {addr: "[::ffff:127.0.0.1]:" + port, wantMsg: "destination address not allowed (loopback)"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			conn, err := NewDialer(tc.allow, 5*time.Second).DialContext(t.Context(), "tcp", tc.addr)
			if tc.wantMsg == "" {
				if err != nil {
					t.Fatalf("dial %s: %v", tc.addr, err)
				}
				conn.Close()
				if c := acceptNow(t, ln); c == nil {
					t.Fatal("listener saw no connection for an allowed dial")
				} else {
					c.Close()
				}
				return
			}
			if err == nil {
				conn.Close()
				t.Fatalf("dial %s succeeded, want refusal", tc.addr)
			}
			if !errors.Is(err, ErrForbiddenDestination) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("dial %s: %v, want ErrForbiddenDestination with %q", tc.addr, err, tc.wantMsg)
			}
			if c := acceptNow(t, ln); c != nil {
				c.Close()
				t.Fatalf("listener accepted a connection from %s for a refused dial", c.RemoteAddr())
			}
		})
	}
}

func TestDialerNetworks(t *testing.T) {
	for _, network := range []string{"udp", "unix", "ip4:icmp", ""} {
		t.Run(network, func(t *testing.T) {
			conn, err := NewDialer(nil, 0).DialContext(t.Context(), network, "127.0.0.1:1")
			if err == nil {
				conn.Close()
				t.Fatalf("network %q accepted", network)
			}
		})
	}
}

// acceptNow returns a connection already queued on ln, or nil. The dial under test has
// returned, so any connection it made is already in the accept queue; the deadline only
// bounds the wait for one that does not exist.
func acceptNow(t *testing.T, ln net.Listener) net.Conn {
	t.Helper()
	tl := ln.(*net.TCPListener)
	if err := tl.SetDeadline(time.Now().Add(100 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	defer tl.SetDeadline(time.Time{})
	c, err := tl.Accept()
	if err != nil {
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("accept: %v", err)
		}
		return nil
	}
	return c
}

func TestTransport(t *testing.T) {
	var redirectTargetHits atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/redirect":
			http.Redirect(w, r, "/target", http.StatusFound)
		case "/target":
			redirectTargetHits.Add(1)
			io.WriteString(w, "target")
		default:
			// The broker must see bodies as sent: it never asks for compression itself.
			io.WriteString(w, "ok accept-encoding="+r.Header.Get("Accept-Encoding"))
		}
	}))
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	caFile := filepath.Join(dir, "upstream-ca.pem")
	writeFile(t, caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	noPEM := filepath.Join(dir, "empty.pem")
	writeFile(t, noPEM, []byte("not a certificate\n"))
	badCert := filepath.Join(dir, "bad.pem")
	writeFile(t, badCert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("garbage")}))
	loopback := pfx("127.0.0.1/32")

	t.Run("proxy env ignored", func(t *testing.T) {
		// Not parallel: t.Setenv. If the transport consulted the environment, the request
		// would go to a closed port and fail.
		t.Setenv("HTTPS_PROXY", "http://127.0.0.1:1")
		t.Setenv("HTTP_PROXY", "http://127.0.0.1:1")
		t.Setenv("NO_PROXY", "")
		tr := newClientOpts(t, Options{CAFile: caFile, AllowPrivate: loopback})
		if tr.Transport().Proxy != nil {
			t.Fatal("Transport.Proxy is set")
		}
		if body := get(t, tr, srv.URL+"/"); body != "ok accept-encoding=" {
			t.Fatalf("body = %q", body)
		}
	})

	t.Run("trusted via CAFile", func(t *testing.T) {
		tr := newClientOpts(t, Options{CAFile: caFile, AllowPrivate: loopback})
		if body := get(t, tr, srv.URL+"/"); body != "ok accept-encoding=" {
			t.Fatalf("body = %q (transport must not add Accept-Encoding)", body)
		}
	})

	t.Run("system roots only rejects test cert", func(t *testing.T) {
		tr := newClientOpts(t, Options{AllowPrivate: loopback})
		_, err := roundTrip(t, tr, srv.URL+"/")
		var verr *tls.CertificateVerificationError
		if !errors.As(err, &verr) {
			t.Fatalf("err = %v, want a certificate verification error", err)
		}
	})

	t.Run("loopback upstream refused without allow list", func(t *testing.T) {
		tr := newClientOpts(t, Options{CAFile: caFile})
		_, err := roundTrip(t, tr, srv.URL+"/")
		if !errors.Is(err, ErrForbiddenDestination) {
			t.Fatalf("err = %v, want ErrForbiddenDestination", err)
		}
	})

	t.Run("redirect returned as-is", func(t *testing.T) {
		tr := newClientOpts(t, Options{CAFile: caFile, AllowPrivate: loopback})
		resp, err := roundTrip(t, tr, srv.URL+"/redirect")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/target" {
			t.Fatalf("got %d Location=%q, want 302 /target", resp.StatusCode, resp.Header.Get("Location"))
		}
		if n := redirectTargetHits.Load(); n != 0 {
			t.Fatalf("redirect target was fetched %d times", n)
		}
	})

	t.Run("settings", func(t *testing.T) {
		c, _, err := New(Options{})
		if err != nil {
			t.Fatal(err)
		}
		tc, tr := c.tls, c.Transport()
		if tc.InsecureSkipVerify || tc.MinVersion != tls.VersionTLS12 || tc.RootCAs == nil || tr.TLSClientConfig.RootCAs != tc.RootCAs {
			t.Errorf("TLS config: InsecureSkipVerify=%v MinVersion=%x RootCAs=%v", tc.InsecureSkipVerify, tc.MinVersion, tc.RootCAs != nil)
		}
		if !tr.DisableCompression || tr.Protocols == nil || !tr.Protocols.HTTP2() || tr.Protocols.UnencryptedHTTP2() || tr.MaxIdleConns != 4096 || tr.MaxIdleConnsPerHost != 256 {
			t.Errorf("DisableCompression=%v Protocols=%v MaxIdleConns=%d MaxIdleConnsPerHost=%d",
				tr.DisableCompression, tr.Protocols, tr.MaxIdleConns, tr.MaxIdleConnsPerHost)
		}
		if c.maxIdle != 4096 || c.maxIdlePerHost != 256 {
			t.Errorf("pool: MaxIdleConns=%d MaxIdleConnsPerHost=%d", c.maxIdle, c.maxIdlePerHost)
		}
		if c.handshakeTimeout != 10*time.Second || c.headerTimeout != 60*time.Second || c.idleTimeout != 90*time.Second {
			t.Errorf("timeouts: handshake=%v header=%v idle=%v", c.handshakeTimeout, c.headerTimeout, c.idleTimeout)
		}
		if tr.TLSHandshakeTimeout != c.handshakeTimeout || tr.ResponseHeaderTimeout != c.headerTimeout || tr.IdleConnTimeout != c.idleTimeout {
			t.Errorf("HTTP/2 timeouts: handshake=%v header=%v idle=%v", tr.TLSHandshakeTimeout, tr.ResponseHeaderTimeout, tr.IdleConnTimeout)
		}
	})

	badCAs := map[string]string{
		"no PEM":             noPEM,
		"malformed cert":     badCert,
		"missing file":       filepath.Join(dir, "missing.pem"),
		"directory not file": dir,
	}
	for name, file := range badCAs {
		t.Run("CAFile "+name, func(t *testing.T) {
			_, _, err := New(Options{CAFile: file})
			if err == nil || !strings.Contains(err.Error(), file) {
				t.Fatalf("New(CAFile=%s) error = %v, want one naming the file", file, err)
			}
		})
	}
}

func newClientOpts(t testing.TB, opts Options) *Client {
	t.Helper()
	tr, _, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

func roundTrip(t *testing.T, tr *Client, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tr.RoundTrip(req, testPool)
}

func get(t *testing.T, tr *Client, url string) string {
	t.Helper()
	resp, err := roundTrip(t, tr, url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func writeFile(t testing.TB, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func pfx(cidrs ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(cidrs))
	for i, c := range cidrs {
		out[i] = netip.MustParsePrefix(c)
	}
	return out
}

// TestTransportHTTP2 checks that the transport speaks HTTP/2 to an upstream that offers h2 in
// ALPN, although it has its own dialer and TLS config, and HTTP/1.1 to one that does not; and
// that a WebSocket upgrade goes over HTTP/1.1 even to an h2 upstream.
func TestTransportHTTP2(t *testing.T) {
	proto := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "websocket" {
			conn, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("upgrade over %s: %v", r.Proto, err)
				return
			}
			defer conn.Close()
			fmt.Fprintf(rw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-Proto: %s\r\n\r\n", r.Proto)
			_ = rw.Flush()
			return
		}
		io.WriteString(w, r.Proto)
	})
	h2 := httptest.NewUnstartedServer(proto)
	h2.EnableHTTP2 = true
	h2.StartTLS()
	t.Cleanup(h2.Close)
	h1 := httptest.NewTLSServer(proto) // offers http/1.1 only
	t.Cleanup(h1.Close)

	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	writeFile(t, caFile, append(
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: h2.Certificate().Raw}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: h1.Certificate().Raw})...))
	tr := newClientOpts(t, Options{CAFile: caFile, AllowPrivate: pfx("127.0.0.1/32")})

	for name, tc := range map[string]struct{ url, want string }{
		"h2 upstream":    {h2.URL, "HTTP/2.0"},
		"h1-only server": {h1.URL, "HTTP/1.1"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := get(t, tr, tc.url+"/"); got != tc.want {
				t.Fatalf("upstream saw %q, want %q", got, tc.want)
			}
		})
	}
	t.Run("websocket to h2 upstream", func(t *testing.T) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, h2.URL+"/ws", nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		resp, err := tr.RoundTrip(req, testPool)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("X-Proto") != "HTTP/1.1" {
			t.Fatalf("got %d over %q, want 101 over HTTP/1.1", resp.StatusCode, resp.Header.Get("X-Proto"))
		}
	})
}

// TestDialerOwnService: a dial to one of the broker's own listeners is refused as such
// (ErrOwnService, beside ErrForbiddenDestination), even where allow_private covers it, and
// for a listener on every interface, on any private address with its port.
func TestDialerOwnService(t *testing.T) {
	own := netip.MustParseAddrPort("127.0.0.1:9090")
	any := netip.MustParseAddrPort("0.0.0.0:8080")
	d := NewDialer([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, time.Second, own, any)
	for addr, want := range map[string]bool{
		"127.0.0.1:9090":          true,
		"[::ffff:127.0.0.1]:9090": true,
		"127.0.0.2:8080":          true,
		"127.0.0.1:9091":          false,
	} {
		err := d.check(addr)
		if got := errors.Is(err, ErrOwnService); got != want || (want && !errors.Is(err, ErrForbiddenDestination)) {
			t.Errorf("%s: %v", addr, err)
		}
	}
}
