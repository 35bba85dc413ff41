package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/open-policy-agent/opa/v1/util"
)

// source is a policy before it is compiled: its Rego modules, its data document and the
// revision that names it. It comes from a directory (readDir) or a bundle (readBundle).
type source struct {
	modules  []module // sorted by name
	data     map[string]any
	revision string
	// tests are the *_test.rego modules, read by readDir only for `broker policy test`.
	tests []module
}

type module struct {
	name string // the file name used in error locations
	raw  []byte
}

// isTest reports whether a .rego file holds tests, which are never loaded at run time.
func isTest(name string) bool { return strings.HasSuffix(name, "_test.rego") }

// isData reports whether a file is a data file (JSON or YAML).
func isData(name string) bool {
	switch path.Ext(name) {
	case ".json", ".yaml", ".yml":
		return true
	}
	return false
}

// walk visits the files in fsys that policies are read from, skipping hidden directories
// (editors' and Kubernetes' ..data-style directories).
func walk(fsys fs.FS, visit func(name string)) error {
	return fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != "." && strings.HasPrefix(d.Name(), ".") {
				return fs.SkipDir
			}
			return nil
		}
		visit(p)
		return nil
	})
}

// DataFiles returns the data files in fsys: *.json, *.yaml and *.yml, outside hidden directories.
func DataFiles(fsys fs.FS) ([]string, error) {
	var names []string
	err := walk(fsys, func(p string) {
		if isData(p) {
			names = append(names, p)
		}
	})
	sort.Strings(names)
	return names, err
}

// readDir reads a policy directory: the *.rego files (with the *_test.rego files apart, when
// withTests), and the data files, each merged into data at its directory's path as OPA's
// loader does (a file at the root merges into data, one at foo/bar.json into data.foo). The
// revision is a hash of every file that is loaded at run time, names and contents.
// display is prefixed to file names in error messages (the directory as the user named it).
func readDir(fsys fs.FS, display string, withTests bool) (*source, error) {
	var regos, tests, datas []string
	err := walk(fsys, func(p string) {
		switch {
		case path.Ext(p) == ".rego" && isTest(p):
			tests = append(tests, p)
		case path.Ext(p) == ".rego":
			regos = append(regos, p)
		case isData(p):
			datas = append(datas, p)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("reading policies: %w", err)
	}
	sort.Strings(regos)
	sort.Strings(tests)
	sort.Strings(datas)
	if len(regos) == 0 {
		return nil, errors.New("no .rego policy files found")
	}
	h := sha256.New()
	src := &source{data: map[string]any{}}
	read := func(name string, hash bool) ([]byte, error) {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", displayName(display, name), err)
		}
		if hash {
			fmt.Fprintf(h, "%s\x00%d\x00", name, len(b))
			h.Write(b)
		}
		return b, nil
	}
	for _, n := range regos {
		b, err := read(n, true)
		if err != nil {
			return nil, err
		}
		src.modules = append(src.modules, module{name: displayName(display, n), raw: b})
	}
	var problems []error
	for _, n := range datas {
		b, err := read(n, true)
		if err != nil {
			return nil, err
		}
		v, err := parseData(displayName(display, n), b)
		if err != nil {
			problems = append(problems, err)
			continue
		}
		var at []string
		if dir := path.Dir(n); dir != "." {
			at = strings.Split(dir, "/")
		}
		if err := mergeAt(src.data, at, v, displayName(display, n)); err != nil {
			problems = append(problems, err)
		}
	}
	if len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	if withTests {
		for _, n := range tests {
			b, err := read(n, false)
			if err != nil {
				return nil, err
			}
			src.tests = append(src.tests, module{name: displayName(display, n), raw: b})
		}
	}
	src.revision = hex.EncodeToString(h.Sum(nil))[:12]
	return src, nil
}

func displayName(display, name string) string {
	if display == "" || display == "." {
		return name
	}
	return path.Join(strings.TrimSuffix(display, "/"), name)
}

var yamlLineRe = regexp.MustCompile(`line (\d+)`)

// parseData parses a JSON or YAML data file. Errors name the file and, where the parser
// says, the line.
func parseData(name string, b []byte) (any, error) {
	var v any
	if path.Ext(name) == ".json" {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		err := dec.Decode(&v)
		if err == nil {
			if _, extra := dec.Token(); extra != io.EOF {
				err = errors.New("more than one JSON value")
			}
		}
		if err != nil {
			var se *json.SyntaxError
			if errors.As(err, &se) {
				return nil, fmt.Errorf("%s:%d: invalid JSON: %v", name, lineOf(b, se.Offset), err)
			}
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				return nil, fmt.Errorf("%s:%d: invalid JSON: %v", name, lineOf(b, te.Offset), err)
			}
			return nil, fmt.Errorf("%s:%d: invalid JSON: %v", name, lineOf(b, int64(len(b))), err)
		}
		return v, nil
	}
	if err := util.Unmarshal(b, &v); err != nil {
		line := 1
		if m := yamlLineRe.FindStringSubmatch(err.Error()); m != nil {
			line, _ = strconv.Atoi(m[1])
		}
		return nil, fmt.Errorf("%s:%d: invalid YAML: %v", name, line, err)
	}
	return v, nil
}

func lineOf(b []byte, offset int64) int {
	if offset > int64(len(b)) {
		offset = int64(len(b))
	}
	return bytes.Count(b[:offset], []byte("\n")) + 1
}

// mergeAt merges v into data at the path at. Objects merge key by key; any other value
// meeting an existing one is a conflict, named by its data path.
func mergeAt(data map[string]any, at []string, v any, file string) error {
	for i := len(at) - 1; i >= 0; i-- {
		v = map[string]any{at[i]: v}
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("%s:1: a data file at the root of the policy directory must hold an object", file)
	}
	return mergeObjects(data, obj, "data", file)
}

func mergeObjects(dst, src map[string]any, where, file string) error {
	keys := make([]string, 0, len(src))
	for k := range src {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		sv := src[k]
		dv, exists := dst[k]
		if !exists {
			dst[k] = sv
			continue
		}
		dm, dok := dv.(map[string]any)
		sm, sok := sv.(map[string]any)
		if !dok || !sok {
			return fmt.Errorf("%s:1: %s.%s is already defined by another data file", file, where, k)
		}
		if err := mergeObjects(dm, sm, where+"."+k, file); err != nil {
			return err
		}
	}
	return nil
}
