// Package ocsfschema validates events against the source files of the published OCSF schema
// (github.com/ocsf/ocsf-schema): each class resolved through the classes it extends and the
// profiles it includes, each attribute typed by the dictionary. It is for tests (the OCSF
// encoder's and the integration suite's); the part of release 1.8.0 they use is in schema/
// (schema/README.md says where from).
//
// Validate reports a missing required attribute, an attribute its class or object does not
// have, a value of the wrong type, a value outside an enum, a profile's attribute without the
// profile in metadata.profiles, an unmet constraint (at_least_one, just_one), and uids that do
// not agree with the class and activity.
package ocsfschema

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Dir is the directory of the schema files beside this package's source.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "schema")
}

// Schema is a loaded schema. Safe for concurrent use.
type Schema struct {
	dir        string
	dict       map[string]dictAttr
	types      map[string]string // a scalar type to the type it refines ("" for a base type)
	categories map[string]int
	events     map[string]rawDef // by name
	mu         sync.Mutex
	objects    map[string]*resolved
	opened     map[string]bool // files read
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

// Load reads the dictionary, the categories and the event classes under dir; objects are
// read as events reach them.
func Load(dir string) (*Schema, error) {
	s := &Schema{dir: dir, objects: map[string]*resolved{}, events: map[string]rawDef{}, opened: map[string]bool{}}
	var dict struct {
		Attributes map[string]dictAttr `json:"attributes"`
		Types      struct {
			Attributes map[string]struct {
				Type string `json:"type"`
			} `json:"attributes"`
		} `json:"types"`
	}
	if err := s.readJSON("dictionary.json", &dict); err != nil {
		return nil, err
	}
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
	if err := s.readJSON("categories.json", &cats); err != nil {
		return nil, err
	}
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
		if err := s.readJSON(rel, &r); err != nil {
			return err
		}
		s.events[r.Name] = r
		return nil
	})
	return s, err
}

// Opened lists the files read so far, relative to the schema's directory.
func (s *Schema) Opened() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.opened)
}

func (s *Schema) readJSON(rel string, v any) error {
	b, err := os.ReadFile(filepath.Join(s.dir, rel))
	if err != nil {
		return fmt.Errorf("the schema files lack %s: %w", rel, err)
	}
	s.mu.Lock()
	s.opened[rel] = true
	s.mu.Unlock()
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	return nil
}

// merge adds attrs over those in r: an attribute's fields given again replace the earlier
// ones, its enum grows.
func (s *Schema) merge(r *resolved, attrs map[string]json.RawMessage, profile string) error {
	for _, name := range slices.Sorted(maps.Keys(attrs)) {
		raw := attrs[name]
		if name == "$include" {
			var incs []string
			if err := json.Unmarshal(raw, &incs); err != nil {
				return fmt.Errorf("$include: %w", err)
			}
			for _, inc := range incs {
				var d rawDef
				if err := s.readJSON(inc, &d); err != nil {
					return err
				}
				p := profile
				if d.Meta == "profile" {
					p = d.Name
				}
				if err := s.merge(r, d.Attributes, p); err != nil {
					return err
				}
			}
			continue
		}
		var a struct {
			Requirement *string                    `json:"requirement"`
			Enum        map[string]json.RawMessage `json:"enum"`
		}
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(raw, &a); err != nil {
			return fmt.Errorf("attribute %s: %w", name, err)
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
	return nil
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

func (s *Schema) class(name string) (*resolved, error) {
	var chain []rawDef
	for n := name; n != ""; {
		d, ok := s.events[n]
		if !ok {
			return nil, fmt.Errorf("the schema files lack the event class %q", n)
		}
		chain = append(chain, d)
		n = d.Extends
	}
	r := &resolved{name: name, uid: chain[0].UID, attrs: map[string]*attrDef{}}
	for i := len(chain) - 1; i >= 0; i-- {
		if err := s.merge(r, chain[i].Attributes, ""); err != nil {
			return nil, err
		}
		r.constrain(chain[i])
		if chain[i].Category != "" {
			r.category = chain[i].Category
		}
	}
	return r, nil
}

func (s *Schema) object(name string) (*resolved, error) {
	s.mu.Lock()
	r := s.objects[name]
	s.mu.Unlock()
	if r != nil {
		return r, nil
	}
	var chain []rawDef
	for n := name; n != ""; {
		var d rawDef
		if err := s.readJSON("objects/"+n+".json", &d); err != nil {
			return nil, err
		}
		chain = append(chain, d)
		n = d.Extends
	}
	r = &resolved{name: name, attrs: map[string]*attrDef{}}
	for i := len(chain) - 1; i >= 0; i-- {
		if err := s.merge(r, chain[i].Attributes, ""); err != nil {
			return nil, err
		}
		r.constrain(chain[i])
	}
	s.mu.Lock()
	s.objects[name] = r
	s.mu.Unlock()
	return r, nil
}

// classOf finds the class whose uid is classUID.
func (s *Schema) classOf(classUID int) (*resolved, error) {
	for name, d := range s.events {
		if d.UID == 0 || d.Name == "base_event" {
			continue
		}
		r, err := s.class(name)
		if err != nil {
			return nil, err
		}
		if s.categories[r.category]*1000+r.uid == classUID {
			return r, nil
		}
	}
	return nil, fmt.Errorf("the schema files have no class %d", classUID)
}

// Validate returns every problem of one event, a JSON object.
func (s *Schema) Validate(line []byte) []string {
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
	c, err := s.classOf(classUID)
	if err != nil {
		return []string{err.Error()}
	}
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
	s.check(c, ev, "", profiles, add, true)
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

func (s *Schema) check(r *resolved, obj map[string]any, at string, profiles map[string]bool, add func(string, ...any), top bool) {
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
				s.value(da.Type, d, e, fmt.Sprintf("%s%s[%d]", at, name, i), profiles, add, top && uids[name])
			}
			continue
		}
		s.value(da.Type, d, v, at+name, profiles, add, top && uids[name])
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

func (s *Schema) value(typ string, d *attrDef, v any, at string, profiles map[string]bool, add func(string, ...any), skipEnum bool) {
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
		r, err := s.object(typ)
		if err != nil {
			add("%s: %v", at, err)
			return
		}
		s.check(r, o, at+".", profiles, add, false)
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
