# AWS, with the broker's aws_sigv4 credential, narrowed to what each request does.
#
# The broker re-signs AWS requests with the real key (docs/aws.md) and tells the policy what a
# request will do once signed, as input.aws: service, region, operation, and for S3 bucket,
# key and the copy_source of a copy. data.settings.aws (policies/data.yaml) lists the hosts,
# the credential, the buckets agents may read and the bucket prefixes they may write. The
# identity and account services (IAM, STS, Organizations, SSO) are never allowed, nor any
# service but S3; on S3 only the operations listed below.
package aws

import data.settings

hosts := {h | settings.aws.hosts[h] == true} if is_object(settings.aws.hosts)

else := {h | some h in settings.aws.hosts} # the list form of earlier releases (below)

# governs(host): the host is a key of settings.aws.hosts (host: true), or a name under a
# "*.suffix" key. Each is a lookup by key, one per label of the host, never a scan of the
# list: a.b.example.com looks up a.b.example.com, *.b.example.com, *.example.com and *.com.
governs(host) if settings.aws.hosts[host] == true

governs(host) if {
	labels := split(host, ".")
	some i, _ in labels
	i > 0
	settings.aws.hosts[concat(".", array.concat(["*"], array.slice(labels, i, count(labels))))] == true
}

# The list form of earlier releases (a YAML list of hosts) is still read, by scanning it:
# `broker check-config` warns when such a list is long. Write host: true for new files.
governs(host) if {
	is_array(settings.aws.hosts)
	host in settings.aws.hosts
}

governs(host) if {
	is_array(settings.aws.hosts)
	some p in settings.aws.hosts
	startswith(p, "*.")
	endswith(host, substring(p, 1, -1))
}

never := {"iam", "sts", "organizations", "sso", "sso-oauth", "identitystore", "account"}

read_ops := {"GetObject", "HeadObject", "GetObjectTagging", "GetObjectAttributes", "ListObjectsV2", "ListObjects", "HeadBucket", "GetBucketLocation"}

write_ops := {"PutObject", "CreateMultipartUpload", "UploadPart", "UploadPartCopy", "CompleteMultipartUpload", "AbortMultipartUpload", "ListParts", "CopyObject"}

op := input.aws.operation

bucket := input.aws.bucket

key := input.aws.key

# readable(b): agents may read bucket b.
readable(b) if b in settings.aws.read

# writable(b, k): agents may write key k of bucket b: it is under a "bucket/prefix" of
# settings.aws.write.
writable(b, k) if {
	some w in settings.aws.write
	[wb, prefix] := split_bucket(w)
	wb == b
	startswith(k, prefix)
}

split_bucket(w) := [b, p] if {
	i := indexof(w, "/")
	i > 0
	b := substring(w, 0, i)
	p := substring(w, i + 1, -1)
}

# A copy reads its source: it must be readable too.
source_ok if not input.aws.copy_source

source_ok if readable(input.aws.copy_source.bucket)

grant := {"allow": true, "credentials": [settings.aws.credential], "reason": "AWS S3"}

deny(reason) := {"allow": false, "reason": reason}

decision := deny("the broker says nothing of what this request does (no input.aws): bind the host to an aws_sigv4 credential") if {
	not input.aws
} else := deny("the broker cannot tell which AWS service this request is for: sign it with SigV4 (placeholder keys will do), or set aws_sigv4.service") if {
	input.aws.service == ""
} else := deny(sprintf("AWS %s is never allowed for agents (%s)", [input.aws.service, op])) if {
	input.aws.service in never
} else := deny(sprintf("AWS %s is not allowed for agents: only S3", [input.aws.service])) if {
	input.aws.service != "s3"
} else := grant if {
	op == "ListBuckets"
	settings.aws.list_buckets
} else := grant if {
	op in read_ops
	readable(bucket)
} else := grant if {
	op in write_ops
	writable(bucket, key)
	source_ok
} else := deny(sprintf("S3 %s of %s/%s is not allowed: the copy source %s is not readable", [op, bucket, key, input.aws.copy_source.bucket])) if {
	op in write_ops
	writable(bucket, key)
} else := deny(sprintf("S3 %s of %s/%s is not allowed: agents may read %s and write under %s", [op, bucket, key, concat(", ", settings.aws.read), concat(", ", settings.aws.write)]))
