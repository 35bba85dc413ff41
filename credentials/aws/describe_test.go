package aws

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestDescribe(t *testing.T) {
	scope := func(region, service string) string {
		return "AWS4-HMAC-SHA256 Credential=" + fakeID + "/20261204/" + region + "/" + service + "/aws4_request, SignedHeaders=host, Signature=" + strings.Repeat("0", 64)
	}
	cases := map[string]struct {
		method, url, body string
		headers           map[string]string
		want              Meaning
	}{
		"list buckets":   {method: "GET", url: "https://s3.amazonaws.com/", want: Meaning{Service: "s3", Region: "us-east-1", Operation: "ListBuckets"}},
		"list v2 vhost":  {method: "GET", url: "https://data.s3.eu-west-1.amazonaws.com/?list-type=2&prefix=x", want: Meaning{Service: "s3", Region: "eu-west-1", Operation: "ListObjectsV2", Bucket: "data"}},
		"dotted bucket":  {method: "GET", url: "https://my.data.s3.dualstack.eu-west-1.amazonaws.com/a/b", want: Meaning{Service: "s3", Region: "eu-west-1", Operation: "GetObject", Bucket: "my.data", Key: "a/b"}},
		"get path style": {method: "GET", url: "https://localhost:9000/data/dir/a%20b.txt", headers: map[string]string{"Authorization": scope("us-east-1", "s3")}, want: Meaning{Service: "s3", Region: "us-east-1", Operation: "GetObject", Bucket: "data", Key: "dir/a b.txt"}},
		"put":            {method: "PUT", url: "https://s3.us-east-1.amazonaws.com/data/out/x", want: Meaning{Service: "s3", Region: "us-east-1", Operation: "PutObject", Bucket: "data", Key: "out/x"}},
		"create mpu":     {method: "POST", url: "https://s3.us-east-1.amazonaws.com/data/out/x?uploads", want: Meaning{Service: "s3", Region: "us-east-1", Operation: "CreateMultipartUpload", Bucket: "data", Key: "out/x"}},
		"upload part":    {method: "PUT", url: "https://s3.us-east-1.amazonaws.com/data/out/x?partNumber=2&uploadId=abc", want: Meaning{Service: "s3", Region: "us-east-1", Operation: "UploadPart", Bucket: "data", Key: "out/x"}},
		"complete mpu":   {method: "POST", url: "https://s3.us-east-1.amazonaws.com/data/out/x?uploadId=abc", want: Meaning{Service: "s3", Region: "us-east-1", Operation: "CompleteMultipartUpload", Bucket: "data", Key: "out/x"}},
		"abort mpu":      {method: "DELETE", url: "https://s3.us-east-1.amazonaws.com/data/out/x?uploadId=abc", want: Meaning{Service: "s3", Region: "us-east-1", Operation: "AbortMultipartUpload", Bucket: "data", Key: "out/x"}},
		"delete":         {method: "DELETE", url: "https://s3.us-east-1.amazonaws.com/data/out/x", want: Meaning{Service: "s3", Region: "us-east-1", Operation: "DeleteObject", Bucket: "data", Key: "out/x"}},
		"delete many":    {method: "POST", url: "https://s3.us-east-1.amazonaws.com/data?delete", want: Meaning{Service: "s3", Region: "us-east-1", Operation: "DeleteObjects", Bucket: "data"}},
		"bucket policy":  {method: "PUT", url: "https://s3.us-east-1.amazonaws.com/data?policy", want: Meaning{Service: "s3", Region: "us-east-1", Operation: "PutBucketPolicy", Bucket: "data"}},
		"head":           {method: "HEAD", url: "https://s3.us-east-1.amazonaws.com/data/k", want: Meaning{Service: "s3", Region: "us-east-1", Operation: "HeadObject", Bucket: "data", Key: "k"}},
		"copy": {method: "PUT", url: "https://s3.us-east-1.amazonaws.com/data/out/x", headers: map[string]string{"X-Amz-Copy-Source": "/secret-bucket/k%201?versionId=3"},
			want: Meaning{Service: "s3", Region: "us-east-1", Operation: "CopyObject", Bucket: "data", Key: "out/x", CopySource: &Object{Bucket: "secret-bucket", Key: "k 1", VersionID: "3"}}},
		"copy, escaped question mark": {method: "PUT", url: "https://s3.us-east-1.amazonaws.com/data/out/x", headers: map[string]string{"X-Amz-Copy-Source": "src/a%3FversionId%3D1/b"},
			want: Meaning{Service: "s3", Region: "us-east-1", Operation: "CopyObject", Bucket: "data", Key: "out/x", CopySource: &Object{Bucket: "src", Key: "a?versionId=1/b"}}},
		"copy, encoded slashes": {method: "PUT", url: "https://s3.us-east-1.amazonaws.com/data/out/x", headers: map[string]string{"X-Amz-Copy-Source": "%2Fother-bucket%2Fsecret.txt"},
			want: Meaning{Service: "s3", Region: "us-east-1", Operation: "CopyObject", Bucket: "data", Key: "out/x", CopySource: &Object{Bucket: "other-bucket", Key: "secret.txt"}}},
		"copy, no leading slash": {method: "PUT", url: "https://s3.us-east-1.amazonaws.com/data/out/x", headers: map[string]string{"X-Amz-Copy-Source": "src/dir/a%2Bb.txt"},
			want: Meaning{Service: "s3", Region: "us-east-1", Operation: "CopyObject", Bucket: "data", Key: "out/x", CopySource: &Object{Bucket: "src", Key: "dir/a+b.txt"}}},
		"copy, access point": {method: "PUT", url: "https://s3.us-east-1.amazonaws.com/data/out/x", headers: map[string]string{"X-Amz-Copy-Source": "arn%3Aaws%3As3%3Aus-east-1%3A123456789012%3Aaccesspoint%2Fap%2Fobject%2Fk%2F1"},
			want: Meaning{Service: "s3", Region: "us-east-1", Operation: "CopyObject", Bucket: "data", Key: "out/x", CopySource: &Object{Bucket: "arn:aws:s3:us-east-1:123456789012:accesspoint/ap", Key: "k/1"}}},
		"upload part copy": {method: "PUT", url: "https://s3.us-east-1.amazonaws.com/data/out/x?partNumber=1&uploadId=u", headers: map[string]string{"X-Amz-Copy-Source": "/src/k?versionId=3/L4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY+MTRCxf3vjVBH40Nr8X8gdRQBpUMLUo"},
			want: Meaning{Service: "s3", Region: "us-east-1", Operation: "UploadPartCopy", Bucket: "data", Key: "out/x", CopySource: &Object{Bucket: "src", Key: "k", VersionID: "3/L4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY+MTRCxf3vjVBH40Nr8X8gdRQBpUMLUo"}}},
		"iam query":   {method: "GET", url: "https://iam.amazonaws.com/?Action=CreateUser&UserName=x", want: Meaning{Service: "iam", Region: "us-east-1", Operation: "CreateUser"}},
		"sts form":    {method: "POST", url: "https://sts.eu-west-1.amazonaws.com/", body: "Action=AssumeRole&RoleArn=x", headers: map[string]string{"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}, want: Meaning{Service: "sts", Region: "eu-west-1", Operation: "AssumeRole"}},
		"json target": {method: "POST", url: "https://dynamodb.eu-west-1.amazonaws.com/", body: "{}", headers: map[string]string{"X-Amz-Target": "DynamoDB_20120810.DeleteTable"}, want: Meaning{Service: "dynamodb", Region: "eu-west-1", Operation: "DeleteTable"}},
		"scope wins":  {method: "GET", url: "https://localhost/?Action=ListUsers", headers: map[string]string{"Authorization": scope("us-east-1", "iam")}, want: Meaning{Service: "iam", Region: "us-east-1", Operation: "ListUsers"}},
		"presign":     {method: "GET", url: "https://localhost/data/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=" + fakeID + "%2F20261204%2Feu-west-1%2Fs3%2Faws4_request&X-Amz-Date=20261204T000000Z&X-Amz-Expires=60&X-Amz-SignedHeaders=host&X-Amz-Signature=00", want: Meaning{Service: "s3", Region: "eu-west-1", Operation: "GetObject", Bucket: "data", Key: "k"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
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
			m, ok, err := (*Signer)(nil).Describe(req)
			if !ok || err != nil {
				t.Fatalf("not described: %v", err)
			}
			if m.CopySource != nil && c.want.CopySource != nil && *m.CopySource == *c.want.CopySource {
				m.CopySource = c.want.CopySource
			}
			if m != c.want {
				t.Fatalf("got %+v, want %+v", m, c.want)
			}
			if c.body != "" {
				b, _ := io.ReadAll(req.Body)
				if string(b) != c.body {
					t.Fatalf("body not put back: %q", b)
				}
			}
		})
	}
	if _, ok, _ := (*Signer)(nil).Describe(httptestRequest("https://example.com/x")); ok {
		t.Error("a non-AWS request was described")
	}
	s := newTestSigner(t, false, Options{Service: "execute-api", Region: "eu-west-3"})
	if m, _, _ := s.Describe(httptestRequest("https://api.example.com/x")); m.Service != "execute-api" || m.Region != "eu-west-3" {
		t.Errorf("overrides: %+v", m)
	}
}

// TestDescribeRefusesAmbiguous: what AWS could read as another object or operation than the
// policy would see is refused, naming the header, not described by a guess.
func TestDescribeRefusesAmbiguous(t *testing.T) {
	cases := map[string]struct {
		url     string
		headers [][2]string
		body    string
		want    string // in the error
	}{
		"copy source twice":           {headers: [][2]string{{"X-Amz-Copy-Source", "/src/a"}, {"X-Amz-Copy-Source", "/secret/b"}}, want: "X-Amz-Copy-Source"},
		"encoded slash, empty bucket": {headers: [][2]string{{"X-Amz-Copy-Source", "/%2Fsecret/b"}}, want: "bucket"},
		"double slash":                {headers: [][2]string{{"X-Amz-Copy-Source", "//secret/b"}}, want: "bucket"},
		"double encoded":              {headers: [][2]string{{"X-Amz-Copy-Source", "/src%252F..%252Fsecret/b"}}, want: "twice"},
		"double encoded key":          {headers: [][2]string{{"X-Amz-Copy-Source", "/src/a%2541"}}, want: "twice"},
		"bad escape":                  {headers: [][2]string{{"X-Amz-Copy-Source", "/src/a%zz"}}, want: "percent-encoding"},
		"comma joined":                {headers: [][2]string{{"X-Amz-Copy-Source", "/src/a, /secret/b"}}, want: "','"},
		"no key":                      {headers: [][2]string{{"X-Amz-Copy-Source", "/src/"}}, want: "key"},
		"bucket only":                 {headers: [][2]string{{"X-Amz-Copy-Source", "src"}}, want: "key"},
		"dot dot key":                 {headers: [][2]string{{"X-Amz-Copy-Source", "/src/a/../../secret/b"}}, want: "'..'"},
		"encoded dot dot key":         {headers: [][2]string{{"X-Amz-Copy-Source", "/src/a%2F%2E%2E%2Fb"}}, want: "'..'"},
		"stray question mark":         {headers: [][2]string{{"X-Amz-Copy-Source", "/src/a?x=1"}}, want: "'?'"},
		"two versions":                {headers: [][2]string{{"X-Amz-Copy-Source", "/src/a?versionId=1?versionId=2"}}, want: "versionId"},
		"version with ampersand":      {headers: [][2]string{{"X-Amz-Copy-Source", "/src/a?versionId=1&x=2"}}, want: "versionId"},
		"raw plus":                    {headers: [][2]string{{"X-Amz-Copy-Source", "/src/a+b"}}, want: "'+'"},
		"not utf-8":                   {headers: [][2]string{{"X-Amz-Copy-Source", "/src/a%FF"}}, want: "UTF-8"},
		"bucket with space":           {headers: [][2]string{{"X-Amz-Copy-Source", "/o%20k/a"}}, want: "bucket"},
		"arn without object":          {headers: [][2]string{{"X-Amz-Copy-Source", "arn:aws:s3:us-east-1:1:accesspoint/ap"}}, want: "ARN"},
		"target list":                 {url: "https://dynamodb.eu-west-1.amazonaws.com/", headers: [][2]string{{"X-Amz-Target", "DynamoDB_20120810.GetItem, DynamoDB_20120810.DeleteTable"}}, want: "X-Amz-Target"},
		"copy source in the query":    {url: "https://s3.us-east-1.amazonaws.com/data/out/x?x-amz-copy-source=%2Fsecret%2Fk", want: "X-Amz-Copy-Source"},
		"acl in query and header":     {url: "https://s3.us-east-1.amazonaws.com/data/out/x?x-amz-acl=public-read", headers: [][2]string{{"X-Amz-Acl", "private"}}, want: "X-Amz-Acl"},
		"acl twice in the query":      {url: "https://s3.us-east-1.amazonaws.com/data/out/x?X-Amz-Acl=private&x-amz-acl=public-read", want: "X-Amz-Acl"},
		"action twice":                {url: "https://iam.amazonaws.com/?Action=ListUsers&Action=CreateUser", want: "Action"},
		"action query and body": {url: "https://iam.amazonaws.com/?Action=ListUsers", body: "Action=CreateUser&UserName=x",
			headers: [][2]string{{"Content-Type", "application/x-www-form-urlencoded"}}, want: "Action"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			u := c.url
			if u == "" {
				u = "https://s3.us-east-1.amazonaws.com/data/out/x"
			}
			var body io.Reader
			if c.body != "" {
				body = strings.NewReader(c.body)
			}
			req, _ := http.NewRequest("PUT", u, body)
			for _, h := range c.headers {
				req.Header.Add(h[0], h[1])
			}
			_, _, err := (*Signer)(nil).Describe(req)
			ae, ok := err.(*AmbiguousError)
			if !ok || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want an *AmbiguousError with %q", err, c.want)
			}
			for _, h := range c.headers {
				if strings.Contains(ae.Reason, h[1]) {
					t.Errorf("the reason quotes the value: %q", ae.Reason)
				}
			}
		})
	}
}

func httptestRequest(u string) *http.Request {
	req, _ := http.NewRequest("GET", u, nil)
	return req
}

// FuzzParseCopySource: whatever the value, a copy source read is one object with a bucket and
// a key, none of whose segments is '.' or '..', and nothing is left to decode.
func FuzzParseCopySource(f *testing.F) {
	for _, s := range []string{"/src/k", "%2Fsrc%2Fk", "src/a%3Fb?versionId=1", "arn:aws:s3:r:1:accesspoint/a/object/k", "/%2Fsrc/k", "src/a%2541"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		o, err := ParseCopySource(v)
		if err != nil {
			if _, ok := err.(*AmbiguousError); !ok {
				t.Fatalf("error %T", err)
			}
			return
		}
		if o.Bucket == "" || o.Key == "" || hasEscape(o.Bucket+o.Key) {
			t.Fatalf("%q read as %+v", v, o)
		}
		for seg := range strings.SplitSeq(o.Key, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("%q read with a dot segment: %+v", v, o)
			}
		}
	})
}
