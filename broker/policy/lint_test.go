package policy

import (
	"encoding/json"
	"strings"
	"testing"
	"testing/fstest"
)

// lintPolicy reads and iterates over data.allow.hosts, a 1,001-entry array, in every way
// an author writes it (directly, through rules and local variables that are the array or
// data.allow, through functions it is passed to), and looks up data.allow.set, an object of
// as many entries.
const lintPolicy = `package broker

import data.allow

hosts := data.allow.hosts

also := hosts

a if input.request.host in data.allow.hosts

b if data.allow.hosts[_] == input.request.host

c if {
	some x in allow.hosts
	x == input.request.host
}

d if input.request.host in also

e if {
	every x in data.allow.hosts {
		x != ""
	}
}

f if data.allow.set[input.request.host]

g(x) if x in data.allow.short

h if data.allow.hosts[0] == "a"

i := count(data.allow.hosts)

j := [x | some x in data.allow.hosts]

k if {
	some i, _ in data.allow.hosts
	data.allow.hosts[i] == input.request.host
}

l := {"listed": input.request.host in data.allow.hosts}

m if {
	some _, v in data.allow.hosts
	v == input.request.host
}

n if "a", input.request.host in data.allow.hosts

nth(i) := data.allow.hosts[i]

o if {
	doc := data.allow
	input.request.host in doc.hosts
}

p if {
	doc := data.allow
	some x in doc.hosts
	x == input.request.host
}

whole := data.allow

q if input.request.host in whole.hosts

r if whole.hosts[_] == input.request.host

s if {
	doc := whole
	listed := doc.hosts
	input.request.host in listed
}

t if {
	doc := data.allow
	doc.set[input.request.host]
	count(doc.hosts) > 0
}

listed(h, list) if h in list

any_of(list) if list[_] == input.request.host

through(h, list) if listed(h, list)

sized(list) if count(list) > 0

u if listed(input.request.host, data.allow.hosts)

v if any_of(data.allow.hosts)

w if through(input.request.host, data.allow.hosts)

x if listed(input.request.host, data.allow.short)

y if sized(data.allow.hosts)

named(list) if list[_].name == input.request.host

z if named(data.allow.hosts)

in_field(cfg) if input.request.host in cfg.hosts

iter_field(cfg) if cfg.hosts[_] == input.request.host

some_field(cfg) if {
	some h in cfg.hosts
	h == input.request.host
}

passes_field(cfg) if listed(input.request.host, cfg.hosts)

keyed(cfg) if cfg.set[input.request.host]

aa if in_field(data.allow)

ab if iter_field(data.allow)

ac if some_field(whole)

ad if passes_field(data.allow)

ae if keyed(data.allow)

af if in_field({"hosts": ["a"]})

aliased(cfg) if {
	c := cfg
	some h in c.hosts
	h == input.request.host
}

ag if aliased(data.allow)

decision := {"allow": a}
`

func TestWarningsOnLargeDataArrays(t *testing.T) {
	hosts := allowListHosts(LargeArray + 1)
	set := map[string]any{}
	for _, h := range hosts {
		set[h] = true
	}
	data, err := json.Marshal(map[string]any{"allow": map[string]any{"hosts": hosts, "set": set, "short": hosts[:LargeArray]}})
	if err != nil {
		t.Fatal(err)
	}
	fsys := fstest.MapFS{"p.rego": {Data: []byte(lintPolicy)}, "data.json": {Data: data}}
	if _, err := New(t.Context(), fsys); err != nil {
		t.Fatal(err)
	}
	got := map[int]string{}
	for _, w := range Warnings(fsys, "pol") {
		if w.File != "pol/p.rego" {
			t.Errorf("warning in %s, want pol/p.rego: %s", w.File, w)
		}
		if prev, dup := got[w.Line]; dup {
			t.Errorf("line %d warned twice:\n%s\n%s", w.Line, prev, w.Message)
		}
		got[w.Line] = w.Message
	}
	want := map[int]string{
		9:   "`input.request.host in data.allow.hosts` tests membership in data.allow.hosts, an array of 1001 entries",
		11:  "`data.allow.hosts[_] == input.request.host` iterates over data.allow.hosts",
		14:  "`some x in allow.hosts` iterates over data.allow.hosts",
		18:  "`input.request.host in also` tests membership in data.allow.hosts",
		21:  "`every x in data.allow.hosts {",
		34:  "`some x in data.allow.hosts` iterates over data.allow.hosts",
		37:  "`some i, _ in data.allow.hosts` iterates over data.allow.hosts",
		41:  "`input.request.host in data.allow.hosts` tests membership in data.allow.hosts",
		44:  "`some _, v in data.allow.hosts` iterates over data.allow.hosts",
		48:  "`\"a\", input.request.host in data.allow.hosts` tests membership in data.allow.hosts",
		54:  "`input.request.host in doc.hosts` tests membership in data.allow.hosts",
		59:  "`some x in doc.hosts` iterates over data.allow.hosts",
		65:  "`input.request.host in whole.hosts` tests membership in data.allow.hosts",
		67:  "`whole.hosts[_] == input.request.host` iterates over data.allow.hosts",
		72:  "`input.request.host in listed` tests membership in data.allow.hosts",
		89:  "`listed(input.request.host, data.allow.hosts)` passes to a function that scans data.allow.hosts",
		91:  "`any_of(data.allow.hosts)` passes to a function that scans data.allow.hosts",
		93:  "`through(input.request.host, data.allow.hosts)` passes to a function that scans data.allow.hosts",
		101: "`named(data.allow.hosts)` passes to a function that scans data.allow.hosts",
		116: "`in_field(data.allow)` passes to a function that scans data.allow.hosts",
		118: "`iter_field(data.allow)` passes to a function that scans data.allow.hosts",
		120: "`some_field(whole)` passes to a function that scans data.allow.hosts",
		122: "`passes_field(data.allow)` passes to a function that scans data.allow.hosts",
		134: "`aliased(data.allow)` passes to a function that scans data.allow.hosts",
	}
	for line, prefix := range want {
		if !strings.HasPrefix(got[line], prefix) {
			t.Errorf("line %d: got %q, want it to start with %q", line, got[line], prefix)
		}
		if !strings.Contains(got[line], "data.allow.hosts[x]") {
			t.Errorf("line %d: %q does not say the lookup to use", line, got[line])
		}
	}
	for line, msg := range got {
		if _, ok := want[line]; !ok {
			t.Errorf("line %d warned, want no warning: %s", line, msg)
		}
	}
}

// TestNoWarningsForSmallArrays: the same policy over 1,000 entries has nothing to warn about.
func TestNoWarningsForSmallArrays(t *testing.T) {
	data, err := json.Marshal(map[string]any{"allow": map[string]any{"hosts": allowListHosts(LargeArray), "set": map[string]any{}, "short": []string{}}})
	if err != nil {
		t.Fatal(err)
	}
	fsys := fstest.MapFS{"p.rego": {Data: []byte(lintPolicy)}, "data.json": {Data: data}}
	for _, w := range Warnings(fsys, "pol") {
		t.Error(w)
	}
}

// TestBundleWarnings: a bundle's policy is warned of as a directory's is, with the file as
// the bundle names it.
func TestBundleWarnings(t *testing.T) {
	srv := newBundleServer(t)
	srv.serve(buildBundle(t, "r1", map[string]string{"/broker/broker.rego": `package broker

decision := {"allow": input.request.host in data.allow.hosts}
`}, map[string]any{"allow": map[string]any{"hosts": allowListHosts(LargeArray + 1)}}, nil), `"r1"`)
	ws := BundleWarnings(t.Context(), BundleOptions{Dial: testDial.Dial, URL: srv.URL})
	if len(ws) != 1 || ws[0].File != "broker/broker.rego" || ws[0].Line != 3 ||
		!strings.Contains(ws[0].Message, "tests membership in data.allow.hosts, an array of 1001 entries") {
		t.Fatalf("warnings %v, want one for broker/broker.rego:3", ws)
	}
}
