package policy

import (
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
)

// TestAWSInput: input.aws is in the document when set, absent when not, and find (the
// decision cache's lookups) agrees with the document.
func TestAWSInput(t *testing.T) {
	withAWS := &Input{Phase: PhaseRequest, Method: "PUT", Scheme: "https", Host: "s3.amazonaws.com", Port: 443, Path: "/b/k",
		AWS: map[string]any{"service": "s3", "region": "us-east-1", "operation": "CopyObject", "bucket": "b", "key": "k",
			"copy_source": map[string]any{"bucket": "src", "key": "a"}}}
	without := &Input{Phase: PhaseRequest, Method: "GET", Scheme: "https", Host: "h", Port: 443, Path: "/"}
	for _, in := range []*Input{withAWS, without} {
		doc, err := in.astValue()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"input.aws", "input.aws.operation", "input.aws.copy_source.bucket", "input.aws.none", "input.aws.key.x"} {
			checkFind(t, in, doc, ast.MustParseRef(p))
		}
	}
	if v := withAWS.value()["aws"].(map[string]any); v["operation"] != "CopyObject" {
		t.Errorf("value: %v", v)
	}
	if _, ok := without.value()["aws"]; ok {
		t.Error("input.aws present for a request that has none")
	}
}
