package ocsf

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// schemaDir holds the parts of the published OCSF schema the encoder's events use, at the
// release Version names (testdata/schema/README.md says where from).
const schemaDir = "testdata/schema"

// schema validates events against the OCSF schema's source files: each class resolved through
// the classes it extends and the profiles it includes, each attribute typed by the dictionary.
// It reports a missing required attribute, an attribute its class or object does not have, a
// value of the wrong type, a value outside an enum, a profile's attribute without the profile
// in metadata.profiles, an unmet constraint (at_least_one, just_one), and uids that do not
// agree with the class and activity.
type schema struct {
	dir        string
	dict       map[string]dictAttr
	types      map[string]string // a scalar type to the type it refines ("" for a base type)
	categories map[string]int
	events     map[string]rawDef // by name
	mu         sync.Mutex
	objects    map[string]*resolved
	opened     map[string]bool // files read, to keep testdata to what is used
}

type dictAttr struct {
	Type    string                     `json:"type"`
	IsArray bool                       `json:"is_array"`
	Enum    map[string]json.RawMessage `json:"enum"`
}

type rawDef struct {
	Name        string                     `json:"name"`
	UID         int                        `json:"uid"`
	Category    string                     `json:"category"`
	Extends     string                     `json:"extends"`
	Meta        string                     `json:"meta"`
	Attributes  map[string]json.RawMessage `json:"attributes"`
	Constraints struct {
		AtLeastOne []string `json:"at_least_one"`
		JustOne    []string `json:"just_one"`
	} `json:"constraints"`
}

type attrDef struct {
	Requirement string
	Enum        map[string]bool
	Profile     string // the profile that brings the attribute, or ""
}

type resolved struct {
	name       string
	uid        int
	category   string
	attrs      map[string]*attrDef
	atLeastOne [][]string
	justOne    [][]string
}

func loadSchema(t testing.TB) *schema {
	t.Helper()
	s := &schema{dir: schemaDir, objects: map[string]*resolved{}, events: map[string]rawDef{}, opened: map[string]bool{}}
	var dict struct {
		Attributes map[string]dictAttr `json:"attributes"`
		Types      struct {
			Attributes map[string]struct {
				Type string `json:"type"`
			} `json:"attributes"`
		} `json:"types"`
	}
	s.readJSON(t, "dictionary.json", &dict)
	s.dict = dict.Attributes
	s.types = map[string]string{}
	for k, v := range dict.Types.Attributes {
		s.types[k] = v.Type
	}
	var cats struct {
		Attributes map[string]struct {
			UID int `json:"uid"`
		} `json:"attributes"`
	}
	s.readJSON(t, "categories.json", &cats)
	s.categories = map[string]int{}
	for k, v := range cats.Attributes {
		s.categories[k] = v.UID
	}
	err := filepath.WalkDir(filepath.Join(s.dir, "events"), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".json") {
			return err
		}
		var r rawDef
		rel, _ := filepath.Rel(s.dir, path)
		s.readJSON(t, rel, &r)
		s.events[r.Name] = r
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *schema) readJSON(t testing.TB, rel string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.dir, rel))
	if err != nil {
		t.Fatalf("schema testdata lacks %s (copy it from ocsf-schema %s): %v", rel, Version, err)
	}
	s.mu.Lock()
	s.opened[rel] = true
	s.mu.Unlock()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
}

// merge adds def's attributes over those in r: an attribute's fields given again replace
// the earlier ones, its enum grows.
func (s *schema) merge(t testing.TB, r *resolved, attrs map[string]json.RawMessage, profile string) {
	for name, raw := range attrs {
		if name == "$include" {
			var incs []string
			if err := json.Unmarshal(raw, &incs); err != nil {
				t.Fatalf("$include: %v", err)
			}
			for _, inc := range incs {
				var d rawDef
				s.readJSON(t, inc, &d)
				p := profile
				if d.Meta == "profile" {
					p = d.Name
				}
				s.merge(t, r, d.Attributes, p)
			}
			continue
		}
		var a struct {
			Requirement *string                    `json:"requirement"`
			Enum        map[string]json.RawMessage `json:"enum"`
		}
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(raw, &a); err != nil {
			t.Fatalf("attribute %s: %v", name, err)
		}
		_ = json.Unmarshal(raw, &keys)
		d := r.attrs[name]
		if d == nil {
			d = &attrDef{Enum: map[string]bool{}, Profile: profile}
			for k := range s.dict[name].Enum {
				d.Enum[k] = true
			}
			r.attrs[name] = d
		}
		if a.Requirement != nil {
			d.Requirement = *a.Requirement
		}
		for k := range a.Enum {
			d.Enum[k] = true
		}
		if p, ok := keys["profile"]; ok && string(p) == "null" {
			d.Profile = "" // the class makes the attribute its own
		}
	}
}

func (s *schema) class(t testing.TB, name string) *resolved {
	var chain []rawDef
	for n := name; n != ""; {
		d, ok := s.events[n]
		if !ok {
			t.Fatalf("schema testdata lacks the event class %q", n)
		}
		chain = append(chain, d)
		n = d.Extends
	}
	r := &resolved{name: name, uid: chain[0].UID, attrs: map[string]*attrDef{}}
	for i := len(chain) - 1; i >= 0; i-- {
		s.merge(t, r, chain[i].Attributes, "")
		r.constrain(chain[i])
		if chain[i].Category != "" {
			r.category = chain[i].Category
		}
	}
	return r
}

func (s *schema) object(t testing.TB, name string) *resolved {
	s.mu.Lock()
	r := s.objects[name]
	s.mu.Unlock()
	if r != nil {
		return r
	}
	var chain []rawDef
	for n := name; n != ""; {
		var d rawDef
		s.readJSON(t, "objects/"+n+".json", &d)
		chain = append(chain, d)
		n = d.Extends
	}
	r = &resolved{name: name, attrs: map[string]*attrDef{}}
	for i := len(chain) - 1; i >= 0; i-- {
		s.merge(t, r, chain[i].Attributes, "")
		r.constrain(chain[i])
	}
	s.mu.Lock()
	s.objects[name] = r
	s.mu.Unlock()
	return r
}

// constrain takes d's constraints, when it has any: a definition's replace those of the one it
// extends.
func (r *resolved) constrain(d rawDef) {
	if c := d.Constraints; len(c.AtLeastOne) > 0 || len(c.JustOne) > 0 {
		r.atLeastOne, r.justOne = nil, nil
		if len(c.AtLeastOne) > 0 {
			r.atLeastOne = [][]string{c.AtLeastOne}
		}
		if len(c.JustOne) > 0 {
			r.justOne = [][]string{c.JustOne}
		}
	}
}

// classNameOf finds the class whose uid is classUID.
func (s *schema) classNameOf(t testing.TB, classUID int) string {
	for name, d := range s.events {
		if d.UID == 0 || d.Name == "base_event" {
			continue
		}
		r := s.class(t, name)
		if s.categories[r.category]*1000+r.uid == classUID {
			return name
		}
	}
	t.Fatalf("schema testdata has no class %d", classUID)
	return ""
}

// validate returns every problem of one event.
func (s *schema) validate(t testing.TB, line []byte) []string {
	var ev map[string]any
	dec := json.NewDecoder(strings.NewReader(string(line)))
	dec.UseNumber()
	if err := dec.Decode(&ev); err != nil {
		return []string{"not a JSON object: " + err.Error()}
	}
	n, _ := ev["class_uid"].(json.Number)
	classUID, err := strconv.Atoi(string(n))
	if err != nil {
		return []string{"class_uid missing or not an integer"}
	}
	c := s.class(t, s.classNameOf(t, classUID))
	var probs []string
	add := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }
	profiles := map[string]bool{}
	if md, ok := ev["metadata"].(map[string]any); ok {
		if ps, ok := md["profiles"].([]any); ok {
			for _, p := range ps {
				if p, ok := p.(string); ok {
					profiles[p] = true
				}
			}
		}
	}
	s.check(t, c, ev, "", profiles, add, true)
	cat := s.categories[c.category]
	num := func(k string) int64 {
		n, _ := ev[k].(json.Number)
		v, _ := n.Int64()
		return v
	}
	if num("category_uid") != int64(cat) {
		add("category_uid %d, want %d", num("category_uid"), cat)
	}
	if want := int64(classUID)*100 + num("activity_id"); num("type_uid") != want {
		add("type_uid %d, want %d", num("type_uid"), want)
	}
	return probs
}

// uids are checked against the class, not the base event's enum of them.
var uids = map[string]bool{"class_uid": true, "category_uid": true, "type_uid": true}

func (s *schema) check(t testing.TB, r *resolved, obj map[string]any, at string, profiles map[string]bool, add func(string, ...any), top bool) {
	for _, name := range slices.Sorted(maps.Keys(r.attrs)) {
		d := r.attrs[name]
		if _, ok := obj[name]; !ok && d.Requirement == "required" && (d.Profile == "" || profiles[d.Profile]) {
			add("%s%s: required, missing", at, name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(obj)) {
		v := obj[name]
		d, ok := r.attrs[name]
		if !ok {
			add("%s%s: not an attribute of %s", at, name, r.name)
			continue
		}
		if d.Profile != "" && !profiles[d.Profile] {
			add("%s%s: of the profile %q, not in metadata.profiles", at, name, d.Profile)
		}
		da, ok := s.dict[name]
		if !ok {
			add("%s%s: not in the dictionary", at, name)
			continue
		}
		if da.IsArray {
			arr, ok := v.([]any)
			if !ok {
				add("%s%s: not an array", at, name)
				continue
			}
			for i, e := range arr {
				s.value(t, da.Type, d, e, fmt.Sprintf("%s%s[%d]", at, name, i), profiles, add, top && uids[name])
			}
			continue
		}
		s.value(t, da.Type, d, v, at+name, profiles, add, top && uids[name])
	}
	for _, group := range r.atLeastOne {
		if !slices.ContainsFunc(group, func(k string) bool { _, ok := obj[k]; return ok }) {
			add("%s: needs at least one of %v", strings.TrimSuffix(at, "."), group)
		}
	}
	for _, group := range r.justOne {
		n := 0
		for _, k := range group {
			if _, ok := obj[k]; ok {
				n++
			}
		}
		if n != 1 {
			add("%s: needs just one of %v", strings.TrimSuffix(at, "."), group)
		}
	}
}

func (s *schema) value(t testing.TB, typ string, d *attrDef, v any, at string, profiles map[string]bool, add func(string, ...any), skipEnum bool) {
	base := typ
	for s.types[base] != "" {
		base = s.types[base]
	}
	if _, scalar := s.types[typ]; !scalar {
		o, ok := v.(map[string]any)
		if !ok {
			add("%s: not an object (%s)", at, typ)
			return
		}
		if typ == "object" {
			return // free-form (unmapped)
		}
		s.check(t, s.object(t, typ), o, at+".", profiles, add, false)
		return
	}
	switch base {
	case "string_t":
		if _, ok := v.(string); !ok {
			add("%s: not a string (%s)", at, typ)
		}
	case "integer_t", "long_t":
		n, ok := v.(json.Number)
		if _, err := n.Int64(); !ok || err != nil {
			add("%s: not an integer (%s): %v", at, typ, v)
			return
		}
	case "float_t":
		if _, ok := v.(json.Number); !ok {
			add("%s: not a number (%s)", at, typ)
		}
	case "boolean_t":
		if _, ok := v.(bool); !ok {
			add("%s: not a boolean", at)
		}
	case "json_t":
	default:
		add("%s: unknown type %s", at, typ)
	}
	if len(d.Enum) > 0 && !skipEnum {
		if key := fmt.Sprint(v); !d.Enum[key] {
			keys := slices.Collect(maps.Keys(d.Enum))
			sort.Strings(keys)
			add("%s: %v not in its enum %v", at, v, keys)
		}
	}
}
