package aws

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	sdk "github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/capbroker/capbroker/credentials"
)

// The root key: canaries that must never show up anywhere but in a signature.
const (
	rootID     = "AKIAROOTCANARY000001"
	rootSecret = "root-canary-secret-key/do+not+print0000"
	rootToken  = "root-canary-session-token-do-not-print"
	fakeID     = "AKIAPLACEHOLDER00000"
	fakeSecret = "placeholder-secret-key-worth-nothing000"
)

var signTime = time.Date(2026, 12, 4, 9, 30, 0, 0, time.UTC)

func rootSecretFields(token bool) credentials.Secret {
	f := map[string]string{"access_key": rootID, "secret_key": rootSecret}
	if token {
		f["security_token"] = rootToken
	}
	return credentials.NewFields(f)
}

func newTestSigner(t testing.TB, token bool, opts Options) *Signer {
	t.Helper()
	if opts.Now == nil {
		opts.Now = func() time.Time { return signTime }
	}
	root := rootSecretFields(token) // as the Store serves it: read once, cached
	s, err := New(func(context.Context) (credentials.Secret, error) { return root, nil }, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func sha(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

type sigCase struct {
	method, url, body string
	headers           map[string]string
	payload           string // "" hashes the body (as the SDK is told)
	service, region   string
}

func (c sigCase) request(t testing.TB) *http.Request {
	t.Helper()
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	req, err := http.NewRequest(c.method, c.url, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range c.headers {
		req.Header.Set(k, v)
	}
	return req
}

func (c sigCase) payloadHash() string {
	if c.payload != "" {
		return c.payload
	}
	return sha([]byte(c.body))
}

func sdkSign(t testing.TB, req *http.Request, c sigCase, id, secret, token string, at time.Time) {
	t.Helper()
	if c.payload != "" && c.service == "s3" {
		req.Header.Set("X-Amz-Content-Sha256", c.payload)
	}
	err := v4.NewSigner().SignHTTP(context.Background(), sdk.Credentials{AccessKeyID: id, SecretAccessKey: secret, SessionToken: token},
		req, c.payloadHash(), c.service, c.region, at, func(o *v4.SignerOptions) { o.DisableURIPathEscaping = c.service == "s3" })
	if err != nil {
		t.Fatal(err)
	}
}

var headerCases = map[string]sigCase{
	"s3 list": {method: "GET", url: "https://bkt.s3.eu-west-1.amazonaws.com/?list-type=2&prefix=a%20b%2Fc&delimiter=%2F",
		payload: emptySHA256, service: "s3", region: "eu-west-1"},
	"s3 put hashed": {method: "PUT", url: "https://s3.eu-west-1.amazonaws.com/bkt/dir/file%20name.txt", body: "hello world",
		headers: map[string]string{"Content-Type": "text/plain", "X-Amz-Meta-Owner": "  agent   one "},
		payload: sha([]byte("hello world")), service: "s3", region: "eu-west-1"},
	"s3 unsigned payload": {method: "PUT", url: "https://s3.us-east-1.amazonaws.com/bkt/k", body: "data",
		payload: unsignedPayload, service: "s3", region: "us-east-1"},
	"iam form": {method: "POST", url: "https://iam.amazonaws.com/", body: "Action=ListUsers&Version=2010-05-08",
		headers: map[string]string{"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}, service: "iam", region: "us-east-1"},
	"dynamodb json": {method: "POST", url: "https://dynamodb.eu-central-1.amazonaws.com/", body: `{"TableName":"t"}`,
		headers: map[string]string{"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "DynamoDB_20120810.DescribeTable"},
		service: "dynamodb", region: "eu-central-1"},
	"lambda path escaping": {method: "POST", url: "https://lambda.us-west-2.amazonaws.com/2015-03-31/functions/arn%3Aaws%3Alambda%3Aus-west-2%3A1%3Afunction%3Af/invocations",
		body: "{}", service: "lambda", region: "us-west-2"},
}

// TestSignHeaderMatchesSDK: an agent signs with placeholder keys (aws-sdk-go-v2's signer, an
// hour ago); the broker re-signs; the result is exactly what the SDK's signer makes of the
// same request with the root key at the broker's time.
func TestSignHeaderMatchesSDK(t *testing.T) {
	for name, c := range headerCases {
		for _, token := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/token=%v", name, token), func(t *testing.T) {
				agent := c.request(t)
				agent.Header.Set("X-Amz-Security-Token", "placeholder-token")
				sdkSign(t, agent, c, fakeID, fakeSecret, "placeholder-token", signTime.Add(-time.Hour))
				if err := newTestSigner(t, token, Options{}).Sign(context.Background(), agent); err != nil {
					t.Fatal(err)
				}
				want := c.request(t)
				tok := ""
				if token {
					tok = rootToken
				}
				sdkSign(t, want, c, rootID, rootSecret, tok, signTime)
				if got, w := agent.Header.Get("Authorization"), want.Header.Get("Authorization"); got != w {
					t.Fatalf("Authorization\n got %s\nwant %s", got, w)
				}
				for _, h := range []string{"X-Amz-Date", "X-Amz-Security-Token", "X-Amz-Content-Sha256"} {
					if agent.Header.Get(h) != want.Header.Get(h) {
						t.Errorf("%s = %q, want %q", h, agent.Header.Get(h), want.Header.Get(h))
					}
				}
				if agent.URL.RawQuery != want.URL.RawQuery {
					t.Errorf("query %q, want %q", agent.URL.RawQuery, want.URL.RawQuery)
				}
				if c.body != "" {
					b, _ := io.ReadAll(agent.Body)
					if string(b) != c.body {
						t.Errorf("body %q", b)
					}
				}
				assertNoRoot(t, agent.Header.Get("Authorization"))
			})
		}
	}
}

func assertNoRoot(t testing.TB, s string) {
	t.Helper()
	for _, v := range []string{rootSecret, rootToken, url.QueryEscape(rootSecret)} {
		if strings.Contains(s, v) {
			t.Fatalf("root secret in %q", s)
		}
	}
}

// TestSignPresignedMatchesSDK: a URL presigned with placeholder keys is re-signed keeping its
// date and expiry: the SDK presigning the same request with the root key gives the same URL.
func TestSignPresignedMatchesSDK(t *testing.T) {
	for _, token := range []bool{false, true} {
		t.Run(fmt.Sprintf("token=%v", token), func(t *testing.T) {
			c := sigCase{method: "GET", url: "https://bkt.s3.eu-west-1.amazonaws.com/photos/a%20b.jpg?response-content-type=image%2Fjpeg&X-Amz-Expires=900",
				payload: unsignedPayload, service: "s3", region: "eu-west-1"}
			at := signTime.Add(-10 * time.Minute)
			presign := func(id, secret, tok string) string {
				req := c.request(t)
				u, _, err := v4.NewSigner().PresignHTTP(context.Background(), sdk.Credentials{AccessKeyID: id, SecretAccessKey: secret, SessionToken: tok},
					req, unsignedPayload, "s3", "eu-west-1", at, func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })
				if err != nil {
					t.Fatal(err)
				}
				return u
			}
			agentURL := presign(fakeID, fakeSecret, "placeholder-token")
			req, _ := http.NewRequest("GET", agentURL, nil)
			if err := newTestSigner(t, token, Options{}).Sign(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			tok := ""
			if token {
				tok = rootToken
			}
			wantURL, _ := url.Parse(presign(rootID, rootSecret, tok))
			got, want := req.URL.Query(), wantURL.Query()
			for k := range want {
				if got.Get(k) != want.Get(k) {
					t.Errorf("%s = %q, want %q", k, got.Get(k), want.Get(k))
				}
			}
			if len(got) != len(want) {
				t.Errorf("query %v, want %v", got, want)
			}
		})
	}
}

func TestSignRefuses(t *testing.T) {
	s := newTestSigner(t, true, Options{})
	valid := "AWS4-HMAC-SHA256 Credential=" + fakeID + "/20261204/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature=" + strings.Repeat("a", 64)
	cases := map[string]struct {
		url     string
		headers map[string][]string
		want    string
	}{
		"unsigned":     {url: "https://s3.amazonaws.com/b/k", want: "not signed"},
		"sigv2":        {url: "https://s3.amazonaws.com/b/k", headers: map[string][]string{"Authorization": {"AWS " + fakeID + ":abc="}}, want: "SigV2"},
		"sigv4a":       {url: "https://s3.amazonaws.com/b/k", headers: map[string][]string{"Authorization": {"AWS4-ECDSA-P256-SHA256 Credential=x"}}, want: "SigV4a"},
		"bearer":       {url: "https://s3.amazonaws.com/b/k", headers: map[string][]string{"Authorization": {"Bearer abc"}}, want: "not an AWS SigV4"},
		"two":          {url: "https://s3.amazonaws.com/b/k", headers: map[string][]string{"Authorization": {valid, valid}}, want: "more than one"},
		"both":         {url: "https://s3.amazonaws.com/b/k?X-Amz-Signature=abc", headers: map[string][]string{"Authorization": {valid}}, want: "both"},
		"bad scope":    {url: "https://s3.amazonaws.com/b/k", headers: map[string][]string{"Authorization": {strings.Replace(valid, "/aws4_request", "/x", 1)}}, want: "credential scope"},
		"bad payload":  {url: "https://s3.amazonaws.com/b/k", headers: map[string][]string{"Authorization": {valid}, "X-Amz-Content-Sha256": {"nothex"}}, want: "x-amz-content-sha256"},
		"sigv4a chunk": {url: "https://s3.amazonaws.com/b/k", headers: map[string][]string{"Authorization": {valid}, "X-Amz-Content-Sha256": {"STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD"}}, want: "SigV4a"},
		"presign no expiry": {url: "https://s3.amazonaws.com/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=" + fakeID + "%2F20261204%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20261204T000000Z&X-Amz-SignedHeaders=host&X-Amz-Signature=ab",
			want: "X-Amz-Expires"},
		"bad query escape": {url: "https://s3.amazonaws.com/b/k?a=%zz", headers: map[string][]string{"Authorization": {valid}}, want: "percent-encoded"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", "https://s3.amazonaws.com/", nil)
			req.URL, _ = url.Parse("https://s3.amazonaws.com/")
			u, err := url.Parse(c.url)
			if err != nil {
				u = &url.URL{Scheme: "https", Host: "s3.amazonaws.com", Path: "/b/k", RawQuery: strings.SplitN(c.url, "?", 2)[1]}
			}
			req.URL, req.Host = u, u.Host
			req.Header = c.headers
			if req.Header == nil {
				req.Header = http.Header{}
			}
			err = s.Sign(context.Background(), req)
			if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want ErrUnsupported with %q", err, c.want)
			}
			assertNoRoot(t, err.Error())
		})
	}
}

func TestSignRootProblems(t *testing.T) {
	req := headerCases["s3 list"].request(t)
	sdkSign(t, req, headerCases["s3 list"], fakeID, fakeSecret, "", signTime)
	cases := map[string]struct {
		root credentials.Secret
		err  error
		want string
	}{
		"unavailable": {err: fmt.Errorf("%w: vault down", credentials.ErrUnavailable), want: "vault down"},
		"one value":   {root: credentials.NewSecret(rootSecret), want: "one value"},
		"no secret":   {root: credentials.NewFields(map[string]string{"access_key_id": rootID}), want: "no secret key"},
		"no id":       {root: credentials.NewFields(map[string]string{"secret_access_key": rootSecret}), want: "no access key id"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			s, _ := New(func(context.Context) (credentials.Secret, error) { return c.root, c.err }, Options{})
			err := s.Sign(context.Background(), req.Clone(context.Background()))
			if !errors.Is(err, credentials.ErrUnavailable) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v", err)
			}
			assertNoRoot(t, err.Error())
		})
	}
}

// TestSignOverride: region and service overrides are signed for, whatever the agent's scope.
func TestSignOverride(t *testing.T) {
	c := headerCases["s3 list"]
	agent := c.request(t)
	sdkSign(t, agent, c, fakeID, fakeSecret, "", signTime)
	if err := newTestSigner(t, false, Options{Region: "eu-north-1"}).Sign(context.Background(), agent); err != nil {
		t.Fatal(err)
	}
	want := c.request(t)
	c.region = "eu-north-1"
	sdkSign(t, want, c, rootID, rootSecret, "", signTime)
	if agent.Header.Get("Authorization") != want.Header.Get("Authorization") {
		t.Fatalf("got %s\nwant %s", agent.Header.Get("Authorization"), want.Header.Get("Authorization"))
	}
}

func TestHashedBodyLimit(t *testing.T) {
	c := headerCases["dynamodb json"]
	req := c.request(t)
	sdkSign(t, req, c, fakeID, fakeSecret, "", signTime)
	err := newTestSigner(t, false, Options{MaxHashedBody: 4}).Sign(context.Background(), req)
	if !errors.Is(err, ErrUnsupported) {
		t.Fatalf("err = %v", err)
	}
	_ = bytes.MinRead
}

func TestSignRefusesSigV2Presigned(t *testing.T) {
	req, _ := http.NewRequest("GET", "https://localhost/data/k?AWSAccessKeyId="+fakeID+"&Signature=abc%3D&Expires=1796374089", nil)
	err := newTestSigner(t, false, Options{}).Sign(context.Background(), req)
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "SigV2 presigned") {
		t.Fatalf("err = %v", err)
	}
}

type staticSource credentials.Secret

func (s staticSource) Fetch(context.Context) (credentials.Secret, error) {
	return credentials.Secret(s), nil
}

func TestKeySource(t *testing.T) {
	if _, err := (KeySource{staticSource(rootSecretFields(true))}).Fetch(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err := (KeySource{staticSource(credentials.NewFields(map[string]string{"access_key_id": rootID, "region": "eu-west-1"}))}).Fetch(context.Background())
	if !errors.Is(err, credentials.ErrUnavailable) || !strings.Contains(err.Error(), "no secret key") {
		t.Fatalf("err = %v", err)
	}
}

func TestSignedContentLength(t *testing.T) {
	cases := map[string]struct {
		method string
		length int64
		want   string
	}{
		"GET, none":    {method: "GET", length: 0, want: "host;x-amz-content-sha256;x-amz-date"},
		"DELETE, zero": {method: "DELETE", length: 0, want: "content-length;host;x-amz-content-sha256;x-amz-date"},
		"PUT, some":    {method: "PUT", length: 5, want: "content-length;host;x-amz-content-sha256;x-amz-date"},
		"PUT, unknown": {method: "PUT", length: -1, want: "host;x-amz-content-sha256;x-amz-date"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, "https://s3.us-east-1.amazonaws.com/b/k", nil)
			req.ContentLength = c.length
			req.Header.Set("X-Amz-Content-Sha256", unsignedPayload)
			req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential="+fakeID+"/20261204/us-east-1/s3/aws4_request, SignedHeaders=content-length;host;x-amz-content-sha256;x-amz-date, Signature="+strings.Repeat("0", 64))
			if err := newTestSigner(t, false, Options{}).Sign(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(req.Header.Get("Authorization"), "SignedHeaders="+c.want+",") {
				t.Errorf("Authorization %s, want SignedHeaders=%s", req.Header.Get("Authorization"), c.want)
			}
		})
	}
}

func TestTrimAll(t *testing.T) {
	for in, want := range map[string]string{"": "", "a b": "a b", " a": "a", "a ": "a", "a  b": "a b", "a\tb": "a b", "  a   b  c ": "a b c"} {
		if got := trimAll(in); got != want {
			t.Errorf("trimAll(%q) = %q, want %q", in, got, want)
		}
	}
}
