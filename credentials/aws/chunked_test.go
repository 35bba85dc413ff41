package aws

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// chunkSigner is the test's own aws-chunked encoder and verifier (written from AWS's
// description of the format, separately from the rechunker).
type chunkSigner struct {
	key            []byte
	amzDate, scope string
}

func newChunkSigner(secret string, at time.Time, region string) chunkSigner {
	date := at.Format("20060102")
	k := []byte("AWS4" + secret)
	for _, s := range []string{date, region, "s3", "aws4_request"} {
		m := hmac.New(sha256.New, k)
		m.Write([]byte(s))
		k = m.Sum(nil)
	}
	return chunkSigner{key: k, amzDate: at.Format(amzDateForm), scope: date + "/" + region + "/s3/aws4_request"}
}

func (c chunkSigner) sig(kind, prev, hash string) string {
	m := hmac.New(sha256.New, c.key)
	fmt.Fprintf(m, "AWS4-HMAC-SHA256-%s\n%s\n%s\n%s\n%s", kind, c.amzDate, c.scope, prev, hash)
	return hex.EncodeToString(m.Sum(nil))
}

// encode makes an aws-chunked body of data in chunks of size, chained from seed.
func (c chunkSigner) encode(data []byte, size int, seed string, trailer bool) []byte {
	var b bytes.Buffer
	prev := seed
	for off := 0; ; off += size {
		chunk := data[min(off, len(data)):min(off+size, len(data))]
		prev = c.sig("PAYLOAD", prev, emptySHA256+"\n"+sha(chunk))
		fmt.Fprintf(&b, "%x;chunk-signature=%s\r\n", len(chunk), prev)
		if len(chunk) == 0 {
			break
		}
		b.Write(chunk)
		b.WriteString("\r\n")
	}
	if !trailer {
		b.WriteString("\r\n")
		return b.Bytes()
	}
	crc := make([]byte, 4)
	v := crc32.ChecksumIEEE(data)
	crc[0], crc[1], crc[2], crc[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
	line := "x-amz-checksum-crc32:" + base64.StdEncoding.EncodeToString(crc)
	fmt.Fprintf(&b, "%s\r\nx-amz-trailer-signature:%s\r\n\r\n", line, c.sig("TRAILER", prev, sha([]byte(line+"\n"))))
	return b.Bytes()
}

// verify checks every chunk and trailer signature of body, chained from seed, and returns the data.
func (c chunkSigner) verify(t *testing.T, body []byte, seed string, trailer bool) []byte {
	t.Helper()
	r := bufio.NewReader(bytes.NewReader(body))
	prev := seed
	var data []byte
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("chunk header: %v", err)
		}
		size, sig, _ := strings.Cut(strings.TrimSuffix(line, "\r\n"), ";chunk-signature=")
		n, _ := strconv.ParseInt(size, 16, 64)
		chunk := make([]byte, n)
		if _, err := io.ReadFull(r, chunk); err != nil {
			t.Fatal(err)
		}
		if want := c.sig("PAYLOAD", prev, emptySHA256+"\n"+sha(chunk)); sig != want {
			t.Fatalf("chunk at %d: signature %s, want %s", len(data), sig, want)
		}
		prev = sig
		if n == 0 {
			break
		}
		data = append(data, chunk...)
		if crlf, _ := r.ReadString('\n'); crlf != "\r\n" {
			t.Fatalf("no CRLF after chunk")
		}
	}
	rest, _ := io.ReadAll(r)
	if !trailer {
		if string(rest) != "\r\n" {
			t.Fatalf("after the final chunk: %q", rest)
		}
		return data
	}
	lines := strings.Split(string(rest), "\r\n")
	if len(lines) != 4 || lines[2] != "" || lines[3] != "" {
		t.Fatalf("trailer: %q", rest)
	}
	if want := "x-amz-trailer-signature:" + c.sig("TRAILER", prev, sha([]byte(lines[0]+"\n"))); lines[1] != want {
		t.Fatalf("trailer signature %q, want %q", lines[1], want)
	}
	return data
}

func chunkedRequest(t *testing.T, trailer bool, data []byte, chunk int) (*http.Request, []byte) {
	t.Helper()
	agent := newChunkSigner(fakeSecret, signTime, "us-east-1")
	payload := streamingSigned
	if trailer {
		payload = streamingSignedTrail
	}
	body := agent.encode(data, chunk, strings.Repeat("0", 64), trailer)
	req, _ := http.NewRequest("PUT", "https://s3.us-east-1.amazonaws.com/bkt/big", bytes.NewReader(body))
	req.Header.Set("Content-Encoding", "aws-chunked")
	req.Header.Set("X-Amz-Decoded-Content-Length", strconv.Itoa(len(data)))
	req.Header.Set("X-Amz-Content-Sha256", payload)
	if trailer {
		req.Header.Set("X-Amz-Trailer", "x-amz-checksum-crc32")
	}
	req.Header.Set("X-Amz-Date", signTime.Format(amzDateForm))
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential="+fakeID+"/20261204/us-east-1/s3/aws4_request, "+
		"SignedHeaders=content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;x-amz-decoded-content-length, Signature="+strings.Repeat("0", 64))
	return req, body
}

func TestRechunk(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320000 bytes: 4 full chunks and a short one
	for _, trailer := range []bool{false, true} {
		t.Run(fmt.Sprintf("trailer=%v", trailer), func(t *testing.T) {
			req, in := chunkedRequest(t, trailer, data, 64<<10)
			if err := newTestSigner(t, false, Options{}).Sign(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			out, err := io.ReadAll(req.Body)
			if err != nil {
				t.Fatal(err)
			}
			if len(out) != len(in) || req.ContentLength != int64(len(in)) {
				t.Fatalf("length %d (Content-Length %d), want %d", len(out), req.ContentLength, len(in))
			}
			seed := req.Header.Get("Authorization")
			seed = seed[strings.LastIndex(seed, "=")+1:]
			got := newChunkSigner(rootSecret, signTime, "us-east-1").verify(t, out, seed, trailer)
			if !bytes.Equal(got, data) {
				t.Fatal("data changed")
			}
		})
	}
}

func TestRechunkMalformed(t *testing.T) {
	good := newChunkSigner(fakeSecret, signTime, "us-east-1").encode([]byte("hello"), 8, strings.Repeat("0", 64), false)
	cases := map[string][]byte{
		"truncated":      good[:len(good)-10],
		"no signature":   []byte("5\r\nhello\r\n0\r\n\r\n"),
		"short sig":      []byte("5;chunk-signature=abc\r\nhello\r\n"),
		"not hex":        []byte("zz;chunk-signature=" + strings.Repeat("0", 64) + "\r\n"),
		"too big":        []byte(fmt.Sprintf("%x;chunk-signature=%s\r\n", MaxChunk+1, strings.Repeat("0", 64))),
		"no crlf":        bytes.Replace(good, []byte("hello\r\n"), []byte("helloXY"), 1),
		"data after end": append(append([]byte{}, good...), "junk"...),
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			req, _ := chunkedRequest(t, false, []byte("hello"), 8)
			req.Body = io.NopCloser(bytes.NewReader(body))
			if err := newTestSigner(t, false, Options{}).Sign(context.Background(), req); err != nil {
				t.Fatal(err)
			}
			_, err := io.ReadAll(req.Body)
			if !errors.Is(err, errChunked) {
				t.Fatalf("err = %v, want a malformed-body error", err)
			}
		})
	}
}
