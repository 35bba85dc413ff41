// Package console is the web console on the admin listener: a person watches decisions stream
// in, approves or denies held requests, and revokes grants (docs/console.md). It is static
// files only, embedded in the binary, talking to the admin API under /api/ from the same
// origin; nothing is fetched from elsewhere, so it works on an admin network without internet.
//
// Every value shown comes from the API and, through it, from agents (paths, headers, bodies):
// the script only ever sets text (textContent, never innerHTML), and the Content-Security-
// Policy allows scripts from the console's own files only, so an injected tag is inert twice.
package console

import (
	"embed"
	"net/http"
	"strings"
)

//go:embed static
var static embed.FS

// ContentSecurityPolicy is sent with every console response: the console's own files only, no
// inline script or style, no framing (clickjacking an Approve button), no form posts elsewhere.
const ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Handler serves the console under /console/ (and redirects /console there). Mount it on the
// admin listener's mux at "/console" and "/console/"; it answers GET and HEAD only.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cache-Control", "no-cache")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Path == "/console" {
			http.Redirect(w, r, "/console/", http.StatusMovedPermanently)
			return
		}
		name, ok := strings.CutPrefix(r.URL.Path, "/console/")
		if !ok || strings.Contains(name, "/") {
			http.NotFound(w, r) // the console is flat: no sub-folders, no directory listings
			return
		}
		if name == "" {
			name = "index.html"
		}
		http.ServeFileFS(w, r, static, "static/"+name)
	})
}
