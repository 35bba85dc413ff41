package github

import (
	"testing"

	"github.com/capbroker/capbroker/credentials"
)

func TestWithin(t *testing.T) {
	asked, err := parseScope(credentials.Scope{"repositories": []any{"r1", "R2"}, "permissions": map[string]any{"contents": "write", "issues": "read"}})
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		perms     map[string]string
		selection string
		repos     []string
		ok        bool
	}{
		"exact":              {map[string]string{"contents": "write", "issues": "read", "metadata": "read"}, "selected", []string{"r1", "r2"}, true},
		"narrower":           {map[string]string{"contents": "read"}, "selected", []string{"r1"}, true},
		"higher level":       {map[string]string{"contents": "write", "issues": "write"}, "selected", []string{"r1"}, false},
		"unasked permission": {map[string]string{"contents": "write", "actions": "read"}, "selected", []string{"r1"}, false},
		"metadata write":     {map[string]string{"metadata": "write"}, "selected", []string{"r1"}, false},
		"unknown level":      {map[string]string{"contents": "everything"}, "selected", []string{"r1"}, false},
		"all repositories":   {map[string]string{"contents": "write"}, "all", nil, false},
		"another repository": {map[string]string{"contents": "write"}, "selected", []string{"r1", "r3"}, false},
	}
	for name, c := range cases {
		err := asked.within(c.perms, c.selection, c.repos)
		if (err == nil) != c.ok {
			t.Errorf("%s: within = %v, want ok %v", name, err, c.ok)
		}
	}
	// Not narrowed: whatever the installation gives is what was asked.
	none, _ := parseScope(nil)
	if err := none.within(map[string]string{"administration": "write"}, "all", nil); err != nil {
		t.Errorf("no scope: %v", err)
	}
}

func TestCanonical(t *testing.T) {
	a, _ := parseScope(credentials.Scope{"repositories": []any{"b", "A"}, "permissions": map[string]any{"x": "read", "a": "write"}})
	b, _ := parseScope(credentials.Scope{"permissions": map[string]string{"a": "write", "x": "read"}, "repositories": []string{"a", "B", "b"}})
	if a.key != b.key {
		t.Fatalf("%q != %q", a.key, b.key)
	}
	c, _ := parseScope(credentials.Scope{"repositories": []any{"a", "b"}})
	d, _ := parseScope(credentials.Scope{"permissions": map[string]any{"a": "write"}})
	n, _ := parseScope(nil)
	if c.key == a.key || d.key == a.key || n.key == c.key || n.key == d.key {
		t.Fatal("different scopes share a key")
	}
}

// appendKey, the per-request lookup, agrees with parseScope on every scope it reads.
func TestKeyOfAgreesWithParseScope(t *testing.T) {
	for _, s := range []credentials.Scope{
		nil,
		{},
		{"repositories": []any{"R1", "r1", "b"}},
		{"permissions": map[string]any{"contents": "write", "actions": "read"}},
		{"repositories": []any{"x"}, "permissions": map[string]any{"issues": "admin"}},
	} {
		kb, ok := appendKey(nil, s)
		key := string(kb)
		sc, err := parseScope(s)
		if !ok || err != nil || key != sc.key {
			t.Errorf("%v: appendKey %q %v, parseScope %q %v", s, key, ok, sc.key, err)
		}
	}
	for _, s := range []credentials.Scope{
		{"repos": []any{"r1"}},
		{"repositories": []any{}},
		{"repositories": []any{"o/r"}},
		{"permissions": map[string]any{"contents": "all"}},
		{"permissions": map[string]any{}},
	} {
		if _, ok := appendKey(nil, s); ok {
			t.Errorf("%v: appendKey read a scope parseScope refuses", s)
		}
	}
}
