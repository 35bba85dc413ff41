package aws

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkStaticHeader is the baseline: what injecting a static bearer token costs.
func BenchmarkStaticHeader(b *testing.B) {
	c := headerCases["s3 list"]
	req := c.request(b)
	sdkSign(b, req, c, fakeID, fakeSecret, "", signTime)
	secret := rootSecretFields(false)
	b.ReportAllocs()
	for b.Loop() {
		r := req.Clone(context.Background())
		r.Header.Set("Authorization", "Bearer "+secret.Reveal())
	}
}

// BenchmarkSignHeader re-signs a header-signed S3 request (declared payload hash): the
// canonical request is hashed once and signed; the derived key is cached.
func BenchmarkSignHeader(b *testing.B) {
	c := headerCases["s3 list"]
	req := c.request(b)
	sdkSign(b, req, c, fakeID, fakeSecret, "", signTime)
	s := newTestSigner(b, true, Options{})
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Sign(context.Background(), req.Clone(context.Background())); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSignPresigned re-signs a presigned GET.
func BenchmarkSignPresigned(b *testing.B) {
	u := "https://bkt.s3.eu-west-1.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=" + fakeID +
		"%2F20261204%2Feu-west-1%2Fs3%2Faws4_request&X-Amz-Date=20261204T090000Z&X-Amz-Expires=900&X-Amz-SignedHeaders=host&X-Amz-Signature=" + strings.Repeat("0", 64)
	req, _ := http.NewRequest("GET", u, nil)
	s := newTestSigner(b, true, Options{})
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Sign(context.Background(), req.Clone(context.Background())); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRechunk is the streaming re-signer's throughput on 64 KiB chunks (SHA-256 of
// every chunk, which AWS requires, dominates), beside plain SHA-256 of the same bytes.
func BenchmarkRechunk(b *testing.B) {
	data := bytes.Repeat([]byte("x"), 8<<20)
	req, body := chunkedRequest(&testing.T{}, true, data, 64<<10)
	s := newTestSigner(b, false, Options{})
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		r := req.Clone(context.Background())
		r.Body = io.NopCloser(bytes.NewReader(body))
		if err := s.Sign(context.Background(), r); err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSHA256(b *testing.B) {
	data := bytes.Repeat([]byte("x"), 8<<20)
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		_ = sha(data)
	}
}

// BenchmarkSDKSign is aws-sdk-go-v2's own signer on the same request, for scale: what an
// agent's SDK spends signing it in the first place.
func BenchmarkSDKSign(b *testing.B) {
	c := headerCases["s3 list"]
	req := c.request(b)
	b.ReportAllocs()
	for b.Loop() {
		sdkSign(b, req.Clone(context.Background()), c, rootID, rootSecret, rootToken, signTime)
	}
}
