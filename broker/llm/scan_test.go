package llm

import (
	"strings"
	"testing"
)

// The skeleton keeps a root's usage and model, and its response's or message's, wherever they
// are, read in pieces of any size: never a member of the same name deeper down or inside a
// string, and every spelling a client might read as one of them.
func TestSkeleton(t *testing.T) {
	cases := map[string]struct {
		text  string
		want  []string // each root's skeleton
		whole bool
	}{
		"usage last":     {`{"model":"m","choices":[{"usage":{"x":1}}],"usage":{"prompt_tokens":1}}`, []string{`{"model":"m","usage":{"prompt_tokens":1}}`}, true},
		"usage first":    {` {"usage" : {"a" : [1, {"b":"}"}]} , "x":[[["usage"]]]}`, []string{`{"usage":{"a":[1,{"b":"}"}]}}`}, true},
		"in a string":    {`{"content":"\"usage\":{\"prompt_tokens\":9}}","model":"m\"x"}`, []string{`{"model":"m\"x"}`}, true},
		"escapes":        {`{"a\\":"\\","usage":1}`, []string{`{"usage":1}`}, true},
		"nested object":  {`{"data":{"usage":{"p":1},"model":"no"}}`, []string{`{}`}, true},
		"response":       {`{"type":"response.completed","response":{"output":[{"usage":2}],"usage":{"input_tokens":3},"model":"m"}}`, []string{`{"type":"response.completed","response":{"usage":{"input_tokens":3},"model":"m"}}`}, true},
		"message":        {`{"type":"message_start","message":{"model":"c","usage":{"input_tokens":3}}}`, []string{`{"type":"message_start","message":{"model":"c","usage":{"input_tokens":3}}}`}, true},
		"array of roots": {`[{"usageMetadata":{"promptTokenCount":1}},{"x":1,"usageMetadata":{"promptTokenCount":2},"modelVersion":"g"}]`, []string{`{"usageMetadata":{"promptTokenCount":1}}`, `{"usageMetadata":{"promptTokenCount":2},"modelVersion":"g"}`}, true},
		"spellings":      {`{"usage":1,"Usage":2,"u_sage":3,"USAGE":4,"\u0075sage":5,"uſage":6,"usages":7}`, []string{`{"usage":1,"Usage":2,"u_sage":3,"USAGE":4,"\u0075sage":5,"uſage":6}`}, true},
		"scalars":        {`{"model":"m","usage":null,"type":true}`, []string{`{"model":"m","usage":null,"type":true}`}, true},
		"cut short":      {`{"model":"m","usage":{"a":1}`, nil, false},
		"two values":     {`{"usage":1}{"usage":2}`, []string{`{"usage":1}`}, false},
		"then a string":  {`{"usage":1} "x"`, []string{`{"usage":1}`}, false},
		"then a number":  {`{"usage":1} 5`, []string{`{"usage":1}`}, false},
		"not json":       {`<html>usage</html>`, nil, false},
		"a string":       {`"usage"`, nil, false},
		"array of other": {`[1,2]`, nil, true}, // whole, but no usage in it
		"long name":      {`{"` + strings.Repeat("_", 300) + `usage":1}`, nil, false},
		"deep":           {strings.Repeat("[", maxDepth+1), nil, false},
		"big usage":      {`{"usage":"` + strings.Repeat("x", maxSkeleton) + `"}`, nil, false},
	}
	for name, c := range cases {
		for _, n := range []int{1, 2, 3, 5, len(c.text)} {
			var got []string
			s := skeleton{root: func(b []byte) { got = append(got, string(b)) }}
			for i := 0; i < len(c.text); i += n {
				s.feed([]byte(c.text[i:min(i+n, len(c.text))]))
			}
			if s.end() != c.whole || (c.whole && strings.Join(got, " | ") != strings.Join(c.want, " | ")) {
				t.Errorf("%s, by %d: %q, whole %v; want %q, %v", name, n, got, s.end(), c.want, c.whole)
			}
		}
	}
}
