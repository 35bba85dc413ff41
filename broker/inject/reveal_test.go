package inject

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/scrub"
	"github.com/capbroker/capbroker/credentials"
)

// revealSecrets are secrets of the shapes keys have: unreserved characters only (most API
// keys), a base64 alphabet (AWS secret keys), the characters JSON encoders escape, non-ASCII.
var revealSecrets = []string{
	"sk-canary-0123456789abcdef01234567",
	"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY+x=",
	`pw-<0123456789>&'abcdefghij"\/end`,
	"clé-0123456789abcdef-ünïcode-😀-tail",
}

// reflections are the ways an upstream reflects a text holding the secret: each takes the
// text and returns what the upstream writes.
var reflections = map[string]func(string) string{
	"raw":                   func(s string) string { return s },
	"QueryEscape":           url.QueryEscape,
	"PathEscape":            url.PathEscape,
	"QueryEscape lowercase": func(s string) string { return lowerEscapes(url.QueryEscape(s)) },
	"encodeURIComponent":    encodeURIComponent,
	"Python quote":          func(s string) string { return strings.ReplaceAll(url.QueryEscape(s), "%2F", "/") },
	"base64 std":            func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) },
	"base64 url":            func(s string) string { return base64.URLEncoding.EncodeToString([]byte(s)) },
	"base64 raw std":        func(s string) string { return base64.RawStdEncoding.EncodeToString([]byte(s)) },
	"base64 raw url":        func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) },
	"hex":                   func(s string) string { return hex.EncodeToString([]byte(s)) },
	"HEX":                   func(s string) string { return strings.ToUpper(hex.EncodeToString([]byte(s))) },
	"Go JSON":               func(s string) string { b, _ := json.Marshal(map[string]string{"v": s}); return string(b) },
	"JS JSON":               jsJSON,
	"PHP JSON":              func(s string) string { return strings.ReplaceAll(asciiJSON(jsJSON(s)), "/", `\/`) },
	"Python JSON":           func(s string) string { return asciiJSON(jsJSON(s)) },
	"Gson": func(s string) string {
		return strings.NewReplacer("<", `\u003c`, ">", `\u003e`, "&", `\u0026`, "=", `\u003d`, "'", `\u0027`).Replace(jsJSON(s))
	},
}

func lowerEscapes(s string) string {
	return regexp.MustCompile(`%[0-9A-F]{2}`).ReplaceAllStringFunc(s, strings.ToLower)
}

func encodeURIComponent(s string) string {
	e := url.QueryEscape(s)
	for _, c := range "!'()*" {
		e = strings.ReplaceAll(e, fmt.Sprintf("%%%02X", c), string(c))
	}
	return strings.ReplaceAll(e, "+", "%20")
}

// jsJSON is JSON.stringify's: only ", \ and control characters escaped.
func jsJSON(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(map[string]string{"v": s})
	return strings.TrimSpace(b.String())
}

// TestRevealsScrubEveryReflection: a response holding the secret, or the value a binding
// sends, in any of the reflections, at any offset in a longer text, is scrubbed so that no
// 6 bytes of the secret can be read back from it, however the agent decodes what is left.
func TestRevealsScrubEveryReflection(t *testing.T) {
	s := set()
	for _, name := range []string{"hdr", "key", "q", "basic", "ph"} {
		b := s.byName[name]
		for _, v := range revealSecrets {
			r := redactor(b.Reveals(credentials.NewSecret(v)))
			texts := map[string]string{"wire": b.wire(v)}
			for _, pre := range []string{"", "a", "ab", "abc"} {
				texts["after "+strconv.Quote(pre)] = pre + v + "!tail"
			}
			for how, reflect := range reflections {
				for where, text := range texts {
					out := r.String("<" + reflect(text) + ">")
					if leak := leaks(out, v); leak != "" {
						t.Errorf("%s, %q, %s of %s: %s can be read from %q", name, v, how, where, leak, out)
					}
				}
			}
		}
	}
}

func redactor(forms []string) *scrub.Replacer {
	var pairs []string
	for _, f := range forms {
		pairs = append(pairs, f, "[REDACTED]")
	}
	return scrub.New(pairs...)
}

// leaks returns which 6 bytes of v can be read from out, decoded as each reflection could
// be: as it is, percent- or JSON-unescaped, and from every run of base64 or hex characters at
// every offset. It is the agent's side, written without the forms.
func leaks(out, v string) string {
	var decoded []string
	decoded = append(decoded, out)
	if u, err := url.QueryUnescape(lowerEscapes(out)); err == nil {
		decoded = append(decoded, u)
	}
	if u, err := url.PathUnescape(out); err == nil {
		decoded = append(decoded, u)
	}
	var j string
	if json.Unmarshal([]byte(`"`+strings.Trim(out, "<>")+`"`), &j) == nil {
		decoded = append(decoded, j)
	}
	if m := regexp.MustCompile(`\{"v":"(.*)"\}`).FindStringSubmatch(out); m != nil {
		if json.Unmarshal([]byte(`"`+m[1]+`"`), &j) == nil {
			decoded = append(decoded, j)
		}
	}
	for _, run := range regexp.MustCompile(`[A-Za-z0-9+/_-]{8,}`).FindAllString(out, -1) {
		std := strings.NewReplacer("-", "+", "_", "/").Replace(run)
		for off := range 4 {
			s := std[off:]
			s = s[:len(s)/4*4]
			if d, err := base64.StdEncoding.DecodeString(s); err == nil {
				decoded = append(decoded, string(d))
			}
		}
	}
	for _, run := range regexp.MustCompile(`[0-9a-fA-F]{8,}`).FindAllString(out, -1) {
		for off := range 2 {
			s := run[off:]
			if d, err := hex.DecodeString(s[:len(s)/2*2]); err == nil {
				decoded = append(decoded, string(d))
			}
		}
	}
	for i := 0; i+6 <= len(v); i++ {
		for _, d := range decoded {
			if strings.Contains(d, v[i:i+6]) {
				return strconv.Quote(v[i : i+6])
			}
		}
	}
	return ""
}

// TestRevealsIsBoundedAndCached: the forms of a value are computed once, are few even for a
// key full of special characters, and follow a rotation.
func TestRevealsIsBoundedAndCached(t *testing.T) {
	b := set().byName["hdr"]
	worst := `!"#$%&'()*+,/:;<=>?@[\]^` + "`{|}0123456789abcdefghijklmnopqrstuvwxyz"
	for _, v := range append(revealSecrets, worst) {
		if n := len(b.Reveals(credentials.NewSecret(v))); n > 40 {
			t.Errorf("%q has %d forms", v, n)
		}
	}
	one := b.Reveals(credentials.NewSecret("sk-one-0123456789"))
	if again := b.Reveals(credentials.NewSecret("sk-one-0123456789")); &again[0] != &one[0] {
		t.Error("the forms of the same value were computed again")
	}
	if two := b.Reveals(credentials.NewSecret("sk-two-0123456789")); two[0] != "sk-two-0123456789" {
		t.Errorf("a rotated value's forms start %q", two[0])
	}
	for i := range 2 * maxRevealed {
		b.Reveals(credentials.NewSecret(fmt.Sprint("sk-many-", i)))
	}
	if n := len(*b.revealed.Load()); n > maxRevealed {
		t.Errorf("the cache holds %d values", n)
	}
	if b.Reveals(credentials.Secret{}) != nil {
		t.Error("an empty secret has forms")
	}
}

// TestRevealsNoShortForms: a derived form shorter than minForm would redact ordinary text.
func TestRevealsNoShortForms(t *testing.T) {
	b := NewSet([]config.Credential{{Name: "x", Hosts: []string{"h"}, Inject: config.Inject{Header: "X-K", Value: "{{secret}}"}}}).byName["x"]
	for _, f := range b.Reveals(credentials.NewSecret("k/y")) {
		if f != "k/y" && len(f) < minForm {
			t.Errorf("form %q", f)
		}
	}
}
