package integration

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	sdk "github.com/aws/aws-sdk-go-v2/aws"
	awscreds "github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"golang.org/x/net/http2"
)

// One canonical view of what is decided on: a header the broker, its policy or a protocol
// reader takes as one value is refused when it is there twice (or spelled so that a server
// reads it as that header, or joined into a list), over every surface, before the policy is
// asked; x-amz-copy-source is decided on as S3 decodes it.

// headerCase is a request whose headers the broker must refuse, naming the header.
type headerCase struct {
	header [][2]string // in order; the same name twice means two field lines
	named  string      // the header the refusal names
}

var ambiguousHeaders = map[string]headerCase{
	"content-type twice": {[][2]string{{"Content-Type", "text/plain"}, {"Content-Type", "application/json"}}, "Content-Type"},
	"content-type list":  {[][2]string{{"Content-Type", "text/plain, application/json"}}, "Content-Type"},
	"content-type param": {[][2]string{{"Content-Type", "application/json; x"}}, "Content-Type"},
	"copy source twice":  {[][2]string{{"X-Amz-Copy-Source", "/data/in.csv"}, {"X-Amz-Copy-Source", "/secret/k"}}, "X-Amz-Copy-Source"},
	"amz target twice":   {[][2]string{{"X-Amz-Target", "DynamoDB_20120810.GetItem"}, {"X-Amz-Target", "DynamoDB_20120810.DeleteTable"}}, "X-Amz-Target"},
	"mcp session twice":  {[][2]string{{"Mcp-Session-Id", "sess-one"}, {"Mcp-Session-Id", "sess-two"}}, "Mcp-Session-Id"},
	"mcp session cases":  {[][2]string{{"mcp-session-id", "sess-one"}, {"MCP-SESSION-ID", "sess-two"}}, "Mcp-Session-Id"},
	"content-type cases": {[][2]string{{"content-type", "text/plain"}, {"CONTENT-TYPE", "application/json"}}, "Content-Type"},
	"override twice":     {[][2]string{{"X-HTTP-Method-Override", "GET"}, {"X-HTTP-Method-Override", "DELETE"}}, "X-Http-Method-Override"},
	"x-method twice":     {[][2]string{{"X-Method-Override", "GET"}, {"X-Method-Override", "GET"}}, "X-Method-Override"},
	"x-http-method list": {[][2]string{{"X-HTTP-Method", "GET, DELETE"}}, "X-Http-Method"},
	"override with _":    {[][2]string{{"X_HTTP_Method_Override", "DELETE"}}, "X-Http-Method-Override"},
	"copy source with _": {[][2]string{{"X_Amz_Copy_Source", "/secret/k"}}, "X-Amz-Copy-Source"},
}

// setHeaders adds the case's headers to h under the names as written: net/http sends each
// value as its own field line (HTTP/1.1) or field (HTTP/2).
func (c headerCase) setHeaders(h http.Header) {
	for _, kv := range c.header {
		h[kv[0]] = append(h[kv[0]], kv[1])
	}
}

// wantAmbiguous checks the agent's answer: 400 ambiguous_request naming the header and none of
// its values.
func wantAmbiguous(t *testing.T, resp *http.Response, c headerCase) {
	t.Helper()
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e struct{ Error, Reason, Hint string }
	if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(body, &e) != nil || e.Error != "ambiguous_request" {
		t.Fatalf("status %d %s, want 400 ambiguous_request", resp.StatusCode, body)
	}
	if !strings.Contains(e.Reason, c.named) {
		t.Errorf("reason %q does not name %s", e.Reason, c.named)
	}
	for _, kv := range c.header {
		if strings.Contains(string(body), kv[1]) {
			t.Errorf("the refusal quotes the value %q: %s", kv[1], body)
		}
	}
}

// wantAmbiguousAudit waits for the audit event of the request to path: a deny whose reason
// names the header.
func wantAmbiguousAudit(t *testing.T, b *brokerProc, path string, c headerCase) {
	t.Helper()
	ev := b.waitAuditWhere(t, 1, "the refusal of "+path, func(ev auditEvent) bool { return ev["path"] == path })[0]
	if ev["decision"] != "deny" || !strings.Contains(fmt.Sprint(ev["reason"]), c.named) || ev["status"] != float64(400) {
		t.Errorf("audit event %v, want a deny with status 400 naming %s", ev, c.named)
	}
}

// h2Tunnel opens an intercepted tunnel to hostport through b and speaks HTTP/2 in it.
func h2Tunnel(t *testing.T, b *brokerProc, token, hostport string) *http2.ClientConn {
	t.Helper()
	raw, err := net.Dial("tcp", b.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	auth := base64.StdEncoding.EncodeToString([]byte(agentID + ":" + token))
	fmt.Fprintf(raw, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nProxy-Authorization: Basic %s\r\n\r\n", hostport, hostport, auth)
	resp, err := http.ReadResponse(bufio.NewReader(raw), &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	host, _, _ := net.SplitHostPort(hostport)
	tc := tls.Client(raw, &tls.Config{RootCAs: b.caPool(t), ServerName: host, NextProtos: []string{"h2"}})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("ALPN negotiated %q, want h2", p)
	}
	cc, err := (&http2.Transport{}).NewClientConn(tc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// TestDuplicateDecisionHeadersRefused: every surface (plain HTTP, HTTP/1.1 and HTTP/2 in an
// intercepted tunnel, a WebSocket upgrade) refuses a request whose decision-relevant header
// is given twice, joined into a list or spelled with '_': 400 naming the header, nothing
// upstream, a deny in the audit log. The same request with the header once goes through.
func TestDuplicateDecisionHeadersRefused(t *testing.T) {
	e := newEnv(t, envOpts{})
	plain := httptest.NewServer(e.record(http.HandlerFunc(e.echo)))
	defer plain.Close()
	client := e.broker.client(t, agentID, e.token)
	cc := h2Tunnel(t, e.broker, e.token, e.up.Listener.Addr().String())
	surfaces := map[string]func(t *testing.T, path string, c headerCase) *http.Response{
		"http1 tunnel": func(t *testing.T, path string, c headerCase) *http.Response {
			req, _ := http.NewRequest(http.MethodPost, e.url(path), strings.NewReader(`{"a":1}`))
			c.setHeaders(req.Header)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			return resp
		},
		"plain http": func(t *testing.T, path string, c headerCase) *http.Response {
			req, _ := http.NewRequest(http.MethodPost, plain.URL+path, strings.NewReader(`{"a":1}`))
			c.setHeaders(req.Header)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			return resp
		},
		"http2 tunnel": func(t *testing.T, path string, c headerCase) *http.Response {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, e.url(path), strings.NewReader(`{"a":1}`))
			c.setHeaders(req.Header)
			resp, err := cc.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			return resp
		},
		"websocket upgrade": func(t *testing.T, path string, c headerCase) *http.Response {
			req, _ := http.NewRequest(http.MethodGet, e.url(path), nil)
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "websocket")
			req.Header.Set("Sec-WebSocket-Version", "13")
			req.Header.Set("Sec-WebSocket-Key", base64.StdEncoding.EncodeToString([]byte("0123456789abcdef")))
			c.setHeaders(req.Header)
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			return resp
		},
	}
	for sname, send := range surfaces {
		for cname, c := range ambiguousHeaders {
			t.Run(sname+"/"+cname, func(t *testing.T) {
				if sname == "websocket upgrade" && strings.HasPrefix(cname, "content-type") {
					t.Skip("a GET upgrade carries no body")
				}
				path := "/open/" + randHex(6)
				wantAmbiguous(t, send(t, path, c), c)
				wantAmbiguousAudit(t, e.broker, path, c)
				for _, r := range e.received() {
					if r.URL.Path == path {
						t.Fatalf("the upstream received the refused request")
					}
				}
			})
		}
		t.Run(sname+"/once", func(t *testing.T) {
			path := "/open/" + randHex(6)
			once := headerCase{header: [][2]string{{"Content-Type", "application/json"}, {"Mcp-Session-Id", "s"}, {"X-Http-Method-Override", "POST"}}}
			if sname == "websocket upgrade" {
				once = headerCase{header: [][2]string{{"Mcp-Session-Id", "s"}}}
			}
			resp := send(t, path, once)
			resp.Body.Close()
			if resp.StatusCode == http.StatusBadRequest {
				t.Fatalf("a request with each header once was refused")
			}
		})
	}
}

// awsDenyListPolicy allows every AWS call to the stand-in but any that touches the bucket
// "secret", as its object or as the object a copy reads: a deny-list, which only holds if
// input.aws names the bucket S3 acts on.
const awsDenyListPolicy = `package broker

default decision := {"allow": false, "reason": "not an AWS request"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	input.request.host == "localhost"
}

decision := {"allow": true, "credentials": ["aws"]} if {
	input.phase == "request"
	input.request.host == "localhost"
	not off_limits
}

decision := {"allow": false, "reason": "the bucket secret is off limits"} if {
	input.phase == "request"
	off_limits
}

off_limits if input.aws.bucket == "secret"

off_limits if input.aws.copy_source.bucket == "secret"
`

// fakeSigV4 is an agent's worthless SigV4 signature: what the broker reads the scope from
// before it signs again with the real key.
func fakeSigV4(req *http.Request) {
	req.Header.Set("X-Amz-Date", time.Now().UTC().Format("20060102T150405Z"))
	req.Header.Set("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD")
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential="+placeholderKeyID+"/"+time.Now().UTC().Format("20060102")+
		"/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature="+strings.Repeat("0", 64))
}

// TestCopySourceDecidedAsS3ReadsIt: x-amz-copy-source is decided on as S3 decodes it. An
// encoded "/secret/k" is a copy from the bucket secret, which the deny-list refuses; a form
// S3 could read as another object (an encoded slash leaving the bucket empty, a double
// encoding, two headers) is refused as ambiguous. Nothing refused reaches the S3 stand-in,
// over HTTP/1.1 (the Go SDK, as an agent writes it) or HTTP/2.
func TestCopySourceDecidedAsS3ReadsIt(t *testing.T) {
	e := newAWSEnv(t)
	mark := e.broker.logs.mark()
	e.broker.writePolicy(t, "broker.rego", awsDenyListPolicy)
	e.broker.logs.waitFrom(t, mark, `"message":"policy reloaded"`)

	pu, _ := url.Parse(e.broker.proxyURL(agentID, e.token))
	hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{RootCAs: e.broker.caPool(t)}}, Timeout: waitTimeout}
	client := s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: sdk.String(e.endpoint), UsePathStyle: true, HTTPClient: hc,
		Credentials: awscreds.NewStaticCredentialsProvider(placeholderKeyID, placeholderSecret, ""),
	})
	copyObject := func(src string) error {
		_, err := client.CopyObject(context.Background(), &s3.CopyObjectInput{
			Bucket: sdk.String("data"), Key: sdk.String("out/copy-" + randHex(4)), CopySource: sdk.String(src),
		})
		return err
	}

	t.Run("allowed copy", func(t *testing.T) {
		m := e.s3.mark()
		if err := copyObject("data/in.csv"); err != nil {
			t.Fatalf("a copy the policy allows failed: %v", err)
		}
		e.wantAllVerified(t, m)
	})

	t.Run("encoded slashes name the bucket S3 reads", func(t *testing.T) {
		m := e.s3.mark()
		if err := copyObject("%2Fsecret%2Fk"); err == nil || !strings.Contains(err.Error(), "403") {
			t.Fatalf("copy from an encoded /secret/k: %v, want 403", err)
		}
		ev := e.broker.waitAuditWhere(t, 1, "the denied copy", func(ev auditEvent) bool {
			return ev["decision"] == "deny" && ev["reason"] == "the bucket secret is off limits"
		})[0]
		aws, _ := ev["aws"].(map[string]any)
		if aws["operation"] != "CopyObject" {
			t.Errorf("audit event %v, want a CopyObject", ev)
		}
		if len(e.s3Entries(t, m)) != 0 {
			t.Error("the denied copy reached the S3 stand-in")
		}
	})

	t.Run("copy source in the query", func(t *testing.T) {
		m := e.s3.mark()
		key := "out/copy-" + randHex(4)
		req, _ := http.NewRequest(http.MethodPut, e.endpoint+"/data/"+key+"?x-amz-copy-source=%2Fsecret%2Fk", nil)
		fakeSigV4(req)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		c := headerCase{header: [][2]string{{"", "/secret/k"}}, named: "X-Amz-Copy-Source"}
		wantAmbiguous(t, resp, c)
		wantAmbiguousAudit(t, e.broker, "/data/"+key, c)
		if len(e.s3Entries(t, m)) != 0 {
			t.Error("the refused copy reached the S3 stand-in")
		}
	})

	refused := map[string]headerCase{
		"encoded slash, empty bucket": {[][2]string{{"X-Amz-Copy-Source", "/%2Fsecret/k"}}, "X-Amz-Copy-Source"},
		"double slash":                {[][2]string{{"X-Amz-Copy-Source", "//secret/k"}}, "X-Amz-Copy-Source"},
		"double encoded":              {[][2]string{{"X-Amz-Copy-Source", "data%252F..%252Fsecret/k"}}, "X-Amz-Copy-Source"},
		"dot-dot key":                 {[][2]string{{"X-Amz-Copy-Source", "/data/x/../../secret/k"}}, "X-Amz-Copy-Source"},
		"two headers":                 {[][2]string{{"X-Amz-Copy-Source", "/data/in.csv"}, {"X-Amz-Copy-Source", "/secret/k"}}, "X-Amz-Copy-Source"},
		"two headers, secret first":   {[][2]string{{"X-Amz-Copy-Source", "/secret/k"}, {"X-Amz-Copy-Source", "/data/in.csv"}}, "X-Amz-Copy-Source"},
		"spelled with _":              {[][2]string{{"X_Amz_Copy_Source", "/secret/k"}}, "X-Amz-Copy-Source"},
	}
	cc := h2Tunnel(t, e.broker, e.token, strings.TrimPrefix(e.endpoint, "https://"))
	for _, proto := range []string{"http1", "http2"} {
		for name, c := range refused {
			t.Run(proto+"/"+name, func(t *testing.T) {
				m := e.s3.mark()
				key := "out/copy-" + randHex(4)
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, e.endpoint+"/data/"+key, nil)
				fakeSigV4(req)
				c.setHeaders(req.Header)
				var resp *http.Response
				var err error
				if proto == "http1" {
					resp, err = hc.Do(req)
				} else {
					resp, err = cc.RoundTrip(req)
				}
				if err != nil {
					t.Fatal(err)
				}
				wantAmbiguous(t, resp, c)
				wantAmbiguousAudit(t, e.broker, "/data/"+key, c)
				if len(e.s3Entries(t, m)) != 0 {
					t.Error("the refused copy reached the S3 stand-in")
				}
			})
		}
	}
}

// bodyPolicy allows every request but one whose JSON body asks to purge.
const bodyPolicy = `package broker

default decision := {"allow": false, "reason": "not allowed by the test policy"}

decision := {"allow": true, "intercept": true} if input.phase == "connect"

decision := {"allow": true} if {
	input.phase == "request"
	not purge
}

decision := {"allow": false, "reason": "purging is not allowed"} if {
	input.phase == "request"
	purge
}

purge if input.request.body.action == "purge"
`

// TestEncodedOrLateDecisionInputRefused: what the policy decides on cannot be hidden from it
// and still reach a server that reads it. A JSON body the policy reads, sent gzip-encoded
// (Express's body-parser inflates it), is refused, not decided on as null; a decision-relevant
// header declared as a trailer is refused before the body.
func TestEncodedOrLateDecisionInputRefused(t *testing.T) {
	e := newEnv(t, envOpts{policy: bodyPolicy})
	client := e.broker.client(t, agentID, e.token)
	gz := func(s string) []byte {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		_, _ = io.WriteString(w, s)
		_ = w.Close()
		return b.Bytes()
	}
	send := func(path string, body []byte, header http.Header) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, e.url(path), bytes.NewReader(body))
		for k, vs := range header {
			req.Header[k] = vs
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	noneUpstream := func(t *testing.T, path string) {
		t.Helper()
		for _, r := range e.received() {
			if r.URL.Path == path {
				t.Fatalf("the upstream received the refused request")
			}
		}
	}

	t.Run("plain purge is denied", func(t *testing.T) {
		resp := send("/open/plain", []byte(`{"action":"purge"}`), http.Header{"Content-Type": {"application/json"}})
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("status %d, want 403", resp.StatusCode)
		}
	})
	t.Run("gzip purge is refused", func(t *testing.T) {
		path := "/open/" + randHex(6)
		c := headerCase{header: [][2]string{{"Content-Encoding", "gzip"}}, named: "Content-Encoding"}
		resp := send(path, gz(`{"action":"purge"}`), http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"gzip"}})
		wantAmbiguous(t, resp, c)
		wantAmbiguousAudit(t, e.broker, path, c)
		noneUpstream(t, path)
	})
	t.Run("purge under a JSON type mime does not parse", func(t *testing.T) {
		// Flask reads the text before ';' (JSON), Go's mime refuses it (no body for the policy).
		path := "/open/" + randHex(6)
		c := headerCase{header: [][2]string{{"Content-Type", "application/json; x"}}, named: "Content-Type"}
		resp := send(path, []byte(`{"action":"purge"}`), http.Header{"Content-Type": {"application/json; x"}})
		wantAmbiguous(t, resp, c)
		wantAmbiguousAudit(t, e.broker, path, c)
		noneUpstream(t, path)
	})
	t.Run("gzip octet stream passes", func(t *testing.T) {
		// Not a body the broker decides on: the policy sees no body either way.
		resp := send("/open/"+randHex(6), gz("bytes"), http.Header{"Content-Type": {"application/octet-stream"}, "Content-Encoding": {"gzip"}})
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d, want 200", resp.StatusCode)
		}
	})
	t.Run("method override as a trailer", func(t *testing.T) {
		path := "/open/" + randHex(6)
		req, _ := http.NewRequest(http.MethodPost, e.url(path), io.NopCloser(strings.NewReader(`{"a":1}`)))
		req.ContentLength = -1
		req.Header.Set("Content-Type", "application/json")
		req.Trailer = http.Header{"X-Http-Method-Override": {"DELETE"}}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		c := headerCase{header: [][2]string{{"X-Http-Method-Override", "DELETE"}}, named: "X-Http-Method-Override"}
		wantAmbiguous(t, resp, c)
		wantAmbiguousAudit(t, e.broker, path, c)
		noneUpstream(t, path)
	})
}

// TestUndeclaredDecisionTrailerDropped: a trailer the agent did not declare, beside one it
// did, reaches the upstream only if it is not decision-relevant: a method override the policy
// never saw is not forwarded after the body.
func TestUndeclaredDecisionTrailerDropped(t *testing.T) {
	got := make(chan http.Header, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		got <- r.Trailer.Clone()
	})
	e := newEnv(t, envOpts{handler: h})
	tc := e.dialTunnel(t, e.up.Listener.Addr().String(), "http/1.1")
	defer tc.Close()
	fmt.Fprintf(tc, "POST /api/custom/t HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\n"+
		"Transfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n7\r\npayload\r\n0\r\n"+
		"X-Checksum: abc\r\nX-Http-Method-Override: DELETE\r\nX-Amz-Copy-Source: /secret/k\r\n\r\n", e.up.Listener.Addr())
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	tr := <-got
	if tr.Get("X-Checksum") != "abc" {
		t.Errorf("the declared trailer was not forwarded: %v", tr)
	}
	for _, name := range []string{"X-Http-Method-Override", "X-Amz-Copy-Source"} {
		if _, ok := tr[name]; ok {
			t.Errorf("the undeclared trailer %s was forwarded: %v", name, tr)
		}
	}
}
