package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

func TestCheck(t *testing.T) {
	cases := map[string]struct {
		in   string
		want error // nil, ErrInvalid or ErrAmbiguous
	}{
		"object":               {`{"method":"tools/call","params":{"name":"echo","arguments":{}}}`, nil},
		"array of objects":     {`[{"name":"a"},{"name":"b"}]`, nil},
		"same name apart":      {`{"a":{"name":1},"b":{"name":2}}`, nil},
		"scalar":               {`"text"`, nil},
		"whitespace":           {" \t\r\n{}\n", nil},
		"many members":         {manyMembers(40, ""), nil},
		"exact duplicate":      {`{"name":"echo","name":"delete_repository"}`, ErrAmbiguous},
		"case":                 {`{"name":"delete_repository","Name":"echo"}`, ErrAmbiguous},
		"upper":                {`{"method":"a","METHOD":"b"}`, ErrAmbiguous},
		"long s":               {`{"arguments":{},"argument\u017f":{}}`, ErrAmbiguous},
		"long s raw":           {"{\"argumentſ\":{},\"ARGUMENTS\":{}}", ErrAmbiguous},
		"kelvin":               {"{\"kind\":1,\"\u212aind\":2}", ErrAmbiguous},
		"dotless i":            {"{\"action\":1,\"act\u0131on\":2}", ErrAmbiguous},
		"dotted capital I":     {`{"id":1,"\u0130d":2}`, ErrAmbiguous},
		"dotted and dotless":   {"{\"\u0130d\":1,\"\u0131D\":2}", ErrAmbiguous},
		"sharp s not ss":       {"{\"stra\u00dfe\":1,\"strasse\":2}", nil},
		"fullwidth not ascii":  {"{\"name\":1,\"\uff4eame\":2}", nil},
		"zero-width joiner":    {"{\"name\":1,\"na\u200dme\":2}", nil},
		"escaped":              {`{"name":1,"n\u0061me":2}`, ErrAmbiguous},
		"underscore":           {`{"stream_options":{},"streamOptions":{}}`, ErrAmbiguous},
		"hyphen":               {`{"include-usage":true,"include_usage":false}`, ErrAmbiguous},
		"nested":               {`{"params":{"arguments":{"x":1,"X":2}}}`, ErrAmbiguous},
		"in array":             {`[1,{"a":1,"A":2}]`, ErrAmbiguous},
		"many then duplicate":  {manyMembers(40, `,"MXX05":0`), ErrAmbiguous},
		"empty":                {``, ErrInvalid},
		"two values":           {`{} {}`, ErrInvalid},
		"trailing comma":       {`{"a":1,}`, ErrInvalid},
		"invalid utf-8 name":   {"{\"n\xffame\":1}", ErrInvalid},
		"invalid utf-8 string": {"{\"a\":\"\xc3\"}", ErrInvalid},
		"lone surrogate":       {`{"a":"\ud800"}`, ErrInvalid},
		"garbage":              {`{"a":tru}`, ErrInvalid},
		"unclosed":             {`{"a":[1,2}`, ErrInvalid},
		"too deep":             {strings.Repeat("[", 10001) + strings.Repeat("]", 10001), ErrInvalid},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := Check([]byte(tc.in))
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Check = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Check = %v, want %v", err, tc.want)
			}
		})
	}
}

func manyMembers(n int, tail string) string {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"m` + strings.Repeat("x", i%3) + string(rune('0'+i/10)) + string(rune('0'+i%10)) + `":0`)
	}
	b.WriteString(tail + "}")
	return b.String()
}

func TestErrorText(t *testing.T) {
	err := Check([]byte(`{"name":"x","Name":"y"}`))
	if got, want := err.Error(), `members "name" and "Name"`; !strings.Contains(got, want) {
		t.Errorf("error %q does not name %s", got, want)
	}
	err = Check([]byte(`{"a":1,"a":2}`))
	if got, want := err.Error(), `member "a" appears twice`; !strings.Contains(got, want) {
		t.Errorf("error %q does not say %s", got, want)
	}
	// A parse error never quotes the input: it could be an upstream's response.
	err = Check([]byte(`{"a":"sk-canary-123" x}`))
	if strings.Contains(err.Error(), "canary") {
		t.Errorf("error %q quotes the input", err)
	}
	long := strings.Repeat("é", 100)
	err = Check([]byte(`{"` + long + `":1,"` + strings.ToUpper(long) + `":2}`))
	if len(err.Error()) > 400 {
		t.Errorf("error is %d bytes: names are not cut", len(err.Error()))
	}
}

// TestUnmarshalCaseSensitive: a struct field is filled from its exact name only, and a member
// that encoding/json (v1) would match to a field case-insensitively is refused even alone: the
// broker would read the field as absent, a Go server as given.
func TestUnmarshalCaseSensitive(t *testing.T) {
	var call struct {
		Name string `json:"name"`
	}
	body := []byte(`{"Name":"delete_repository"}`)
	if err := json.Unmarshal(body, &call); err != nil || call.Name != "delete_repository" {
		t.Fatalf("encoding/json no longer folds (%v, %q): this test's premise is gone", err, call.Name)
	}
	if err := Unmarshal(body, &call); !errors.Is(err, ErrAmbiguous) || !strings.Contains(err.Error(), `"Name"`) {
		t.Errorf("Unmarshal of a member folding to a field = %v, want ErrAmbiguous naming it", err)
	}
	if err := Unmarshal([]byte(`{"name":"a","Name":"b"}`), &call); !errors.Is(err, ErrAmbiguous) {
		t.Errorf("Unmarshal of colliding members = %v, want ErrAmbiguous", err)
	}
	if err := Unmarshal([]byte(`{"name":7}`), &call); err == nil {
		t.Error("Unmarshal of a number into a string succeeded")
	}
}

// TestUnmarshalFoldedField: a member taken for a field only by folding is refused at any depth
// the struct reads by name; members of maps and raw values are data and pass.
func TestUnmarshalFoldedField(t *testing.T) {
	type params struct {
		Name      string         `json:"name"`
		Arguments map[string]any `json:"arguments"`
		Options   *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		Raw   jsontext.Value `json:"raw"`
		Items []struct {
			ID string `json:"id"`
		} `json:"items"`
	}
	refused := []string{
		`{"ARGUMENTS":{}}`,
		`{"argument\u017f":{}}`,
		"{\"argument\u017f\":{}}",
		`{"\u004eame":"x"}`,
		`{"stream_options":{"Include_Usage":true}}`,
		`{"stream_options":{"includeusage":true}}`,
		`{"stream-options":{}}`,
		`{"items":[{"id":"a"},{"ID":"b"}]}`,
	}
	for _, body := range refused {
		var p params
		if err := Unmarshal([]byte(body), &p); !errors.Is(err, ErrAmbiguous) {
			t.Errorf("%s: %v, want ErrAmbiguous", body, err)
		}
	}
	accepted := []string{
		`{"name":"x","arguments":{"Name":"y","ARGUMENTS":1}}`,
		`{"raw":{"Name":1},"other":{"Name":2}}`,
		`{"items":[{"id":"a","Id2":1}]}`,
		`{"name":"x","nombre":"y"}`,
	}
	for _, body := range accepted {
		var p params
		if err := Unmarshal([]byte(body), &p); err != nil {
			t.Errorf("%s: %v", body, err)
		}
	}
	var k struct {
		Key string `json:"key"`
	}
	if err := Unmarshal([]byte("{\"\u212aey\":\"x\"}"), &k); !errors.Is(err, ErrAmbiguous) {
		t.Errorf("Kelvin sign: %v, want ErrAmbiguous", err)
	}
}

// FuzzCheck: whatever Check accepts, encoding/json accepts too, and decodes to an object with
// as many members as the text has (no member lost to another).
func FuzzCheck(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"a":{"b":[1,{"c":2}]}}`, `{"a":1,"A":2}`, `[]`, `"x"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if Check(b) != nil {
			return
		}
		if !json.Valid(b) {
			t.Fatalf("Check accepted %q, which encoding/json refuses", b)
		}
	})
}

func BenchmarkCheck(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"gpt-4o","stream":true,"messages":[`)
	for i := range 200 {
		if i > 0 {
			sb.WriteString(",")
		}
		sb.WriteString(`{"role":"user","content":"` + strings.Repeat("lorem ipsum dolor sit amet ", 18) + `"}`)
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := Check(body); err != nil {
			b.Fatal(err)
		}
	}
}

// referenceCheck is Check written plainly: a token walk with a map of fold keys per object.
func referenceCheck(b []byte) error {
	dec := jsontext.NewDecoder(bytes.NewReader(b), jsontext.AllowDuplicateNames(true))
	var open []map[string]bool
	for {
		tok, err := dec.ReadToken()
		if err != nil {
			return ErrInvalid
		}
		switch tok.Kind() {
		case '{':
			open = append(open, map[string]bool{})
		case '}':
			open = open[:len(open)-1]
		case '"':
			if kind, n := dec.StackIndex(dec.StackDepth()); kind == '{' && n%2 == 1 {
				key := fold(tok.String())
				if open[len(open)-1][key] {
					return ErrAmbiguous
				}
				open[len(open)-1][key] = true
			}
		}
		if dec.StackDepth() == 0 {
			if _, err := dec.ReadToken(); err != io.EOF {
				return ErrInvalid
			}
			return nil
		}
	}
}

// FuzzCheckAgainstReference: Check, with its arena and pooled state, answers as the plain walk.
func FuzzCheckAgainstReference(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":{"a":2},"A":3}`, `{"a":{"b":1,"B":2}}`, `[{"x":1},{"x":2}]`, `{"\u0061":1,"a":2}`,
		`{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"k":11,"l":12,"m":13,"n":14,"o":15,"p":16,"q":17,"Q":18}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, want := Check(b), referenceCheck(b)
		if !errors.Is(got, want) && !(got == nil && want == nil) {
			t.Fatalf("Check(%q) = %v, reference %v", b, got, want)
		}
	})
}

// TestValue: Value decodes what Check accepts, numbers as their text, and refuses the rest.
func TestValue(t *testing.T) {
	v, err := Value([]byte(` {"a":[1,2.5e1,1e400,12345678901234567890],"b":{"c":"d\u00e9","e":null,"f":true}} `))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"a": []any{json.Number("1"), json.Number("2.5e1"), json.Number("1e400"), json.Number("12345678901234567890")},
		"b": map[string]any{"c": "dé", "e": nil, "f": true}}
	if !reflect.DeepEqual(v, want) {
		t.Errorf("Value = %#v", v)
	}
	if _, err := Value([]byte(`{"a":1,"A":2}`)); !errors.Is(err, ErrAmbiguous) {
		t.Errorf("ambiguous: %v", err)
	}
	if _, err := Value([]byte(`{"a":1,}`)); !errors.Is(err, ErrInvalid) {
		t.Errorf("invalid: %v", err)
	}
}

// TestFoldRuneCoversCaseMappings: two runes that any rune-by-rune case mapping (simple upper,
// lower, title, or an orbit step of simple folding) makes equal have one fold key, for every
// rune; and only "ı" and "İ" fold to ASCII beyond encoding/json's orbit.
func TestFoldRuneCoversCaseMappings(t *testing.T) {
	orbit := func(r rune) rune {
		s := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			s = min(s, f)
		}
		return s
	}
	var beyond []rune
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if 0xD800 <= r && r < 0xE000 {
			continue
		}
		k := foldRune(r)
		for _, m := range []rune{unicode.ToUpper(r), unicode.ToLower(r), unicode.ToTitle(r), unicode.SimpleFold(r)} {
			if foldRune(m) != k {
				t.Fatalf("%U and %U are one letter to a case mapping, fold keys %U and %U", r, m, k, foldRune(m))
			}
		}
		if k < utf8.RuneSelf && orbit(r) != k {
			beyond = append(beyond, r)
		}
	}
	if string(beyond) != "\u0130\u0131" {
		t.Errorf("runes folded to ASCII beyond their orbit: %q, want İ and ı", string(beyond))
	}
}
