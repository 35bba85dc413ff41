package policy

import (
	"encoding/json"
	"strings"
	"testing"
)

// jsonTexts are texts at the edges of the JSON grammar, valid and not.
var jsonTexts = []string{
	``, ` `, `{}`, `[]`, ` { } `, `[ ]`, `{"a":1}`, `{"a":1,}`, `{,}`, `[1,]`, `[,1]`, `[1 2]`, `{"a" 1}`, `{"a":}`,
	`{a:1}`, `{"a":1 "b":2}`, `{"a":[1,{"b":null}],"c":"d"}`, `{"a":1]`, `[1}`, `]`, `}`, `[`, `{`, `{"a":1}}`,
	`0`, `-0`, `01`, `-01`, `1.`, `.5`, `1.5`, `1e5`, `1E+5`, `1e-5`, `1e`, `1e+`, `-`, `+1`, `0x10`, `1.5e3.2`,
	`-1.0e-0`, `123456789012345678901234567890`, `NaN`, `Infinity`,
	`true`, `false`, `null`, `tru`, `nul`, `truex`, `True`, `[true,false,null]`, `nullnull`, `1 2`, `"a" "b"`,
	`""`, `"a"`, `"\""`, `"\\"`, `"\/"`, `"\b\f\n\r\t"`, `"\u00e9"`, `"\u00E9"`, `"\u00g9"`, `"\u00"`, `"\x"`,
	`"\`, `"abc`, `"\ud800"`, "\"tab\there\"", "\"nl\nhere\"", "\"\x00\"", "\"\x1f\"", "\"\x7f\"",
	"\"\xff\xfe\"", "\"caf\xc3\xa9\"", "\xef\xbb\xbf{}", "{}\x00", " \t\r\n[\n1\r,\t2 ]\n ", "\v1", "1\f",
	`{"a":{"b":{"c":[[[[]]]]}}}`, `[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]`, `[[[`, `]]]`, `{"":""}`, `{"a":"b",}`,
}

func TestValidJSONIsJSONValid(t *testing.T) {
	texts := append([]string{}, jsonTexts...)
	texts = append(texts, bodyTexts...)
	// encoding/json's depth limit, on both sides of it, with containers empty and not.
	for _, depth := range []int{maxNestingDepth - 1, maxNestingDepth, maxNestingDepth + 1} {
		texts = append(texts,
			strings.Repeat("[", depth)+strings.Repeat("]", depth),
			strings.Repeat(`{"a":`, depth-1)+"{}"+strings.Repeat("}", depth-1),
			strings.Repeat("[", depth)+"1"+strings.Repeat("]", depth))
	}
	for _, text := range texts {
		if got, want := validJSON([]byte(text)), json.Valid([]byte(text)); got != want {
			t.Errorf("validJSON(%.80q) = %v, json.Valid %v", text, got, want)
		}
	}
}

// FuzzValidJSON checks validJSON against json.Valid on arbitrary text
// (go test -fuzz FuzzValidJSON ./broker/policy/).
func FuzzValidJSON(f *testing.F) {
	for _, text := range append(jsonTexts, bodyTexts...) {
		f.Add(text)
	}
	f.Fuzz(func(t *testing.T, text string) {
		if got, want := validJSON([]byte(text)), json.Valid([]byte(text)); got != want {
			t.Fatalf("validJSON(%q) = %v, json.Valid %v", text, got, want)
		}
	})
}
