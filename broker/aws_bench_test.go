package broker

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy"
	"github.com/capbroker/capbroker/credentials"
	"github.com/capbroker/capbroker/credentials/aws"
)

// awsBenchSecrets serves a static credential and an AWS root key, and the AWS signer.
type awsBenchSecrets struct {
	root   credentials.Secret
	signer *aws.Signer
}

func (s awsBenchSecrets) Get(_ context.Context, name string) (credentials.Secret, error) {
	if name == "aws" {
		return s.root, nil
	}
	return credentials.NewSecret(benchSecret), nil
}

func (s awsBenchSecrets) Known(name string) []credentials.Secret {
	if name == "aws" {
		return []credentials.Secret{s.root}
	}
	return []credentials.Secret{credentials.NewSecret(benchSecret)}
}

func (awsBenchSecrets) Minter(string) credentials.Minter { return nil }

func (s awsBenchSecrets) Signer(name string) credentials.Signer {
	if name == "aws" {
		return s.signer
	}
	return nil
}

// BenchmarkPipelineAWS times one intercepted S3 GET through the whole pipeline (decision,
// input.aws, injection or signing, scrubbing, audit) against an in-memory upstream: with a
// static header credential ("static"), and re-signed with an aws_sigv4 credential ("aws").
// The difference is what re-signing adds per request.
func BenchmarkPipelineAWS(b *testing.B) {
	for _, name := range []string{"static", "aws"} {
		b.Run(name, func(b *testing.B) {
			br, tun := awsBenchBroker(b, name)
			now := time.Now().UTC()
			auth := "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/" + now.Format("20060102") +
				"/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=" + strings.Repeat("0", 64)
			b.ReportAllocs()
			for b.Loop() {
				r := httptest.NewRequest(http.MethodGet, "/data/reports/a.csv", nil)
				r.Host = "s3.us-east-1.amazonaws.com"
				r.Header.Set("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD")
				r.Header.Set("X-Amz-Date", now.Format("20060102T150405Z"))
				r.Header.Set("Authorization", auth)
				w := httptest.NewRecorder()
				br.serveTunnel(w, r, tun)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
		})
	}
}

func awsBenchBroker(b *testing.B, cred string) (*Broker, *tunnel) {
	b.Helper()
	cfg := testConfig(b)
	hosts := []string{"s3.us-east-1.amazonaws.com"}
	if cred == "static" {
		cfg.Credentials = append(cfg.Credentials, config.Credential{Name: "static", Hosts: hosts, Source: config.Source{Env: "X"},
			Inject: config.Inject{Header: "Authorization", Value: "Bearer {{secret}}"}})
	} else {
		cfg.Credentials = append(cfg.Credentials, config.Credential{Name: "aws", Hosts: hosts, AWSSigV4: &config.AWSSigV4{}})
	}
	sec := awsBenchSecrets{root: credentials.NewFields(map[string]string{
		"access_key_id": "AKIABENCH00000000001", "secret_access_key": "bench-secret-key-0123456789abcdef01234567", "session_token": "bench-session-token-0123456789",
	})}
	var err error
	sec.signer, err = aws.New(func(ctx context.Context) (credentials.Secret, error) { return sec.root, nil }, aws.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return testBroker(b, cfg, Deps{Policy: fixedDecision{policy.Decision{Credentials: []string{cred}}}, Secrets: sec}, memoryUpstream{}, "s3.us-east-1.amazonaws.com")
}
