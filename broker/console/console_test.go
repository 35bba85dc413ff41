package console

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/net/html"
)

func get(t *testing.T, method, path string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	Handler().ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	return rec.Result()
}

func TestHandlerServesFilesWithStrictHeaders(t *testing.T) {
	cases := map[string]struct {
		method, path string
		status       int
		ctype        string
		location     string
	}{
		"index":          {"GET", "/console/", 200, "text/html; charset=utf-8", ""},
		"no slash":       {"GET", "/console", 301, "", "/console/"},
		"script":         {"GET", "/console/app.js", 200, "text/javascript; charset=utf-8", ""},
		"style":          {"GET", "/console/app.css", 200, "text/css; charset=utf-8", ""},
		"icon":           {"GET", "/console/icon.svg", 200, "image/svg+xml", ""},
		"head":           {"HEAD", "/console/app.js", 200, "text/javascript; charset=utf-8", ""},
		"missing":        {"GET", "/console/nope.js", 404, "", ""},
		"sub-folder":     {"GET", "/console/static/app.js", 404, "", ""},
		"embed root":     {"GET", "/console/static", 404, "", ""},
		"post":           {"POST", "/console/", 405, "", ""},
		"outside prefix": {"GET", "/api/status", 404, "", ""},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			resp := get(t, c.method, c.path)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
			}
			if c.ctype != "" && resp.Header.Get("Content-Type") != c.ctype {
				t.Errorf("Content-Type %q, want %q", resp.Header.Get("Content-Type"), c.ctype)
			}
			if c.location != "" && resp.Header.Get("Location") != c.location {
				t.Errorf("Location %q, want %q", resp.Header.Get("Location"), c.location)
			}
			// Every answer, errors too, carries the policy: an error page is a page as well.
			for k, want := range map[string]string{
				"Content-Security-Policy": ContentSecurityPolicy,
				"X-Content-Type-Options":  "nosniff",
				"X-Frame-Options":         "DENY",
				"Referrer-Policy":         "no-referrer",
			} {
				if got := resp.Header.Get(k); got != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
		})
	}
}

func TestContentSecurityPolicyIsStrict(t *testing.T) {
	for _, want := range []string{"default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "object-src 'none'"} {
		if !strings.Contains(ContentSecurityPolicy, want) {
			t.Errorf("CSP lacks %q", want)
		}
	}
	for _, bad := range []string{"unsafe-inline", "unsafe-eval", "http:", "https:", "data:", "*"} {
		if strings.Contains(ContentSecurityPolicy, bad) {
			t.Errorf("CSP allows %q", bad)
		}
	}
}

// The page must work under the CSP (no inline script, handler or style) and load nothing
// from elsewhere (the admin network may have no internet).
func TestIndexHasNoInlineCodeOrRemoteResources(t *testing.T) {
	body, _ := io.ReadAll(get(t, "GET", "/console/").Body)
	doc, err := html.Parse(strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	scripts := 0
	var walk func(n *html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			if n.Data == "style" {
				t.Errorf("inline <style> element")
			}
			if n.Data == "script" {
				scripts++
				if n.FirstChild != nil {
					t.Errorf("inline script content %q", n.FirstChild.Data)
				}
			}
			for _, a := range n.Attr {
				switch {
				case strings.HasPrefix(a.Key, "on"):
					t.Errorf("<%s %s>: inline event handler", n.Data, a.Key)
				case a.Key == "style":
					t.Errorf("<%s style>: inline style", n.Data)
				case a.Key == "src" || a.Key == "href" || a.Key == "action":
					if strings.Contains(a.Val, ":") || strings.HasPrefix(a.Val, "//") || strings.HasPrefix(a.Val, "/") {
						t.Errorf("<%s %s=%q>: not one of the console's own files", n.Data, a.Key, a.Val)
					}
				}
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	if scripts != 1 {
		t.Errorf("%d script elements, want 1 (app.js)", scripts)
	}
}

// Agents control much of what the console shows: the script must never parse it as HTML.
func TestScriptUsesNoHTMLSinks(t *testing.T) {
	for _, name := range []string{"app.js", "app.css"} {
		b, err := static.ReadFile("static/" + name)
		if err != nil {
			t.Fatal(err)
		}
		sinks := regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|setHTML|createContextualFragment|DOMParser|https?://|@import|url\(`)
		for i, line := range strings.Split(string(b), "\n") {
			if m := sinks.FindString(line); m != "" {
				t.Errorf("%s:%d uses %q: %s", name, i+1, m, strings.TrimSpace(line))
			}
		}
	}
}
