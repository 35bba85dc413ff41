package config

import (
	"bytes"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// referenceDoc is the configuration reference users read.
const referenceDoc = "../../docs/configuration.md"

// TestReferenceMatchesCode: every key the configuration reference shows exists in Config, and
// every key of Config is shown in the reference, set or in a comment as an alternative.
func TestReferenceMatchesCode(t *testing.T) {
	doc, err := os.ReadFile(referenceDoc)
	if err != nil {
		t.Fatal(err)
	}
	blocks := yamlBlocks(string(doc))
	if len(blocks) == 0 {
		t.Fatalf("%s has no yaml block", referenceDoc)
	}
	shown := map[string]bool{} // key names the reference shows, set or as commented alternatives
	for _, b := range blocks {
		// The keys it sets: decoded as the broker decodes a file, unknown keys refused.
		dec := yaml.NewDecoder(bytes.NewReader([]byte(b)))
		dec.KnownFields(true)
		var c Config
		if err := dec.Decode(&c); err != nil {
			t.Errorf("the reference's example is not a valid config: %v", err)
		}
		var n yaml.Node
		if err := yaml.Unmarshal([]byte(b), &n); err != nil {
			t.Fatal(err)
		}
		collectKeys(&n, reflect.TypeOf(Config{}), shown)
		// The keys it names in comments (`# or token_file`, `# bundle: {url: ...}`).
		for _, k := range commentKeys(b) {
			shown[k] = true
		}
	}
	code := map[string]bool{}
	fieldNames(reflect.TypeOf(Config{}), code)
	for k := range shown {
		if !code[k] {
			t.Errorf("the reference shows key %q, which the config does not have", k)
		}
	}
	var missing []string
	for k := range code {
		if !shown[k] && !strings.Contains(string(doc), "`"+k+"`") {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("config keys the reference never mentions: %v", missing)
	}
}

// yamlBlocks returns the text of every ```yaml block in doc.
func yamlBlocks(doc string) []string {
	var out []string
	for rest := doc; ; {
		_, after, ok := strings.Cut(rest, "```yaml\n")
		if !ok {
			return out
		}
		block, tail, _ := strings.Cut(after, "```")
		out = append(out, block)
		rest = tail
	}
}

// collectKeys adds the keys of n, a document or node of Go type t, to into: the names of
// struct fields, not the keys of maps (agents' labels, say).
func collectKeys(n *yaml.Node, t reflect.Type, into map[string]bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			collectKeys(c, t, into)
		}
	case yaml.SequenceNode:
		if t.Kind() == reflect.Slice {
			for _, c := range n.Content {
				collectKeys(c, t.Elem(), into)
			}
		}
	case yaml.MappingNode:
		if t.Kind() != reflect.Struct {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			name := n.Content[i].Value
			into[name] = true
			if f, ok := fieldByTag(t, name); ok {
				collectKeys(n.Content[i+1], f.Type, into)
			}
		}
	}
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag == name {
			return t.Field(i), true
		}
	}
	return reflect.StructField{}, false
}

// commentKey finds a key a comment offers as an alternative: "# bundle: {...}",
// "# or  query: api_key", "# or token_file", "# or role_id_env".
var (
	commentKeyLine = regexp.MustCompile(`#\s+(?:or\s+)?([a-z_]+):(.*)$`)
	flowKey        = regexp.MustCompile(`([a-z_]+):`)
	orName         = regexp.MustCompile(`\bor\s+([a-z][a-z0-9]*_[a-z0-9_]+)\b`)
)

func commentKeys(block string) []string {
	var out []string
	for _, line := range strings.Split(block, "\n") {
		_, comment, ok := strings.Cut(line, "#")
		if !ok {
			continue
		}
		comment = "#" + comment
		if m := commentKeyLine.FindStringSubmatch(comment); m != nil && m[1] != "true" && m[1] != "false" {
			out = append(out, m[1])
			if rest := strings.TrimSpace(m[2]); strings.HasPrefix(rest, "{") {
				for _, k := range flowKey.FindAllStringSubmatch(rest, -1) {
					if k[1] != "https" && k[1] != "http" {
						out = append(out, k[1])
					}
				}
			}
		}
		for _, m := range orName.FindAllStringSubmatch(comment, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// fieldNames adds the yaml names of t's fields, and of the structs within, to into.
func fieldNames(t reflect.Type, into map[string]bool) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t.PkgPath() != reflect.TypeOf(Config{}).PkgPath() {
		return
	}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		into[name] = true
		fieldNames(f.Type, into)
	}
}
