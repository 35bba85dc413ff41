package policy

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

// The policy allows a request whose host is in data.hosts.allowed and says what data.team.name is.
const dataPolicy = `package broker

default team := "none"

team := data.team.name

default allowed := []

allowed := data.hosts.allowed

decision := {"allow": input.request.host in allowed, "reason": sprintf("team %v", [team])}
`

func TestDataFiles(t *testing.T) {
	cases := map[string]struct {
		files  map[string]string
		allow  bool
		reason string
	}{
		"root JSON merges into data": {
			files: map[string]string{"data.json": `{"hosts": {"allowed": ["api.example.com"]}}`},
			allow: true, reason: "team none",
		},
		"a file's directory is its path": {
			files: map[string]string{"hosts/list.json": `{"allowed": ["api.example.com"]}`, "team/team.yaml": "name: platform\n"},
			allow: true, reason: "team platform",
		},
		"yml and nested directories": {
			files:  map[string]string{"hosts/allowed.yml": `{"allowed": ["other.example.com"]}`, "x/y/z.json": `1`},
			reason: "team none",
		},
		"files in one directory merge": {
			files: map[string]string{"a.yaml": "hosts: {allowed: [api.example.com]}\n", "b.json": `{"team": {"name": "b"}}`},
			allow: true, reason: "team b",
		},
		"hidden directories are skipped": {
			files:  map[string]string{"..2024_01_01/data.json": `{"hosts": {"allowed": ["api.example.com"]}}`},
			reason: "team none",
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			fsys := fstest.MapFS{"p.rego": {Data: []byte(dataPolicy)}}
			for n, s := range c.files {
				fsys[n] = &fstest.MapFile{Data: []byte(s)}
			}
			e, err := New(context.Background(), fsys)
			if err != nil {
				t.Fatal(err)
			}
			d, err := e.Decide(context.Background(), req())
			if err != nil || d.Allow != c.allow || d.Reason != c.reason {
				t.Fatalf("got %+v %v", d, err)
			}
		})
	}
}

func TestBadDataFiles(t *testing.T) {
	cases := map[string]struct {
		files map[string]string
		want  string
	}{
		"invalid JSON has file:line":  {files: map[string]string{"d/x.json": "{\n  \"a\": ,\n}"}, want: "d/x.json:2: invalid JSON"},
		"invalid YAML has file:line":  {files: map[string]string{"x.yaml": "a: 1\nb: [\n"}, want: "x.yaml:"},
		"root data must be an object": {files: map[string]string{"x.json": "[1]"}, want: "x.json:1: a data file at the root"},
		"conflicting values": {
			files: map[string]string{"a.json": `{"team": {"name": "a"}}`, "b.json": `{"team": {"name": "b"}}`},
			want:  "b.json:1: data.team.name is already defined by another data file",
		},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			fsys := fstest.MapFS{"p.rego": {Data: []byte(dataPolicy)}}
			for n, s := range c.files {
				fsys[n] = &fstest.MapFile{Data: []byte(s)}
			}
			_, err := New(context.Background(), fsys)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want %q", err, c.want)
			}
		})
	}
}

func TestDataIsInTheRevision(t *testing.T) {
	fsys := fstest.MapFS{"p.rego": {Data: []byte(dataPolicy)}, "data.json": {Data: []byte(`{"hosts": {"allowed": []}}`)}}
	a, err := New(context.Background(), fsys)
	if err != nil {
		t.Fatal(err)
	}
	fsys["data.json"] = &fstest.MapFile{Data: []byte(`{"hosts": {"allowed": ["api.example.com"]}}`)}
	b, err := New(context.Background(), fsys)
	if err != nil {
		t.Fatal(err)
	}
	if a.Revision() == b.Revision() {
		t.Fatal("a data change kept the revision")
	}
	fsys["p_test.rego"] = &fstest.MapFile{Data: []byte("package broker_test\n")}
	fsys["README.md"] = &fstest.MapFile{Data: []byte("notes")}
	c, _ := New(context.Background(), fsys)
	if c.Revision() != b.Revision() {
		t.Fatal("files not loaded at run time changed the revision")
	}
}

// TestWatchReloadsData: a data file changed in a subdirectory is hot reloaded like the Rego.
func TestWatchReloadsData(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "p.rego"), []byte(dataPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "hosts"), 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(s string) {
		tmp := filepath.Join(dir, ".tmp.json")
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "hosts", "list.json")); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"allowed": []}`)
	e, err := NewDir(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	reloads := watch(t, e, dir)
	write(`{"allowed": ["api.example.com"]}`)
	if err := <-reloads; err != nil {
		t.Fatal(err)
	}
	if d, _ := e.Decide(context.Background(), req()); !d.Allow {
		t.Fatalf("data reload did not take effect: %+v", d)
	}
	// A data file that does not parse keeps the last good policy.
	write(`{"allowed": [`)
	for err := range reloads {
		if err == nil {
			continue // a reload from an earlier rewrite
		}
		if !strings.Contains(err.Error(), "hosts/list.json") {
			t.Fatalf("reload error does not name the file: %v", err)
		}
		break
	}
	if d, _ := e.Decide(context.Background(), req()); !d.Allow {
		t.Fatal("last good policy lost")
	}
}

func TestDecisionIDs(t *testing.T) {
	e := engine(t, "package broker\n\ndecision := {\"allow\": true}\n")
	seen := map[string]bool{}
	for range 100 {
		d, err := e.Decide(context.Background(), req())
		if err != nil {
			t.Fatal(err)
		}
		if len(d.ID) != 36 || d.ID[14] != '4' || seen[d.ID] {
			t.Fatalf("decision id %q: not a fresh UUIDv4", d.ID)
		}
		seen[d.ID] = true
	}
	// Errors and undefined decisions get IDs too.
	bad := engine(t, "package broker\n\ndecision := {\"allow\": to_number(\"x\") > 0}\n")
	if d, err := bad.Decide(context.Background(), req()); err == nil || d.ID == "" {
		t.Fatalf("error decision: %+v %v", d, err)
	}
}

func TestEngineWithoutPolicyFailsClosed(t *testing.T) {
	var e Engine
	d, err := e.Decide(context.Background(), req())
	if !errors.Is(err, ErrEvaluation) || !errors.Is(err, ErrNoPolicy) || d.Allow || d.ID == "" {
		t.Fatalf("got %+v, %v; want ErrEvaluation and no allow", d, err)
	}
	if e.Revision() != "" {
		t.Fatalf("revision %q", e.Revision())
	}
}
