package aws_test

import data.aws

req(m) := {"phase": "request", "agent": {"id": "a", "labels": {}}, "request": {"method": "GET", "scheme": "https", "host": "s3.eu-west-1.amazonaws.com", "port": 443, "path": "/"}, "aws": m}

s3(op, bucket, key) := req({"service": "s3", "region": "eu-west-1", "operation": op, "bucket": bucket, "key": key})

settings := {
	"credential": "aws",
	"hosts": {"s3.eu-west-1.amazonaws.com": true, "*.s3.eu-west-1.amazonaws.com": true, "iam.amazonaws.com": true, "off.amazonaws.com": false},
	"list_buckets": true,
	"read": ["data"],
	"write": ["data/out/", "scratch/"],
}

cases := {
	"list buckets": {"input": s3("ListBuckets", "", ""), "allow": true},
	"list the readable bucket": {"input": s3("ListObjectsV2", "data", ""), "allow": true},
	"get from the readable bucket": {"input": s3("GetObject", "data", "reports/a.csv"), "allow": true},
	"head in the readable bucket": {"input": s3("HeadObject", "data", "x"), "allow": true},
	"get from another bucket": {"input": s3("GetObject", "secrets", "k"), "allow": false, "reason": "S3 GetObject of secrets/k is not allowed: agents may read data and write under data/out/, scratch/"},
	"put under the prefix": {"input": s3("PutObject", "data", "out/run-1/result.json"), "allow": true},
	"multipart under the prefix": {"input": s3("CreateMultipartUpload", "data", "out/big"), "allow": true},
	"upload part under the prefix": {"input": s3("UploadPart", "data", "out/big"), "allow": true},
	"complete under the prefix": {"input": s3("CompleteMultipartUpload", "data", "out/big"), "allow": true},
	"put a whole writable bucket": {"input": s3("PutObject", "scratch", "anything"), "allow": true},
	"put outside the prefix": {"input": s3("PutObject", "data", "reports/a.csv"), "allow": false, "reason": "S3 PutObject of data/reports/a.csv is not allowed: agents may read data and write under data/out/, scratch/"},
	"prefix is not a bucket prefix": {"input": s3("PutObject", "data-other", "out/x"), "allow": false},
	"prefix needs its slash": {"input": s3("PutObject", "data", "outside"), "allow": false},
	"delete is not writing": {"input": s3("DeleteObject", "data", "out/x"), "allow": false},
	"delete many": {"input": s3("DeleteObjects", "data", ""), "allow": false},
	"bucket policy": {"input": s3("PutBucketPolicy", "data", ""), "allow": false},
	"copy from a readable bucket": {"input": req({"service": "s3", "region": "eu-west-1", "operation": "CopyObject", "bucket": "data", "key": "out/c", "copy_source": {"bucket": "data", "key": "a"}}), "allow": true},
	"copy from an unreadable bucket": {"input": req({"service": "s3", "region": "eu-west-1", "operation": "CopyObject", "bucket": "data", "key": "out/c", "copy_source": {"bucket": "secrets", "key": "a"}}), "allow": false, "reason": "S3 CopyObject of data/out/c is not allowed: the copy source secrets is not readable"},
	"IAM": {"input": req({"service": "iam", "region": "us-east-1", "operation": "ListUsers", "bucket": "", "key": ""}), "allow": false, "reason": "AWS iam is never allowed for agents (ListUsers)"},
	"STS": {"input": req({"service": "sts", "region": "us-east-1", "operation": "AssumeRole", "bucket": "", "key": ""}), "allow": false, "reason": "AWS sts is never allowed for agents (AssumeRole)"},
	"another service": {"input": req({"service": "dynamodb", "region": "eu-west-1", "operation": "DeleteTable", "bucket": "", "key": ""}), "allow": false, "reason": "AWS dynamodb is not allowed for agents: only S3"},
	"no input.aws": {"input": object.remove(s3("GetObject", "data", "k"), ["aws"]), "allow": false},
	"service unknown": {"input": req({"service": "", "region": "", "operation": "", "bucket": "", "key": ""}), "allow": false, "reason": "the broker cannot tell which AWS service this request is for: sign it with SigV4 (placeholder keys will do), or set aws_sigv4.service"},
}

test_decisions[name] if {
	some name, c in cases
	d := aws.decision with input as c.input with data.settings.aws as settings
	d.allow == c.allow
	object.get(d, "credentials", []) == expected_credentials(c.allow)
	object.get(c, "reason", d.reason) == d.reason
}

expected_credentials(true) := ["aws"]

expected_credentials(false) := []

test_governs if {
	aws.governs("my-bucket.s3.eu-west-1.amazonaws.com") with data.settings.aws as settings
	aws.governs("iam.amazonaws.com") with data.settings.aws as settings
	not aws.governs("s3.amazonaws.com.evil.example") with data.settings.aws as settings
	not aws.governs("x.s3.us-east-1.amazonaws.com") with data.settings.aws as settings
	aws.governs("a.b.s3.eu-west-1.amazonaws.com") with data.settings.aws as settings
	not aws.governs("off.amazonaws.com") with data.settings.aws as settings
}

# The lookup by key decides as the scan of a list of hosts and "*.suffix" patterns did.
scanned(host, hosts) if host in hosts

else if {
	some p in hosts
	startswith(p, "*.")
	endswith(host, substring(p, 1, -1))
} else := false

looked_up(host, hosts) if {
	aws.governs(host) with data.settings.aws.hosts as {p: true | some p in hosts}
} else := false

test_governs_as_a_scan_did[host] if {
	patterns := ["s3.amazonaws.com", "*.s3.amazonaws.com", "*.", "*..x", "*.com", "iam.amazonaws.com"]
	some host in [
		"s3.amazonaws.com", "b.s3.amazonaws.com", "a.b.s3.amazonaws.com", ".s3.amazonaws.com", "x..s3.amazonaws.com",
		"amazonaws.com", "s3.amazonaws.com.evil", "evils3.amazonaws.com", "x.", "x", "", ".", "a..x", "..x", "e.com", "com",
		"iam.amazonaws.com", "x.iam.amazonaws.com",
	]
	looked_up(host, patterns) == scanned(host, patterns)
}

test_shipped_settings if {
	d := aws.decision with input as s3("PutObject", "example-data", "agent-output/x")
	d.allow
	d.credentials == ["aws"]
}

# A data.yaml from an earlier release lists the hosts, "*.suffix" patterns among them.
test_list_form_of_earlier_releases if {
	aws.governs("s3.us-east-1.amazonaws.com") with data.settings.aws.hosts as ["*.amazonaws.com"]
	aws.governs("localhost") with data.settings.aws.hosts as ["localhost"]
	not aws.governs("amazonaws.com.evil.example") with data.settings.aws.hosts as ["*.amazonaws.com"]
}
