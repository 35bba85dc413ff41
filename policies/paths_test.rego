package paths_test

import data.paths

# Every spelling of a way out of a path, and what canonical says of it.
canonical_cases := {
	"plain": {"path": "/v1/models", "canonical": true},
	"trailing slash": {"path": "/simple/requests/", "canonical": true},
	"root": {"path": "/", "canonical": true},
	"dots inside a name": {"path": "/a..b/...", "canonical": true},
	"encoded slash kept as data": {"path": "/@types%2Fnode", "canonical": true},
	"double slash": {"path": "/v1//models", "canonical": true},
	"not absolute": {"path": "v1/models", "canonical": false},
	"asterisk": {"path": "*", "canonical": false},
	"dot-dot": {"path": "/v1/models/../files", "canonical": false},
	"dot": {"path": "/v1/./models", "canonical": false},
	"trailing dot-dot": {"path": "/v1/models/..", "canonical": false},
	"encoded dot-dot": {"path": "/v1/models/%2e%2e/files", "canonical": false},
	"encoded dot-dot, upper-case": {"path": "/v1/models/%2E%2E/files", "canonical": false},
	"half-encoded dot-dot": {"path": "/v1/models/.%2e/files", "canonical": false},
	"dot-dot behind an encoded slash": {"path": "/v1/models/..%2Ffiles", "canonical": false},
	"dot-dot between encoded slashes": {"path": "/v1/models%2F..%2Ffiles", "canonical": false},
	"double-encoded dot-dot": {"path": "/v1/models/%252e%252e/files", "canonical": false},
	"dot-dot with a path parameter": {"path": "/v1/models/..;/files", "canonical": false},
	"dot-dot with an encoded parameter": {"path": "/v1/models/..%3B/files", "canonical": false},
	"path parameter": {"path": "/v1/models;x=1", "canonical": false},
	"backslash": {"path": "/v1/models\\..\\files", "canonical": false},
	"encoded backslash": {"path": "/v1/models%5Cx", "canonical": false},
	"NUL": {"path": "/v1/%00", "canonical": false},
	"encoded newline": {"path": "/v1/%0a", "canonical": false},
	"fragment": {"path": "/v1/models#x", "canonical": false},
}

test_canonical[name] if {
	some name, c in canonical_cases
	c.canonical == is_canonical(c.path)
}

is_canonical(p) if paths.canonical(p)

else := false

test_under if {
	paths.under("/v1/models", "/v1/models")
	paths.under("/v1/models/gpt-4.1", "/v1/models")
	paths.under("/v1/models/", "/v1/models")
	not paths.under("/v1/modelsx", "/v1/models")
	not paths.under("/v1", "/v1/models")
	not paths.under("//v1/models", "/v1/models")
}

test_encoded_slash if {
	paths.encoded_slash("/a%2fb")
	paths.encoded_slash("/a%2Fb")
	not paths.encoded_slash("/a/b")
}

test_empty_segment if {
	paths.empty_segment("//v1")
	paths.empty_segment("/v1//x")
	not paths.empty_segment("/v1/x/")
}
