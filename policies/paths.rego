# Paths as the shipped policies read them: by segments, never by a bare string prefix.
#
# The broker gives policies the normalised path it sends upstream (dot-segments removed,
# escapes of unreserved characters decoded, other escapes upper-case) and refuses with a 400
# what an upstream could read otherwise ("..%2F", "..;", backslashes...). These rules are safe
# on their own too, fed a raw path (a test, `broker policy eval`, a proxy in front): every
# spelling of "." and ".." that some server resolves makes a path not canonical.
package paths

# segments(p): "/v1/models/x" -> ["v1", "models", "x"]; "/" -> [""]; "/a/" -> ["a", ""].
segments(p) := split(trim_prefix(p, "/"), "/")

# lenient(p): p as the most lenient server reads it: lower-case, escapes decoded twice (%252e
# is "."), a decoded %2F or %5C or a backslash taken for "/", %3B for ";".
lenient(p) := strings.replace_n(
	{"%2e": ".", "%2f": "/", "%5c": "/", "\\": "/", "%3b": ";"},
	replace(lower(p), "%25", "%"),
)

# traversal(p): some server reads a "." or ".." segment in p, maybe after dropping the ";"
# path parameters Tomcat, Jetty and Spring drop.
traversal(p) if {
	some s in split(lenient(p), "/")
	split(s, ";")[0] in {".", ".."}
}

# ambiguous(p): p holds what servers disagree on: a backslash or %5C (a separator to some),
# ";" or %3B (path parameters to some), %25 (an escape decoded twice), a control character
# raw or escaped, "#".
ambiguous(p) if regex.match(`(?i)\\|;|%5c|%3b|%25|%[01][0-9a-f]|%7f|[\x00-\x1f\x7f#]`, p)

# encoded_slash(p): p holds an escaped "/" (%2F), which one server reads as data and another
# as a separator: a segment boundary the policy cannot place.
encoded_slash(p) if contains(lower(p), "%2f")

# empty_segment(p): p has "//" (or starts with it), which many servers merge into one "/".
empty_segment(p) if contains(p, "//")

# canonical(p): p is an absolute path that no server reads with a "." or ".." segment and in
# which servers agree where segments start and end, an escaped "/" aside (npm's @scope%2Fname
# and GitLab's group%2Fproject need it; policies that grant credentials refuse it where it
# matters, with encoded_slash).
canonical(p) if {
	startswith(p, "/")
	not regex.match(`[%\\;#\x00-\x1f\x7f]|(^|/)\.\.?(/|$)`, p) # the usual path: no escape, no dot-segment
}

canonical(p) if {
	startswith(p, "/")
	contains(p, "%")
	not traversal(p)
	not ambiguous(p)
}

# under(p, prefix): p is prefix or below it, segment by segment: "/v1/models/x" is under
# "/v1/models", "/v1/modelsx" is not.
under(p, prefix) if {
	want := segments(prefix)
	have := segments(p)
	count(have) >= count(want)
	array.slice(have, 0, count(want)) == want
}
