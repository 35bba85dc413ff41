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
			want: Meaning{Service: "s3", Region: "us-east-1", Operation: "CopyObject", Bucket: "data", Key: "out/x", CopySource: &Object{Bucket: "secret-bucket", Key: "k 1"}}},
		"copy, escaped question mark": {method: "PUT", url: "https://s3.us-east-1.amazonaws.com/data/out/x", headers: map[string]string{"X-Amz-Copy-Source": "src/a%3FversionId%3D1/b"},
			want: Meaning{Service: "s3", Region: "us-east-1", Operation: "CopyObject", Bucket: "data", Key: "out/x", CopySource: &Object{Bucket: "src", Key: "a?versionId=1/b"}}},
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
			m, ok := (*Signer)(nil).Describe(req)
			if !ok {
				t.Fatal("not described")
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
	if _, ok := (*Signer)(nil).Describe(httptestRequest("https://example.com/x")); ok {
		t.Error("a non-AWS request was described")
	}
	s := newTestSigner(t, false, Options{Service: "execute-api", Region: "eu-west-3"})
	if m, _ := s.Describe(httptestRequest("https://api.example.com/x")); m.Service != "execute-api" || m.Region != "eu-west-3" {
		t.Errorf("overrides: %+v", m)
	}
}

func httptestRequest(u string) *http.Request {
	req, _ := http.NewRequest("GET", u, nil)
	return req
}
