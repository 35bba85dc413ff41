package aws

import (
	"bytes"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"unicode/utf8"
)

// Meaning is what an AWS request does, for the policy (input.aws). Fields that cannot be
// known are empty.
type Meaning struct {
	Service   string `json:"service"`   // signing name: s3, iam, sts, dynamodb, ...
	Region    string `json:"region"`    // as signed
	Operation string `json:"operation"` // GetObject, ListUsers, DynamoDB GetItem, ...
	Bucket    string `json:"bucket"`    // S3
	Key       string `json:"key"`       // S3 object key, decoded
	// CopySource is the object an S3 CopyObject or UploadPartCopy reads (x-amz-copy-source):
	// a copy reads it as surely as a GetObject does.
	CopySource *Object `json:"copy_source,omitempty"`
}

// Object is an S3 object.
type Object struct {
	Bucket    string `json:"bucket"`
	Key       string `json:"key"`
	VersionID string `json:"version_id,omitempty"` // a copy source's ?versionId=
}

// maxFormBody is the largest form body read for the query protocol's Action.
const maxFormBody = 64 << 10

// Describe says what req does, as AWS will see it once signed: service and region (the
// Signer's overrides, else the agent's credential scope, else the endpoint's name), the
// operation where it can be known (S3's REST method, path and sub-resources; X-Amz-Target;
// the query protocol's Action, in the query or a small form body), and S3's bucket and key
// (virtual-hosted and path style), and the object a copy reads. ok is false when neither the
// signature nor the host names a service. err (an *AmbiguousError) is a request AWS could read
// otherwise than described: an x-amz-copy-source, X-Amz-Target or Action that does not say
// one thing only. Such a request is refused, not described by a guess.
func (s *Signer) Describe(req *http.Request) (m Meaning, ok bool, err error) {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if sig, err := parseSignature(req); err == nil {
		m.Service, m.Region = sig.service, sig.region
	} else {
		m.Service, m.Region = fromHost(host)
	}
	if s != nil && s.opts.Service != "" {
		m.Service = s.opts.Service
	}
	if s != nil && s.opts.Region != "" {
		m.Region = s.opts.Region
	}
	if m.Service == "" {
		return Meaning{}, false, nil
	}
	if err := checkAmzQuery(req); err != nil {
		return m, true, err
	}
	if m.Service == "s3" {
		return m, true, describeS3(req, host, &m)
	}
	if t := req.Header.Get("X-Amz-Target"); t != "" {
		if !validTarget(t) {
			return m, true, &AmbiguousError{Header: "X-Amz-Target", Reason: "is not one ServicePrefix.Operation name"}
		}
		m.Operation = t[strings.LastIndexByte(t, '.')+1:]
		return m, true, nil
	}
	m.Operation, err = action(req)
	return m, true, err
}

// AmbiguousError is a request part AWS could read otherwise than Describe would (see there).
// Its text names the header or parameter, never its value.
type AmbiguousError struct {
	Header string // the header, or "" for the query protocol's Action
	Reason string
}

func (e *AmbiguousError) Error() string {
	if e.Header == "" {
		return "the query protocol's Action " + e.Reason
	}
	return "the header " + e.Header + " " + e.Reason
}

// checkAmzQuery refuses x-amz-* parameters in the query that AWS could act on while the
// broker reads the header: one given twice, one also sent as a header (which of the two AWS
// takes is not the broker's to guess), and X-Amz-Copy-Source or X-Amz-Target, which Describe
// reads only as headers. Presigned URLs carry x-amz-* parameters once each.
func checkAmzQuery(req *http.Request) error {
	q, _ := parseQuery(req.URL.RawQuery)
	for i, p := range q {
		if len(p.k) < 6 || !strings.EqualFold(p.k[:6], "x-amz-") {
			continue
		}
		name := http.CanonicalHeaderKey(p.k)
		bad := func(why string) error { return &AmbiguousError{Header: name, Reason: why} }
		switch {
		case name == "X-Amz-Copy-Source" || name == "X-Amz-Target":
			return bad("is in the query; send it as a header")
		case len(req.Header.Values(name)) > 0:
			return bad("is both in the query and a header")
		}
		for _, o := range q[i+1:] {
			if strings.EqualFold(o.k, p.k) {
				return bad("is in the query more than once")
			}
		}
	}
	return nil
}

// validTarget reports whether an X-Amz-Target is one name: letters, digits and ._-: with a
// '.' before the operation (DynamoDB_20120810.GetItem).
func validTarget(t string) bool {
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-' || c == ':') {
			return false
		}
	}
	i := strings.LastIndexByte(t, '.')
	return i > 0 && i < len(t)-1
}

// fromHost reads service and region from an AWS endpoint name:
// service.region.amazonaws.com, service.amazonaws.com (global: us-east-1), and S3's forms.
func fromHost(host string) (service, region string) {
	base, ok := strings.CutSuffix(host, ".amazonaws.com")
	if !ok {
		base, ok = strings.CutSuffix(host, ".amazonaws.com.cn")
	}
	if !ok {
		return "", ""
	}
	labels := strings.Split(base, ".")
	// S3: [bucket.]s3[.dualstack].region, [bucket.]s3-region, [bucket.]s3
	for i, l := range labels {
		if l == "s3" || strings.HasPrefix(l, "s3-") {
			rest := labels[i+1:]
			if len(rest) > 0 && rest[0] == "dualstack" {
				rest = rest[1:]
			}
			switch {
			case len(rest) > 0:
				return "s3", rest[0]
			case strings.HasPrefix(l, "s3-") && l != "s3-external-1":
				return "s3", strings.TrimPrefix(l, "s3-")
			}
			return "s3", "us-east-1"
		}
	}
	switch len(labels) {
	case 1:
		return labels[0], "us-east-1"
	default:
		return labels[0], labels[1]
	}
}

// describeS3 fills in the operation, bucket and key of an S3 request, and the object a copy
// reads.
func describeS3(req *http.Request, host string, m *Meaning) error {
	path := req.URL.Path
	// Virtual-hosted style: the bucket is the host's labels before ".s3." or ".s3-".
	for _, sep := range []string{".s3.", ".s3-"} {
		if i := strings.Index(host, sep); i > 0 {
			m.Bucket = host[:i]
			break
		}
	}
	rest := strings.TrimPrefix(path, "/")
	if m.Bucket == "" {
		m.Bucket, rest, _ = strings.Cut(rest, "/")
	}
	m.Key = rest
	// The query as the signer reads it, and as AWS does: '&'-separated, ';' and '+' literal.
	q, _ := parseQuery(req.URL.RawQuery)
	has := func(k string) bool { return slices.ContainsFunc(q, func(p param) bool { return p.k == k }) }
	copying := false
	if vs := req.Header.Values("X-Amz-Copy-Source"); len(vs) > 0 {
		if len(vs) > 1 {
			return &AmbiguousError{Header: "X-Amz-Copy-Source", Reason: "appears more than once"}
		}
		src, err := ParseCopySource(vs[0])
		if err != nil {
			return err
		}
		m.CopySource, copying = src, true
	}
	m.Operation = s3Operation(req.Method, m.Bucket, m.Key, has, copying)
	return nil
}

// ParseCopySource reads an x-amz-copy-source value as S3 does: percent-decoded once, then an
// optional leading '/', the bucket up to the next '/' and the key after it; an unencoded
// "?versionId=" ends the object (a '?' in a key is sent escaped). An access point's object is
// "arn:...:accesspoint/NAME/object/KEY": its bucket is the access point's ARN.
//
// A value that could name another object than the one read here is refused (*AmbiguousError):
// one whose decoding leaves escapes (encoded twice: a server that decodes again reads another
// key), an empty bucket ("/%2Fbucket/key"), an empty key, a key with "." or ".." segments, a
// bucket with characters no bucket name has, a raw ',' (two values joined) or '+' (a space to
// some decoders), a '?' or '#' that does not start the version, an invalid escape, or what is
// not UTF-8 once decoded.
func ParseCopySource(v string) (*Object, error) {
	bad := func(why string) error { return &AmbiguousError{Header: "X-Amz-Copy-Source", Reason: why} }
	raw, version, versioned := strings.Cut(v, "?versionId=") // before decoding: a key may hold an escaped '?'
	switch {
	case strings.ContainsAny(raw, "?#"):
		return nil, bad("has a '?' or '#' that does not start ?versionId=; escape it in the key")
	case strings.ContainsRune(raw, ','):
		return nil, bad("has an unescaped ','; escape it in the key as %2C")
	case strings.ContainsRune(raw, '+'):
		// A '+' is a space to a form decoder and itself to a path decoder.
		return nil, bad("has an unescaped '+'; escape it in the key as %2B")
	case versioned && !validVersion(version):
		return nil, bad("has a versionId that is not one version id")
	}
	src, err := url.PathUnescape(raw)
	if err != nil {
		return nil, bad("is not valid percent-encoding")
	}
	if hasEscape(src) {
		return nil, bad("is percent-encoded twice; encode the bucket and key once")
	}
	if !utf8.ValidString(src) {
		return nil, bad("is not UTF-8 once decoded")
	}
	src = strings.TrimPrefix(src, "/")
	var o Object
	if strings.HasPrefix(src, "arn:") {
		i := strings.Index(src, "/object/")
		if i < 0 {
			return nil, bad("is an ARN without /object/")
		}
		o.Bucket, o.Key = src[:i], src[i+len("/object/"):]
	} else {
		o.Bucket, o.Key, _ = strings.Cut(src, "/")
		if !validBucket(o.Bucket) {
			return nil, bad("does not start with a bucket name (after an optional '/')")
		}
	}
	if o.Key == "" {
		return nil, bad("names no object key")
	}
	for seg := range strings.SplitSeq(o.Key, "/") {
		if seg == "." || seg == ".." {
			return nil, bad("has a '.' or '..' segment in its key, which servers resolve differently")
		}
	}
	o.VersionID = version
	return &o, nil
}

// validBucket reports whether b can be a bucket name: 3 to 255 letters, digits, '.', '-' and
// '_' (the legacy rules of us-east-1; today's are narrower).
func validBucket(b string) bool {
	if len(b) < 3 || len(b) > 255 {
		return false
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// validVersion reports whether v can be an S3 version id ("null", or letters, digits and
// ._+/=-), sent as it is.
func validVersion(v string) bool {
	if v == "" || len(v) > 1024 {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._+/=-", c) >= 0) {
			return false
		}
	}
	return true
}

// hasEscape reports whether s holds a percent-escape (%XX with hex digits).
func hasEscape(s string) bool {
	for i := strings.IndexByte(s, '%'); i >= 0 && i+2 < len(s); {
		if ishex(s[i+1]) && ishex(s[i+2]) {
			return true
		}
		j := strings.IndexByte(s[i+1:], '%')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return false
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// bucketSub are the bucket sub-resources, by the name their operations use.
var bucketSub = []struct{ q, name string }{
	{"policy", "BucketPolicy"}, {"acl", "BucketAcl"}, {"tagging", "BucketTagging"},
	{"versioning", "BucketVersioning"}, {"lifecycle", "BucketLifecycleConfiguration"},
	{"cors", "BucketCors"}, {"encryption", "BucketEncryption"},
	{"notification", "BucketNotificationConfiguration"}, {"website", "BucketWebsite"},
	{"logging", "BucketLogging"}, {"replication", "BucketReplication"},
	{"object-lock", "ObjectLockConfiguration"}, {"publicAccessBlock", "PublicAccessBlock"},
	{"ownershipControls", "BucketOwnershipControls"}, {"accelerate", "BucketAccelerateConfiguration"},
	{"requestPayment", "BucketRequestPayment"}, {"policyStatus", "BucketPolicyStatus"},
	{"location", "BucketLocation"}, {"intelligent-tiering", "BucketIntelligentTieringConfiguration"},
	{"inventory", "BucketInventoryConfiguration"}, {"metrics", "BucketMetricsConfiguration"},
	{"analytics", "BucketAnalyticsConfiguration"},
}

// objectSub are the object sub-resources.
var objectSub = []struct{ q, name string }{
	{"acl", "ObjectAcl"}, {"tagging", "ObjectTagging"}, {"retention", "ObjectRetention"},
	{"legal-hold", "ObjectLegalHold"}, {"attributes", "ObjectAttributes"}, {"torrent", "ObjectTorrent"},
}

func s3Operation(method, bucket, key string, has func(string) bool, copying bool) string {
	verb := map[string]string{http.MethodGet: "Get", http.MethodPut: "Put", http.MethodDelete: "Delete"}[method]
	switch {
	case bucket == "":
		if method == http.MethodGet {
			return "ListBuckets"
		}
		return ""
	case key == "":
		for _, sub := range bucketSub {
			if has(sub.q) && verb != "" {
				if sub.q == "lifecycle" && method == http.MethodDelete {
					return "DeleteBucketLifecycle"
				}
				return verb + sub.name
			}
		}
		switch method {
		case http.MethodGet:
			switch {
			case has("list-type"):
				return "ListObjectsV2"
			case has("uploads"):
				return "ListMultipartUploads"
			case has("versions"):
				return "ListObjectVersions"
			}
			return "ListObjects"
		case http.MethodHead:
			return "HeadBucket"
		case http.MethodPut:
			return "CreateBucket"
		case http.MethodDelete:
			return "DeleteBucket"
		case http.MethodPost:
			if has("delete") {
				return "DeleteObjects"
			}
		}
		return ""
	}
	multipart := has("uploadId")
	switch method {
	case http.MethodGet:
		if multipart {
			return "ListParts"
		}
	case http.MethodHead:
		return "HeadObject"
	case http.MethodPut:
		switch {
		case multipart && copying:
			return "UploadPartCopy"
		case multipart:
			return "UploadPart"
		}
	case http.MethodPost:
		switch {
		case has("uploads"):
			return "CreateMultipartUpload"
		case multipart:
			return "CompleteMultipartUpload"
		case has("restore"):
			return "RestoreObject"
		case has("select"):
			return "SelectObjectContent"
		}
		return ""
	case http.MethodDelete:
		if multipart {
			return "AbortMultipartUpload"
		}
	}
	for _, sub := range objectSub {
		if has(sub.q) && verb != "" {
			return verb + sub.name
		}
	}
	switch method {
	case http.MethodGet:
		return "GetObject"
	case http.MethodPut:
		if copying {
			return "CopyObject"
		}
		return "PutObject"
	case http.MethodDelete:
		return "DeleteObject"
	}
	return ""
}

// action is the query protocol's Action (IAM, STS, EC2, SQS, ...): from the query, or from a
// form body of at most 64 KiB, which is put back to be sent. An Action given twice, or in both
// the query and the body, is ambiguous: servers differ on which they act on.
func action(req *http.Request) (string, error) {
	twice := &AmbiguousError{Reason: "is given more than once (query and form body count together)"}
	q, _ := parseQuery(req.URL.RawQuery)
	var act []string
	for _, p := range q {
		if p.k == "Action" {
			act = append(act, p.v)
		}
	}
	ct, _, _ := mime.ParseMediaType(req.Header.Get("Content-Type"))
	if ct != "application/x-www-form-urlencoded" || req.Body == nil || req.Body == http.NoBody ||
		req.ContentLength < 0 || req.ContentLength > maxFormBody {
		if len(act) > 1 {
			return "", twice
		}
		return first(act), nil
	}
	b, err := io.ReadAll(io.LimitReader(req.Body, maxFormBody+1))
	rest := req.Body
	req.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(b), rest), rest}
	if err != nil || len(b) > maxFormBody {
		return first(act), nil
	}
	if req.GetBody == nil && int64(len(b)) == req.ContentLength {
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	}
	if v, err := url.ParseQuery(string(b)); err == nil {
		act = append(act, v["Action"]...)
	}
	if len(act) > 1 {
		return "", twice
	}
	return first(act), nil
}

func first(l []string) string {
	if len(l) == 0 {
		return ""
	}
	return l[0]
}
