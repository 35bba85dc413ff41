package config

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Problem is one thing wrong with a config: the key path it is about, what is wrong, and the
// line of the file it was found on (0 when the key is not in the file, e.g. a required key left
// out of a section that is itself absent).
type Problem struct {
	Path string
	Msg  string
	Line int
	// badValue: the value at Path could not be decoded, so it was left at its zero value;
	// what validation then says about Path, or the keys around it, would only repeat this.
	badValue bool
}

func (p *Problem) Error() string {
	s := p.Msg
	if p.Path != "" {
		s = p.Path + ": " + s
	}
	if p.Line > 0 {
		s += " (line " + strconv.Itoa(p.Line) + ")"
	}
	return s
}

// Problems lists every problem of a config file, in the order of the file's lines. Its Error
// puts one problem per line.
type Problems []*Problem

func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap lets errors.As find each *Problem.
func (ps Problems) Unwrap() []error {
	out := make([]error, len(ps))
	for i, p := range ps {
		out[i] = p
	}
	return out
}

// keyLines maps the key path of every key and list item in a file to its line.
type keyLines map[string]int

// line returns the line of path, or of the closest enclosing key that is in the file: a
// required key that is missing is reported on the line of its section.
func (k keyLines) line(path string) int {
	for path != "" {
		if l, ok := k[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			return 0
		}
		path = path[:i]
	}
	return 0
}

var yamlLineRe = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

// syntaxProblem turns a YAML parse error ("yaml: line 3: mapping values are not allowed in
// this context") into a Problem with its line.
func syntaxProblem(err error) *Problem {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if m := yamlLineRe.FindStringSubmatch(err.Error()); m != nil {
		l, _ := strconv.Atoi(m[1])
		return &Problem{Msg: "YAML syntax error: " + m[2], Line: l}
	}
	return &Problem{Msg: "YAML syntax error: " + msg}
}

// shape walks a YAML node against the Go type it decodes into, by the yaml tags of its
// fields: every key that is not a field, every duplicate key and every value of the wrong
// kind becomes a Problem; every key's line is recorded. What it accepts decodes without error.
type shape struct {
	lines    keyLines
	problems Problems
}

var durationType = reflect.TypeOf(time.Duration(0))

func (s *shape) add(path string, line int, format string, args ...any) {
	s.problems = append(s.problems, &Problem{Path: path, Msg: fmt.Sprintf(format, args...), Line: line, badValue: true})
}

// follows reports whether a validation problem at path follows from a value problem at bad:
// the same key, a key inside it, or the key holding it.
func follows(path, bad string) bool {
	within := func(a, b string) bool {
		return a == b || strings.HasPrefix(a, b+".") || strings.HasPrefix(a, b+"[")
	}
	return within(path, bad) || within(bad, path)
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func (s *shape) walk(n *yaml.Node, t reflect.Type, path string) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return
		}
		n = n.Content[0]
	}
	if isNull(n) {
		return // an empty section decodes to its zero value
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			s.add(path, n.Line, "must be a mapping of keys, not %s", describe(n))
			return
		}
		fields := map[string]reflect.Type{}
		for i := range t.NumField() {
			f := t.Field(i)
			if tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); tag != "" && tag != "-" {
				fields[tag] = f.Type
			}
		}
		s.mapping(n, path, func(key string) (reflect.Type, bool) { ft, ok := fields[key]; return ft, ok })
	case t.Kind() == reflect.Map:
		if n.Kind != yaml.MappingNode {
			s.add(path, n.Line, "must be a mapping of keys, not %s", describe(n))
			return
		}
		s.mapping(n, path, func(string) (reflect.Type, bool) { return t.Elem(), true })
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			s.add(path, n.Line, "must be a list, not %s", describe(n))
			return
		}
		for i, item := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			s.lines[p] = item.Line
			s.walk(item, t.Elem(), p)
		}
	default:
		s.scalar(n, t, path)
	}
}

// mapping checks the keys of a mapping node; field says what type a key's value has, if the
// key is allowed.
func (s *shape) mapping(n *yaml.Node, path string, field func(string) (reflect.Type, bool)) {
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			s.add(path, k.Line, "keys must be plain names")
			continue
		}
		p := join(path, k.Value)
		if k.ShortTag() == "!!merge" {
			// <<: *anchor (or a list of them): the anchored mappings' keys are this mapping's.
			s.merge(v, path, field)
			continue
		}
		if first, dup := seen[k.Value]; dup {
			if first == k.Line {
				s.add(p, k.Line, "duplicate key")
			} else {
				s.add(p, k.Line, "duplicate key (first on line %d)", first)
			}
			continue
		}
		seen[k.Value] = k.Line
		ft, ok := field(k.Value)
		if !ok {
			s.problems = append(s.problems, &Problem{Path: p, Msg: "unknown key", Line: k.Line})
			continue
		}
		s.lines[p] = k.Line
		s.walk(v, ft, p)
	}
}

// merge checks the mappings a merge key brings in, as keys of the mapping at path.
func (s *shape) merge(v *yaml.Node, path string, field func(string) (reflect.Type, bool)) {
	for v.Kind == yaml.AliasNode && v.Alias != nil {
		v = v.Alias
	}
	switch v.Kind {
	case yaml.MappingNode:
		s.mapping(v, path, field)
	case yaml.SequenceNode:
		for _, m := range v.Content {
			s.merge(m, path, field)
		}
	default:
		s.add(join(path, "<<"), v.Line, "must merge a mapping, not %s", describe(v))
	}
}

// scalar checks that a leaf value decodes into t.
func (s *shape) scalar(n *yaml.Node, t reflect.Type, path string) {
	if n.Kind != yaml.ScalarNode {
		s.add(path, n.Line, "must be %s, not %s", kindName(t), describe(n))
		return
	}
	if err := n.Decode(reflect.New(t).Interface()); err != nil {
		s.add(path, n.Line, "must be %s, not %q", kindName(t), n.Value)
	}
}

func kindName(t reflect.Type) string {
	if t == durationType {
		return "a duration such as 30s or 5m"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.String:
		return "a string"
	}
	return "a " + t.Kind().String()
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(n.Value)
}

// decode parses b into c. Every key that is not part of the config, and every value of the
// wrong kind, is a Problem; the rest is decoded. It returns the line of every key.
func decode(b []byte, c *Config) (keyLines, Problems) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, Problems{syntaxProblem(err)}
	}
	s := &shape{lines: keyLines{}}
	s.walk(&doc, reflect.TypeOf(c), "")
	if len(s.problems) > 0 {
		// Decode what is well-formed, so that validation reports on the rest too: a wrong
		// value leaves its field at the zero value.
		_ = doc.Decode(c)
		return s.lines, s.problems
	}
	if doc.Kind != 0 {
		if err := doc.Decode(c); err != nil {
			// The walk accepts only what decodes; anything else is a defect, still reported.
			var te *yaml.TypeError
			if errors.As(err, &te) {
				for _, m := range te.Errors {
					s.problems = append(s.problems, syntaxProblem(errors.New(m)))
				}
			} else {
				s.problems = append(s.problems, &Problem{Msg: err.Error()})
			}
		}
	}
	return s.lines, s.problems
}

// sortProblems orders problems by line; those without one (keys the file does not have)
// come last, in the order they were found.
func sortProblems(ps Problems) {
	slices.SortStableFunc(ps, func(a, b *Problem) int {
		la, lb := a.Line, b.Line
		if la == 0 {
			la = int(^uint(0) >> 1)
		}
		if lb == 0 {
			lb = int(^uint(0) >> 1)
		}
		return cmp.Compare(la, lb)
	})
}
