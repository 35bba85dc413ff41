package aws

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

const (
	algorithm   = "AWS4-HMAC-SHA256"
	amzDateForm = "20060102T150405Z"
	emptySHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

	unsignedPayload       = "UNSIGNED-PAYLOAD"
	streamingSigned       = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
	streamingSignedTrail  = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
	streamingUnsignedTrai = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
)

// Header and query names, as Go canonicalises them and as AWS spells them.
const (
	hAuthorization = "Authorization"
	hDate          = "X-Amz-Date"
	hContentSHA256 = "X-Amz-Content-Sha256"
	hSecurityToken = "X-Amz-Security-Token"

	qAlgorithm     = "X-Amz-Algorithm"
	qCredential    = "X-Amz-Credential"
	qDate          = "X-Amz-Date"
	qExpires       = "X-Amz-Expires"
	qSignedHeaders = "X-Amz-SignedHeaders"
	qSignature     = "X-Amz-Signature"
	qSecurityToken = "X-Amz-Security-Token"
)

// signature is what the agent's signature says: how it was made and what it covers.
type signature struct {
	presigned                bool
	date                     string   // yyyymmdd of the credential scope
	region, service          string   // of the credential scope
	signedHeaders            []string // lower-case, as the agent listed them
	query                    []param  // the query, decoded, in order
	amzDate, expires, sha256 string   // presigned: X-Amz-Date, X-Amz-Expires, X-Amz-Content-Sha256
}

// param is one query parameter, decoded.
type param struct{ k, v string }

func unsupported(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsupported, fmt.Sprintf(format, args...))
}

// parseSignature reads the agent's signature: an Authorization header or a presigned query.
// Nothing of it is kept but its shape; its values (placeholder key id, signature) are
// dropped. Errors never quote the header.
func parseSignature(req *http.Request) (*signature, error) {
	q, err := parseQuery(req.URL.RawQuery)
	if err != nil {
		return nil, err
	}
	sig := &signature{query: q}
	auths := req.Header.Values(hAuthorization)
	inQuery := slices.ContainsFunc(q, func(p param) bool {
		return strings.EqualFold(p.k, qAlgorithm) || strings.EqualFold(p.k, qSignature) || strings.EqualFold(p.k, qCredential)
	})
	switch {
	case len(auths) > 1:
		return nil, unsupported("more than one Authorization header")
	case len(auths) == 1 && inQuery:
		return nil, unsupported("signed both in the Authorization header and in the query")
	case len(auths) == 1:
		return sig, sig.parseHeader(auths[0])
	case inQuery:
		sig.presigned = true
		return sig, sig.parseQuery()
	case slices.ContainsFunc(q, func(p param) bool { return p.k == "AWSAccessKeyId" }):
		return nil, unsupported("SigV2 presigned URLs are not re-signed; presign with SigV4 (AWS CLI: s3 signature_version = s3v4)")
	}
	return nil, unsupported("the request is not signed (give the SDK placeholder keys: it must sign with SigV4 for the broker to re-sign)")
}

func (sig *signature) parseHeader(h string) error {
	alg, rest, _ := strings.Cut(h, " ")
	switch {
	case alg == "AWS4-ECDSA-P256-SHA256":
		return unsupported("SigV4a (AWS4-ECDSA-P256-SHA256) signatures are not re-signed; use a regional endpoint")
	case alg == "AWS":
		return unsupported("SigV2 signatures are not re-signed; configure the client for SigV4")
	case alg != algorithm:
		return unsupported("Authorization is not an AWS SigV4 signature")
	}
	var cred, signed string
	var sigSeen bool
	for part := range strings.SplitSeq(rest, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "Credential":
			cred = v
		case "SignedHeaders":
			signed = v
		case "Signature":
			sigSeen = true
		default:
			return unsupported("Authorization has an unknown component")
		}
	}
	if !sigSeen {
		return unsupported("Authorization has no Signature")
	}
	if err := sig.parseCredential(cred); err != nil {
		return err
	}
	return sig.parseSignedHeaders(signed)
}

func (sig *signature) parseQuery() error {
	var alg, cred, signed string
	for _, p := range sig.query {
		switch p.k {
		case qAlgorithm:
			alg = p.v
		case qCredential:
			cred = p.v
		case qSignedHeaders:
			signed = p.v
		case qDate:
			sig.amzDate = p.v
		case qExpires:
			sig.expires = p.v
		case "X-Amz-Content-Sha256", "x-amz-content-sha256":
			sig.sha256 = p.v
		}
	}
	switch {
	case alg == "AWS4-ECDSA-P256-SHA256":
		return unsupported("SigV4a presigned URLs are not re-signed")
	case alg != algorithm:
		return unsupported("presigned URL is not signed with %s", algorithm)
	}
	if _, err := time.Parse(amzDateForm, sig.amzDate); err != nil {
		return unsupported("presigned URL has no valid X-Amz-Date")
	}
	if n, err := strconv.Atoi(sig.expires); err != nil || n <= 0 {
		return unsupported("presigned URL has no valid X-Amz-Expires")
	}
	if err := sig.parseCredential(cred); err != nil {
		return err
	}
	if sig.amzDate[:8] != sig.date {
		return unsupported("presigned URL's X-Amz-Date is not its credential scope's date")
	}
	return sig.parseSignedHeaders(signed)
}

// parseCredential reads KEYID/yyyymmdd/region/service/aws4_request. The key id is dropped.
func (sig *signature) parseCredential(c string) error {
	parts := strings.Split(c, "/")
	if len(parts) != 5 || parts[4] != "aws4_request" {
		return unsupported("credential scope is not KEYID/date/region/service/aws4_request")
	}
	if _, err := time.Parse("20060102", parts[1]); err != nil {
		return unsupported("credential scope has no valid date")
	}
	if !validName(parts[2]) || !validName(parts[3]) {
		return unsupported("credential scope has no valid region or service")
	}
	sig.date, sig.region, sig.service = parts[1], parts[2], parts[3]
	return nil
}

func (sig *signature) parseSignedHeaders(s string) error {
	if s == "" {
		return unsupported("no signed headers")
	}
	sig.signedHeaders = strings.Split(s, ";")
	for _, h := range sig.signedHeaders {
		if h == "" || h != strings.ToLower(h) || !validToken(h) {
			return unsupported("signed headers are not a list of lower-case header names")
		}
	}
	return nil
}

// validName is a region or service name: lower-case letters, digits and '-'.
func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

func validToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// parseQuery splits a raw query into decoded parameters, in order. '+' is a plus sign, not a
// space: what is signed and sent is the strict encoding of what is decoded here (encodeQuery),
// so AWS sees exactly what was signed.
func parseQuery(raw string) ([]param, error) {
	if raw == "" {
		return nil, nil
	}
	var out []param
	for part := range strings.SplitSeq(raw, "&") {
		if part == "" {
			continue
		}
		k, v, _ := strings.Cut(part, "=")
		dk, err1 := url.PathUnescape(k)
		dv, err2 := url.PathUnescape(v)
		if err1 != nil || err2 != nil {
			return nil, unsupported("the query is not well percent-encoded")
		}
		out = append(out, param{dk, dv})
	}
	return out, nil
}

// encodeQuery writes params in order, each name and value URI-encoded as SigV4 requires.
func encodeQuery(params []param) string {
	var b strings.Builder
	for i, p := range params {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(uriEncode(p.k, true))
		b.WriteByte('=')
		b.WriteString(uriEncode(p.v, true))
	}
	return b.String()
}

// canonicalQuery is the SigV4 canonical query string: encoded, sorted by name then value.
func canonicalQuery(params []param) string {
	enc := make([]param, 0, len(params))
	for _, p := range params {
		enc = append(enc, param{uriEncode(p.k, true), uriEncode(p.v, true)})
	}
	slices.SortFunc(enc, func(a, b param) int {
		if c := strings.Compare(a.k, b.k); c != 0 {
			return c
		}
		return strings.Compare(a.v, b.v)
	})
	return encodeQueryRaw(enc)
}

func encodeQueryRaw(params []param) string {
	var b strings.Builder
	for i, p := range params {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(p.k)
		b.WriteByte('=')
		b.WriteString(p.v)
	}
	return b.String()
}

const upperhex = "0123456789ABCDEF"

// uriEncode encodes every byte but the unreserved ones (and '/', unless encodeSlash), in
// upper-case hex, as SigV4 requires.
func uriEncode(s string, encodeSlash bool) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if !unreserved(s[i]) && (encodeSlash || s[i] != '/') {
			n++
		}
	}
	if n == 0 {
		return s
	}
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if unreserved(c) || (!encodeSlash && c == '/') {
			b = append(b, c)
			continue
		}
		b = append(b, '%', upperhex[c>>4], upperhex[c&15])
	}
	return string(b)
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == '~'
}

// canonicalURI is the path as signed: for S3 the path as sent; for other services with dot
// segments and empty segments removed, and encoded once more (AWS double-encodes them).
func canonicalURI(u *url.URL, service string) string {
	p := u.EscapedPath()
	if p == "" {
		return "/"
	}
	if service == "s3" {
		return p
	}
	return uriEncode(removeDotSegments(p), false)
}

// removeDotSegments resolves "." and ".." and drops empty segments, keeping a trailing slash.
func removeDotSegments(p string) string {
	var out []string
	for seg := range strings.SplitSeq(p, "/") {
		switch seg {
		case "", ".":
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			out = append(out, seg)
		}
	}
	s := "/" + strings.Join(out, "/")
	if strings.HasSuffix(p, "/") && len(out) > 0 {
		s += "/"
	}
	return s
}

// headerValue is a header's canonical value: its values trimmed, inner runs of spaces
// collapsed, joined by commas. ok is false when the request will not carry it.
func headerValue(req *http.Request, name string) (string, bool) {
	switch name {
	case "host":
		h := req.Host
		if h == "" {
			h = req.URL.Host
		}
		return h, h != ""
	case "content-length":
		// As net/http will send it: a known length, except 0 on a GET or HEAD.
		switch {
		case req.ContentLength < 0:
			return "", false
		case req.ContentLength == 0 && (req.Method == http.MethodGet || req.Method == http.MethodHead):
			return "", false
		}
		return strconv.FormatInt(req.ContentLength, 10), true
	}
	vals := req.Header.Values(name)
	switch len(vals) {
	case 0:
		return "", false
	case 1:
		return trimAll(vals[0]), true
	}
	out := make([]string, len(vals))
	for i, v := range vals {
		out[i] = trimAll(v)
	}
	return strings.Join(out, ","), true
}

// trimAll trims v and collapses its inner runs of spaces, without allocating when there is
// nothing to do (most values).
func trimAll(v string) string {
	clean := len(v) == 0 || (v[0] != ' ' && v[len(v)-1] != ' ')
	for i := 0; clean && i < len(v); i++ {
		if v[i] == '\t' || (v[i] == ' ' && i+1 < len(v) && v[i+1] == ' ') {
			clean = false
		}
	}
	if clean {
		return v
	}
	return strings.Join(strings.Fields(v), " ")
}

// canonicalHeaders returns the canonical headers block and the signed-headers list for the
// names in signed (lower-case, any order). Names the request does not carry are left out.
func canonicalHeaders(req *http.Request, signed []string) (block, list string) {
	names := slices.Clone(signed)
	slices.Sort(names)
	names = slices.Compact(names)
	var b strings.Builder
	kept := names[:0]
	for _, n := range names {
		v, ok := headerValue(req, n)
		if !ok {
			continue
		}
		kept = append(kept, n)
		b.WriteString(n)
		b.WriteByte(':')
		b.WriteString(v)
		b.WriteByte('\n')
	}
	return b.String(), strings.Join(kept, ";")
}

func hexSHA256(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}

// deriveKey is the SigV4 signing key for one day, region and service.
func deriveKey(secret, date, region, service string) []byte {
	k := hmacSHA256([]byte("AWS4"+secret), date)
	k = hmacSHA256(k, region)
	k = hmacSHA256(k, service)
	return hmacSHA256(k, "aws4_request")
}

// validPayloadHash reports whether h is a payload hash this signer knows how to send.
func validPayloadHash(h string) bool {
	switch h {
	case unsignedPayload, streamingSigned, streamingSignedTrail, streamingUnsignedTrai:
		return true
	}
	if len(h) != 64 {
		return false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; ('0' > c || c > '9') && ('a' > c || c > 'f') {
			return false
		}
	}
	return true
}

// mustSign are headers signed whenever the request carries them, whether or not the agent
// listed them: AWS requires x-amz-* headers to be signed.
func mustSign(req *http.Request, signed []string) []string {
	out := append(slices.Clone(signed), "host")
	for name := range req.Header {
		if len(name) > 6 && strings.EqualFold(name[:6], "x-amz-") {
			out = append(out, strings.ToLower(name))
		}
	}
	return out
}

// signHeader re-signs a request signed in its Authorization header.
func (s *Signer) signHeader(req *http.Request, sig *signature, key Key, region, service string) error {
	payload := req.Header.Get(hContentSHA256)
	switch {
	case payload == "" && service == "s3":
		// S3 needs the header; a request without it would be refused there anyway.
		payload = unsignedPayload
		req.Header.Set(hContentSHA256, payload)
	case payload == "":
		h, err := s.hashBody(req)
		if err != nil {
			return err
		}
		payload = h
	case !validPayloadHash(payload):
		if strings.HasPrefix(payload, "STREAMING-AWS4-ECDSA") {
			return unsupported("SigV4a streaming uploads are not re-signed")
		}
		return unsupported("x-amz-content-sha256 is neither a SHA-256 hex digest nor a payload form the broker knows")
	}
	if len(req.Header.Values(hContentSHA256)) > 1 {
		return unsupported("more than one x-amz-content-sha256")
	}
	now := s.opts.Now().UTC()
	amzDate := now.Format(amzDateForm)
	date := amzDate[:8]
	req.Header.Del(hAuthorization)
	req.Header.Set(hDate, amzDate)
	req.Header.Del(hSecurityToken)
	if key.SessionToken != "" {
		req.Header.Set(hSecurityToken, key.SessionToken)
	}
	if q := encodeQuery(sig.query); q != req.URL.RawQuery {
		req.URL.RawQuery = q
	}
	headers, signed := canonicalHeaders(req, mustSign(req, sig.signedHeaders))
	scope := date + "/" + region + "/" + service + "/aws4_request"
	cr := req.Method + "\n" + canonicalURI(req.URL, service) + "\n" + canonicalQuery(sig.query) + "\n" +
		headers + "\n" + signed + "\n" + payload
	sk := s.signingKey(key.Secret, date, region, service)
	seed := hex.EncodeToString(hmacSHA256(sk, algorithm+"\n"+amzDate+"\n"+scope+"\n"+hexSHA256([]byte(cr))))
	req.Header.Set(hAuthorization, algorithm+" Credential="+key.ID+"/"+scope+", SignedHeaders="+signed+", Signature="+seed)
	if payload == streamingSigned || payload == streamingSignedTrail {
		if req.Body == nil || req.Body == http.NoBody {
			return unsupported("aws-chunked upload without a body")
		}
		req.Body = newRechunker(req.Body, sk, amzDate, scope, seed, payload == streamingSignedTrail)
		req.GetBody = nil
	}
	return nil
}

// signQuery re-signs a presigned URL: same date, expiry and signed headers, the real key's
// id in the credential, the real session token, a new signature.
func (s *Signer) signQuery(req *http.Request, sig *signature, key Key, region, service string) error {
	payload := sig.sha256
	switch {
	case payload == "" && service == "s3":
		payload = unsignedPayload
	case payload == "":
		h, err := s.hashBody(req)
		if err != nil {
			return err
		}
		payload = h
	case !validPayloadHash(payload) || strings.HasPrefix(payload, "STREAMING-"):
		return unsupported("presigned URL's X-Amz-Content-Sha256 is not a payload hash or UNSIGNED-PAYLOAD")
	}
	if req.Header.Get(hSecurityToken) != "" {
		return unsupported("presigned URL with an X-Amz-Security-Token header")
	}
	scope := sig.date + "/" + region + "/" + service + "/aws4_request"
	params := make([]param, 0, len(sig.query)+1)
	tokenDone := false
	for _, p := range sig.query {
		switch p.k {
		case qSignature:
			continue
		case qCredential:
			p.v = key.ID + "/" + scope
		case qSecurityToken:
			if key.SessionToken == "" || tokenDone {
				continue
			}
			p.v, tokenDone = key.SessionToken, true
		}
		params = append(params, p)
	}
	if key.SessionToken != "" && !tokenDone {
		params = append(params, param{qSecurityToken, key.SessionToken})
	}
	headers, signed := canonicalHeaders(req, append(slices.Clone(sig.signedHeaders), "host"))
	for i, p := range params {
		if p.k == qSignedHeaders {
			params[i].v = signed
		}
	}
	cr := req.Method + "\n" + canonicalURI(req.URL, service) + "\n" + canonicalQuery(params) + "\n" +
		headers + "\n" + signed + "\n" + payload
	sk := s.signingKey(key.Secret, sig.date, region, service)
	out := hex.EncodeToString(hmacSHA256(sk, algorithm+"\n"+sig.amzDate+"\n"+scope+"\n"+hexSHA256([]byte(cr))))
	req.URL.RawQuery = encodeQuery(append(params, param{qSignature, out}))
	return nil
}
