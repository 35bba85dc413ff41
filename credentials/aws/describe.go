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
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
}

// maxFormBody is the largest form body read for the query protocol's Action.
const maxFormBody = 64 << 10

// Describe says what req does, as AWS will see it once signed: service and region (the
// Signer's overrides, else the agent's credential scope, else the endpoint's name), the
// operation where it can be known (S3's REST method, path and sub-resources; X-Amz-Target;
// the query protocol's Action, in the query or a small form body), and S3's bucket and key
// (virtual-hosted and path style). ok is false when neither the signature nor the host
// names a service.
func (s *Signer) Describe(req *http.Request) (m Meaning, ok bool) {
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
		return Meaning{}, false
	}
	if m.Service == "s3" {
		describeS3(req, host, &m)
		return m, true
	}
	if t := req.Header.Get("X-Amz-Target"); t != "" {
		m.Operation = t[strings.LastIndexByte(t, '.')+1:]
		return m, true
	}
	m.Operation = action(req)
	return m, true
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

// describeS3 fills in the operation, bucket and key of an S3 request.
func describeS3(req *http.Request, host string, m *Meaning) {
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
	copySrc := req.Header.Get("X-Amz-Copy-Source")
	if copySrc != "" {
		raw, _, _ := strings.Cut(copySrc, "?versionId=") // before decoding: a key may hold an escaped '?'
		if src, err := url.PathUnescape(strings.TrimPrefix(raw, "/")); err == nil {
			b, k, _ := strings.Cut(src, "/")
			m.CopySource = &Object{Bucket: b, Key: k}
		}
	}
	m.Operation = s3Operation(req.Method, m.Bucket, m.Key, has, copySrc != "")
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
// form body of at most 64 KiB, which is put back to be sent.
func action(req *http.Request) string {
	q, _ := parseQuery(req.URL.RawQuery)
	for _, p := range q {
		if p.k == "Action" {
			return p.v
		}
	}
	ct, _, _ := mime.ParseMediaType(req.Header.Get("Content-Type"))
	if ct != "application/x-www-form-urlencoded" || req.Body == nil || req.Body == http.NoBody ||
		req.ContentLength < 0 || req.ContentLength > maxFormBody {
		return ""
	}
	b, err := io.ReadAll(io.LimitReader(req.Body, maxFormBody+1))
	rest := req.Body
	req.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(b), rest), rest}
	if err != nil || len(b) > maxFormBody {
		return ""
	}
	if req.GetBody == nil && int64(len(b)) == req.ContentLength {
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
	}
	v, err := url.ParseQuery(string(b))
	if err != nil {
		return ""
	}
	return v.Get("Action")
}
