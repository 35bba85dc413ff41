package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	sdk "github.com/aws/aws-sdk-go-v2/aws"
	awscreds "github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/capbroker/capbroker/credentials/vaulttest"
	"github.com/capbroker/capbroker/internal/harness"
)

// awsEnv is a broker with an aws_sigv4 credential in front of an S3 stand-in
// (testdata/aws/s3server.py) that checks every signature with botocore and the real key.
type awsEnv struct {
	broker                   *brokerProc
	s3                       *logTail // the stand-in's log: one JSON line per request
	endpoint                 string   // https://localhost:PORT
	token                    string   // the agent's proxy password
	rootID, rootKey, rootTok string   // the real key: canaries
	dir                      string
	upstreamCAs              *x509.CertPool // trusts the stand-in, for clients that bypass the broker
}

// The agent's placeholder key: worthless, and never checked by anyone.
const (
	placeholderKeyID  = "AKIAIOSFODNN7EXAMPLE"
	placeholderSecret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
)

// awsPolicy composes the shipped policies/aws.rego for the stand-in's host and port.
const awsPolicy = `package broker

import data.aws

default decision := {"allow": false, "reason": "not an AWS request"}

decision := {"allow": true, "intercept": true} if {
	input.phase == "connect"
	aws.governs(input.request.host)
}

decision := aws.decision if {
	input.phase == "request"
	aws.governs(input.request.host)
}
`

const awsData = `settings:
  aws:
    credential: aws
    hosts: {localhost: true}
    list_buckets: true
    read: [data]
    write: [data/out/]
`

func requireAWSTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"aws", "python3", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			requireTool(t, tool+" is missing")
		}
	}
	if err := exec.Command("python3", "-c", "import botocore").Run(); err != nil {
		requireTool(t, "python3 cannot import botocore (Debian's awscli brings it)")
	}
}

// awsKey is an access key the S3 stand-in accepts.
type awsKey struct {
	ID     string `json:"id"`
	Secret string `json:"secret"`
	Token  string `json:"token"`
}

func newAWSKey() awsKey {
	return awsKey{ID: "AKIA" + strings.ToUpper(randHex(8)), Secret: "root-secret-" + randHex(14), Token: "root-session-token-" + randHex(24)}
}

// awsEnvOpts: vault, when set, is the address of a Vault dev server whose KV v2 secret
// secret/aws holds the root key (the test writes it); more are keys the stand-in accepts too.
type awsEnvOpts struct {
	vault, vaultToken string
	more              []awsKey
}

func newAWSEnv(t *testing.T) *awsEnv { return newAWSEnvWith(t, awsEnvOpts{}) }

func newAWSEnvWith(t *testing.T, o awsEnvOpts) *awsEnv {
	t.Helper()
	requireAWSTools(t)
	k := newAWSKey()
	e := &awsEnv{token: randHex(16), dir: t.TempDir(), rootID: k.ID, rootKey: k.Secret, rootTok: k.Token}
	pki := newUpstreamPKI(t)
	e.upstreamCAs = pki.Pool
	leaf := pki.issue(t, "localhost", time.Now().Add(24*time.Hour))
	keyDER, err := x509.MarshalPKCS8PrivateKey(leaf.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(e.dir, "s3.crt"), filepath.Join(e.dir, "s3.key")
	writeTestFile(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Certificate[0]}))
	writeTestFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))

	srv := exec.Command("python3", "testdata/aws/s3server.py")
	srv.Env = append(harness.Env(), "S3_ACCESS_KEY_ID="+e.rootID, "S3_SECRET_ACCESS_KEY="+e.rootKey, "S3_SESSION_TOKEN="+e.rootTok,
		"S3_REGION=us-east-1", "S3_BUCKETS=data,secret", "S3_CERT="+certFile, "S3_KEY="+keyFile)
	if o.more != nil {
		more, _ := json.Marshal(o.more)
		srv.Env = append(srv.Env, "S3_MORE_KEYS="+string(more))
	}
	e.s3 = newLogTail()
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	srv.Stderr = e.s3
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	go func() { _, _ = io.Copy(e.s3, out) }()
	port := strings.TrimPrefix(e.s3.wait(t, "listening "), "listening ")
	e.endpoint = "https://localhost:" + port

	// The root key as Vault's AWS secrets engine names its fields, in a JSON file; or in
	// Vault's KV, as AWS names them.
	rootFile := filepath.Join(e.dir, "aws.json")
	doc, _ := json.Marshal(map[string]string{"access_key": e.rootID, "secret_key": e.rootKey, "security_token": e.rootTok})
	writeTestFile(t, rootFile, doc)
	source, vault := fmt.Sprintf("{file: %q}", rootFile), ""
	env := []string{"CODER1_TOKEN=" + e.token}
	if o.vault != "" {
		source = "{vault: {mount: secret, path: aws}}"
		vault = fmt.Sprintf("vault:\n  address: %s\n  refresh_interval: 200ms\n  auth: {method: token, token_env: BROKER_VAULT_TOKEN}\n", o.vault)
		env = append(env, "BROKER_VAULT_TOKEN="+o.vaultToken)
	}
	e.broker = startBroker(t, brokerOpts{
		mode:   "enforce",
		policy: awsPolicy,
		files:  map[string]string{"aws.rego": readShipped(t, "aws.rego"), "data.yaml": awsData},
		config: fmt.Sprintf(`upstream:
  ca_file: %q
  allow_private: ["127.0.0.1/32", "::1/128"]
agents:
  - {id: coder-1, token_env: CODER1_TOKEN}
audit: {include_input: true}
credentials:
  - name: aws
    hosts: [localhost]
    source: %s
    aws_sigv4: {}
%s`, pki.File, source, vault),
		env: env,
	})
	return e
}

func writeTestFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func readShipped(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "policies", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// cli runs the AWS CLI as an agent: placeholder keys, the broker as proxy and CA, the
// stand-in as endpoint, path-style addressing, and the multipart settings in s3cfg.
func (e *awsEnv) cli(t *testing.T, s3cfg string, args ...string) (string, error) {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "config")
	writeTestFile(t, cfg, []byte("[default]\nregion = us-east-1\ns3 =\n    addressing_style = path\n    signature_version = s3v4\n"+s3cfg))
	proxy := e.broker.proxyURL("coder-1", e.token)
	cmd := exec.Command("aws", append(args, "--endpoint-url", e.endpoint)...)
	cmd.Env = append(harness.Env(), "HTTPS_PROXY="+proxy, "https_proxy="+proxy, "NO_PROXY=", "no_proxy=",
		"AWS_CA_BUNDLE="+e.broker.caFile, "AWS_CONFIG_FILE="+cfg, "AWS_SHARED_CREDENTIALS_FILE="+filepath.Join(e.dir, "none"),
		"AWS_ACCESS_KEY_ID="+placeholderKeyID, "AWS_SECRET_ACCESS_KEY="+placeholderSecret, "AWS_SESSION_TOKEN=placeholder-session-token",
		"AWS_EC2_METADATA_DISABLED=true", "AWS_PAGER=", "HOME="+e.dir)
	out, err := cmd.CombinedOutput()
	e.noRoot(t, "the AWS CLI's output", string(out))
	return string(out), err
}

// noRoot fails if the root key's secret, session token or id is in s.
func (e *awsEnv) noRoot(t *testing.T, where, s string) {
	t.Helper()
	for name, v := range map[string]string{"secret key": e.rootKey, "session token": e.rootTok, "key id": e.rootID} {
		if strings.Contains(s, v) {
			t.Errorf("the root %s is in %s", name, where)
		}
	}
}

// s3Entries returns the stand-in's log lines from mark on: every request it answered before
// the call. The stand-in writes a request's line before its response, but the test reads its
// output through a pipe: a request straight to the stand-in, whose line comes after all
// those, is waited for first (a barrier), and left out.
func (e *awsEnv) s3Entries(t *testing.T, from int) []map[string]any {
	t.Helper()
	barrier := "/_barrier/" + randHex(8)
	direct := &http.Client{Transport: &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{RootCAs: e.upstreamCAs}}, Timeout: waitTimeout}
	resp, err := direct.Get(e.endpoint + barrier)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	e.s3.waitFrom(t, from, barrier)
	var out []map[string]any
	for _, l := range e.s3.snapshot()[from:] {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && !strings.HasPrefix(fmt.Sprint(m["path"]), "/_barrier/") {
			out = append(out, m)
		}
	}
	return out
}

// wantAllVerified fails unless every request the stand-in saw since mark had its signature
// verified and was served (2xx), and returns the payload forms seen.
func (e *awsEnv) wantAllVerified(t *testing.T, from int) map[string]bool {
	t.Helper()
	forms := map[string]bool{}
	entries := e.s3Entries(t, from)
	if len(entries) == 0 {
		t.Fatal("the S3 stand-in saw no request")
	}
	for _, m := range entries {
		if st, _ := m["status"].(float64); st < 200 || st > 299 {
			t.Errorf("the S3 stand-in refused %v %v: %v (status %v)", m["method"], m["path"], m["error"], m["status"])
		}
		forms[fmt.Sprint(m["auth"], " ", m["payload"])] = true
	}
	return forms
}

func TestAWSCLIThroughBroker(t *testing.T) {
	e := newAWSEnv(t)
	big := make([]byte, 13<<20+12345) // three parts of 5 MiB: a multipart upload
	_, _ = rand.Read(big)
	src := filepath.Join(e.dir, "big.bin")
	writeTestFile(t, src, big)
	multipart := "    multipart_threshold = 5MB\n    multipart_chunksize = 5MB\n"
	// One GET for the whole object.
	whole := "    multipart_threshold = 64MB\n"

	t.Run("s3 ls", func(t *testing.T) {
		m := e.s3.mark()
		out, err := e.cli(t, "", "s3", "ls")
		if err != nil || !strings.Contains(out, "data") || !strings.Contains(out, "secret") {
			t.Fatalf("aws s3 ls: %v\n%s", err, out)
		}
		e.wantAllVerified(t, m)
	})

	t.Run("s3 cp up, multipart", func(t *testing.T) {
		m := e.s3.mark()
		out, err := e.cli(t, multipart, "s3", "cp", src, "s3://data/out/big.bin")
		if err != nil {
			t.Fatalf("aws s3 cp up: %v\n%s", err, out)
		}
		forms := e.wantAllVerified(t, m)
		parts := 0
		for _, en := range e.s3Entries(t, m) {
			if en["method"] == "PUT" {
				parts++
			}
		}
		if parts != 3 {
			t.Errorf("%d parts uploaded, want 3 (forms %v)", parts, forms)
		}
		t.Logf("payload forms the CLI used: %v", forms)
	})

	t.Run("s3 cp down", func(t *testing.T) {
		m := e.s3.mark()
		dst := filepath.Join(e.dir, "down.bin")
		out, err := e.cli(t, whole, "s3", "cp", "s3://data/out/big.bin", dst)
		if err != nil {
			t.Fatalf("aws s3 cp down: %v\n%s", err, out)
		}
		got, _ := os.ReadFile(dst)
		if !bytes.Equal(got, big) {
			t.Fatalf("downloaded %d bytes, not the %d uploaded", len(got), len(big))
		}
		e.wantAllVerified(t, m)
		out, err = e.cli(t, "", "s3", "ls", "s3://data/out/")
		if err != nil || !strings.Contains(out, "big.bin") || !strings.Contains(out, strconv.Itoa(len(big))) {
			t.Fatalf("aws s3 ls s3://data/out/: %v\n%s", err, out)
		}
	})

	t.Run("s3 cp down in ranges", func(t *testing.T) {
		// The CLI downloads in 5 MiB ranges; the broker widens each by the secrets' length,
		// masks them in place and cuts the range out: the parts join into the object.
		m := e.s3.mark()
		dst := filepath.Join(e.dir, "ranged.bin")
		out, err := e.cli(t, multipart, "s3", "cp", "s3://data/out/big.bin", dst)
		if err != nil {
			t.Fatalf("aws s3 cp down in ranges: %v\n%s", err, out)
		}
		if got, _ := os.ReadFile(dst); !bytes.Equal(got, big) {
			t.Fatalf("downloaded %d bytes in ranges, not the %d uploaded", len(got), len(big))
		}
		gets := 0
		for _, en := range e.s3Entries(t, m) {
			if en["method"] == "GET" {
				gets++
			}
		}
		if gets < 3 {
			t.Errorf("%d GETs reached the stand-in, want one per 5 MiB range", gets)
		}
		e.wantAllVerified(t, m)
	})

	t.Run("presigned GET with curl", func(t *testing.T) {
		out, err := e.cli(t, "", "s3", "presign", "s3://data/out/big.bin", "--expires-in", "300")
		if err != nil {
			t.Fatalf("aws s3 presign: %v\n%s", err, out)
		}
		u := strings.TrimSpace(out)
		if !strings.Contains(u, "X-Amz-Signature=") || !strings.Contains(u, placeholderKeyID) {
			t.Fatalf("not a presigned URL with the placeholder key: %s", u)
		}
		m := e.s3.mark()
		dst := filepath.Join(e.dir, "presigned.bin")
		curl := exec.Command("curl", "-sS", "--fail-with-body", "-o", dst, u)
		curl.Env = append(harness.Env(), "HTTPS_PROXY="+e.broker.proxyURL("coder-1", e.token), "NO_PROXY=", "CURL_CA_BUNDLE="+e.broker.caFile)
		if out, err := curl.CombinedOutput(); err != nil {
			t.Fatalf("curl: %v\n%s", err, out)
		}
		got, _ := os.ReadFile(dst)
		if !bytes.Equal(got, big) {
			t.Fatalf("presigned GET gave %d bytes", len(got))
		}
		if forms := e.wantAllVerified(t, m); !forms["presigned "] {
			t.Errorf("the stand-in saw no presigned request: %v", forms)
		}
	})

	t.Run("denied: write outside the prefix", func(t *testing.T) {
		m := e.s3.mark()
		small := filepath.Join(e.dir, "small.txt")
		writeTestFile(t, small, []byte("not for this prefix"))
		out, err := e.cli(t, "", "s3", "cp", small, "s3://data/elsewhere.bin")
		if err == nil {
			t.Fatalf("upload outside the prefix succeeded:\n%s", out)
		}
		if !strings.Contains(out, "403") && !strings.Contains(out, "Forbidden") {
			t.Errorf("CLI output does not say 403:\n%s", out)
		}
		ev := e.broker.waitAuditWhere(t, 1, "the denied PutObject", func(ev auditEvent) bool {
			return ev["decision"] == "deny" && strings.Contains(fmt.Sprint(ev["reason"]), "elsewhere.bin")
		})[0]
		if want := "S3 PutObject of data/elsewhere.bin is not allowed: agents may read data and write under data/out/"; ev["reason"] != want {
			t.Errorf("reason %q, want %q", ev["reason"], want)
		}
		if len(e.s3Entries(t, m)) != 0 {
			t.Error("a denied request reached the S3 stand-in")
		}
	})

	t.Run("denied: IAM", func(t *testing.T) {
		out, err := e.cli(t, "", "iam", "list-users")
		if err == nil {
			t.Fatalf("IAM ListUsers succeeded:\n%s", out)
		}
		ev := e.broker.waitAuditWhere(t, 1, "the denied IAM call", func(ev auditEvent) bool {
			aws, _ := ev["aws"].(map[string]any)
			return ev["decision"] == "deny" && aws["service"] == "iam"
		})[0]
		if ev["reason"] != "AWS iam is never allowed for agents (ListUsers)" {
			t.Errorf("reason %q", ev["reason"])
		}
	})

	t.Run("no root secret in logs or audit", func(t *testing.T) {
		e.noRoot(t, "the broker's log", e.broker.logs.String())
		e.noRoot(t, "the audit log", e.broker.auditLog.String())
	})
}

// awsClient is an aws-sdk-go-v2 S3 client as an agent runs it: placeholder keys, the broker
// as proxy, its CA trusted.
func (e *awsEnv) sdkClient(t *testing.T) *s3.Client {
	t.Helper()
	pu, _ := url.Parse(e.broker.proxyURL("coder-1", e.token))
	hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu), TLSClientConfig: &tls.Config{RootCAs: e.broker.caPool(t)}}}
	return e.s3Client(hc, placeholderKeyID, placeholderSecret, "placeholder-session-token")
}

func (e *awsEnv) s3Client(hc *http.Client, id, secret, token string) *s3.Client {
	return s3.New(s3.Options{
		Region:       "us-east-1",
		BaseEndpoint: sdk.String(e.endpoint),
		UsePathStyle: true,
		HTTPClient:   hc,
		Credentials:  awscreds.NewStaticCredentialsProvider(id, secret, token),
	})
}

func TestAWSSDKThroughBroker(t *testing.T) {
	e := newAWSEnv(t)
	c := e.sdkClient(t)
	ctx := context.Background()
	// The stand-in checks signatures: straight to it, a placeholder key or a wrong secret is
	// refused, the real key accepted.
	direct := &http.Client{Transport: &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{RootCAs: e.upstreamCAs}}}
	for name, k := range map[string][3]string{
		"placeholder key": {placeholderKeyID, placeholderSecret, ""},
		"wrong secret":    {e.rootID, "not-the-secret", e.rootTok},
	} {
		if _, err := e.s3Client(direct, k[0], k[1], k[2]).ListBuckets(ctx, &s3.ListBucketsInput{}); err == nil || !strings.Contains(err.Error(), "403") {
			t.Fatalf("the stand-in accepted a request signed with a %s: %v", name, err)
		}
	}
	if _, err := e.s3Client(direct, e.rootID, e.rootKey, e.rootTok).ListBuckets(ctx, &s3.ListBucketsInput{}); err != nil {
		t.Fatalf("the stand-in refused the real key: %v", err)
	}
	body := bytes.Repeat([]byte("capbroker "), 700000) // 7 MB, streamed with a trailing checksum
	m := e.s3.mark()
	if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: sdk.String("data"), Key: sdk.String("out/sdk.txt"), Body: bytes.NewReader(body)}); err != nil {
		t.Fatalf("PutObject: %v", err)
	}
	// A body the SDK cannot seek, streamed.
	if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: sdk.String("data"), Key: sdk.String("out/stream.txt"),
		Body: io.MultiReader(bytes.NewReader(body)), ContentLength: sdk.Int64(int64(len(body)))}); err != nil {
		t.Fatalf("PutObject, streamed: %v", err)
	}
	got, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: sdk.String("data"), Key: sdk.String("out/sdk.txt")})
	if err != nil {
		t.Fatalf("GetObject: %v", err)
	}
	b, _ := io.ReadAll(got.Body)
	got.Body.Close()
	if !bytes.Equal(b, body) {
		t.Fatalf("GetObject gave %d bytes", len(b))
	}
	list, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: sdk.String("data"), Prefix: sdk.String("out/")})
	if err != nil || len(list.Contents) != 2 || *list.Contents[0].Key != "out/sdk.txt" || *list.Contents[1].Size != int64(len(body)) {
		t.Fatalf("ListObjectsV2: %v %+v", err, list)
	}
	forms := e.wantAllVerified(t, m)
	if !forms["header UNSIGNED-PAYLOAD"] {
		t.Errorf("the SDK's uploads were not in the forms expected: %v", forms)
	}
	t.Logf("payload forms the SDK used: %v", forms)

	// A reflected root key is scrubbed: the stand-in echoes the signed request's headers.
	echo, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: sdk.String("data"), Key: sdk.String("_echo_request")})
	if err != nil {
		t.Fatalf("GetObject _echo_request: %v", err)
	}
	b, _ = io.ReadAll(echo.Body)
	echo.Body.Close()
	if !strings.Contains(string(b), "[REDACTED]") {
		t.Errorf("the echo holds no redaction:\n%s", b)
	}
	e.noRoot(t, "a response", string(b))

	// Denied by the policy: reading a bucket not on the list. The agent reads why.
	_, err = c.GetObject(ctx, &s3.GetObjectInput{Bucket: sdk.String("secret"), Key: sdk.String("k")})
	if err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("GetObject from the unlisted bucket: %v", err)
	}

	// Requests the broker cannot re-sign are refused, naming why, and never sent on: by the
	// policy when nothing says which service they are for (a custom endpoint, no SigV4
	// scope), by the signer when the signature is one it does not re-sign.
	hc := e.broker.client(t, "coder-1", e.token)
	m = e.s3.mark()
	scope := placeholderKeyID + "/" + time.Now().UTC().Format("20060102") + "/us-east-1/s3/aws4_request"
	unknown := "the broker cannot tell which AWS service this request is for"
	for name, c := range map[string]struct {
		url     string
		headers map[string]string
		status  int
		want    string
	}{
		"unsigned":        {url: "/data/out/sdk.txt", status: 403, want: unknown},
		"SigV2 presigned": {url: "/data/out/sdk.txt?AWSAccessKeyId=" + placeholderKeyID + "&Signature=abc%3D&Expires=1796374089", status: 403, want: unknown},
		"SigV4a": {url: "/data/out/sdk.txt", headers: map[string]string{"Authorization": "AWS4-ECDSA-P256-SHA256 Credential=" + placeholderKeyID + "/20261204/s3/aws4_request, SignedHeaders=host, Signature=00"},
			status: 403, want: unknown},
		"bad payload hash": {url: "/data/out/sdk.txt", headers: map[string]string{"Authorization": "AWS4-HMAC-SHA256 Credential=" + scope + ", SignedHeaders=host, Signature=00", "X-Amz-Content-Sha256": "sha-of-nothing"},
			status: 400, want: "cannot sign this request: aws: request signature not supported: x-amz-content-sha256 is neither"},
		// Re-signed with its own date: AWS, here the stand-in, refuses it as expired.
		"presigned, expired": {url: "/data/out/sdk.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=" + url.QueryEscape(strings.Replace(scope, time.Now().UTC().Format("20060102"), "20200101", 1)) +
			"&X-Amz-Date=20200101T000000Z&X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Signature=00", status: 403, want: "AccessDenied"},
	} {
		req, _ := http.NewRequest("GET", e.endpoint+c.url, nil)
		for k, v := range c.headers {
			req.Header.Set(k, v)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || !strings.Contains(string(b), c.want) {
			t.Errorf("%s: %d %s\nwant %d naming %q", name, resp.StatusCode, b, c.status, c.want)
		}
	}
	if n := len(e.s3Entries(t, m)); n != 1 {
		t.Errorf("the stand-in saw %d of these requests, want only the expired presigned one", n)
	}
}

// TestAWSSignedChunksThroughBroker sends the aws-chunked forms whose every chunk is signed
// (STREAMING-AWS4-HMAC-SHA256-PAYLOAD, and -TRAILER with a trailing checksum), as SDKs do over
// plain HTTP: the agent's chunk signatures are placeholders; the stand-in checks the chain the
// broker re-signed, chunk by chunk, from the seed signature, and the checksum.
func TestAWSSignedChunksThroughBroker(t *testing.T) {
	e := newAWSEnv(t)
	hc := e.broker.client(t, "coder-1", e.token)
	data := make([]byte, 3<<20+777)
	_, _ = rand.Read(data)
	for _, trailer := range []bool{false, true} {
		t.Run(fmt.Sprintf("trailer=%v", trailer), func(t *testing.T) {
			key := fmt.Sprintf("out/chunked-%v", trailer)
			body := awsChunked(data, 64<<10, trailer)
			req, _ := http.NewRequest("PUT", e.endpoint+"/data/"+key, bytes.NewReader(body))
			payload := "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
			signed := "content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length"
			if trailer {
				payload += "-TRAILER"
				req.Header.Set("X-Amz-Trailer", "x-amz-checksum-crc32")
				signed += ";x-amz-trailer"
			}
			now := time.Now().UTC()
			req.Header.Set("Content-Encoding", "aws-chunked")
			req.Header.Set("X-Amz-Decoded-Content-Length", strconv.Itoa(len(data)))
			req.Header.Set("X-Amz-Content-Sha256", payload)
			req.Header.Set("X-Amz-Date", now.Format("20060102T150405Z"))
			req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential="+placeholderKeyID+"/"+now.Format("20060102")+
				"/us-east-1/s3/aws4_request, SignedHeaders="+signed+", Signature="+strings.Repeat("0", 64))
			m := e.s3.mark()
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			rb, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s\n%v", resp.StatusCode, rb, e.s3Entries(t, m))
			}
			if forms := e.wantAllVerified(t, m); !forms["header "+payload] {
				t.Errorf("forms %v", forms)
			}
			e.noRoot(t, "a response", string(rb))
		})
	}
	// A malformed aws-chunked body is not sent on unsigned: the upload fails.
	req, _ := http.NewRequest("PUT", e.endpoint+"/data/out/bad", strings.NewReader("5\r\nhello\r\n0\r\n\r\n"))
	now := time.Now().UTC()
	req.Header.Set("Content-Encoding", "aws-chunked")
	req.Header.Set("X-Amz-Decoded-Content-Length", "5")
	req.Header.Set("X-Amz-Content-Sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
	req.Header.Set("X-Amz-Date", now.Format("20060102T150405Z"))
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential="+placeholderKeyID+"/"+now.Format("20060102")+
		"/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature="+strings.Repeat("0", 64))
	resp, err := hc.Do(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("a malformed aws-chunked body was stored")
		}
	}
}

// awsChunked encodes data as an agent's aws-chunked body with placeholder signatures.
func awsChunked(data []byte, size int, trailer bool) []byte {
	var b bytes.Buffer
	w := bufio.NewWriter(&b)
	zero := strings.Repeat("0", 64)
	for off := 0; ; off += size {
		chunk := data[min(off, len(data)):min(off+size, len(data))]
		fmt.Fprintf(w, "%x;chunk-signature=%s\r\n", len(chunk), zero)
		if len(chunk) == 0 {
			break
		}
		w.Write(chunk)
		w.WriteString("\r\n")
	}
	if trailer {
		fmt.Fprintf(w, "x-amz-checksum-crc32:%s\r\nx-amz-trailer-signature:%s\r\n", crc32Base64(data), zero)
	}
	w.WriteString("\r\n")
	w.Flush()
	return b.Bytes()
}

func crc32Base64(data []byte) string {
	v := crc32.ChecksumIEEE(data)
	return base64.StdEncoding.EncodeToString([]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// TestAWSVaultRotation: the root key comes from Vault's KV (fields as AWS names them); when it
// is rotated there, requests are signed with the new key without a restart, and responses are
// scrubbed of both.
func TestAWSVaultRotation(t *testing.T) {
	vault := vaulttest.Start(t)
	first, second := newAWSKey(), newAWSKey()
	put := func(k awsKey) {
		t.Helper()
		if _, err := vault.Client().KVv2("secret").Put(t.Context(), "aws", map[string]any{
			"access_key_id": k.ID, "secret_access_key": k.Secret, "session_token": k.Token, "note": "rotated by the test",
		}); err != nil {
			t.Fatal(err)
		}
	}
	// The stand-in's main key is a third one the broker never has; it accepts both of these.
	e := newAWSEnvWith(t, awsEnvOpts{vault: vault.Addr, vaultToken: vault.RootToken, more: []awsKey{first, second}})
	put(first)
	c := e.sdkClient(t)
	ctx := context.Background()
	signedWith := func(k awsKey) bool {
		t.Helper()
		m := e.s3.mark()
		if _, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: sdk.String("data")}); err != nil {
			return false
		}
		en := e.s3Entries(t, m)
		return len(en) == 1 && en[0]["key"] == k.ID && en[0]["status"] == float64(200)
	}
	waitSigned := func(k awsKey) {
		t.Helper()
		deadline := time.Now().Add(waitTimeout)
		for !signedWith(k) {
			if time.Now().After(deadline) {
				t.Fatalf("requests are not signed with key %s; stand-in log:\n%s", k.ID, e.s3.String())
			}
		}
	}
	waitSigned(first)
	put(second)
	waitSigned(second)
	echo, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: sdk.String("data"), Key: sdk.String("_echo_request")})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(echo.Body)
	echo.Body.Close()
	for _, v := range []string{first.Secret, first.Token, second.Secret, second.Token, second.ID} {
		if strings.Contains(string(b), v) {
			t.Errorf("a root key's value is in a response:\n%s", b)
		}
	}
	for _, l := range []string{e.broker.logs.String(), e.broker.auditLog.String()} {
		for _, v := range []string{first.Secret, first.Token, second.Secret, second.Token} {
			if strings.Contains(l, v) {
				t.Error("a root key's value is in the broker's log or audit")
			}
		}
	}
}

// TestAWSRootKeyIncomplete: a root key with a field missing makes the credential not ready,
// named in /readyz by the field it lacks (never a value), and requests to its hosts 503.
func TestAWSRootKeyIncomplete(t *testing.T) {
	dir := t.TempDir()
	rootFile := filepath.Join(dir, "aws.json")
	secret := "half-a-key-" + randHex(12)
	writeTestFile(t, rootFile, []byte(`{"secret_access_key": "`+secret+`"}`))
	token := randHex(16)
	b := startBroker(t, brokerOpts{mode: "enforce", policy: awsPolicy,
		files: map[string]string{"aws.rego": readShipped(t, "aws.rego"), "data.yaml": awsData},
		config: fmt.Sprintf(`upstream: {allow_private: ["127.0.0.1/32"]}
agents:
  - {id: coder-1, token_env: CODER1_TOKEN}
credentials:
  - name: aws
    hosts: [localhost]
    source: {file: %q}
    aws_sigv4: {}
`, rootFile), env: []string{"CODER1_TOKEN=" + token}})
	r := b.waitReadyz(t, "the aws credential not ready", func(r readyz) bool { return r.Credentials["aws"] != "" })
	if !strings.Contains(r.Credentials["aws"], "no access key id") || strings.Contains(r.Credentials["aws"], secret) {
		t.Errorf("/readyz says %q", r.Credentials["aws"])
	}
	req, _ := http.NewRequest("GET", "https://localhost:1/data/k", nil)
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential="+placeholderKeyID+"/20261204/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00")
	resp, err := b.client(t, "coder-1", token).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(body), "credential_unavailable") || strings.Contains(string(body), secret) {
		t.Errorf("%d %s", resp.StatusCode, body)
	}
	if strings.Contains(b.logs.String(), secret) || strings.Contains(b.auditLog.String(), secret) {
		t.Error("the secret is in the broker's log or audit")
	}
}
