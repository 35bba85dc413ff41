package github

import (
	"net/http"
	"strings"

	"github.com/capbroker/capbroker/credentials"
)

// Inject puts tok on req as GitHub expects it: Basic x-access-token:<token> for git's
// smart-HTTP protocol (git sends Basic auth only), Authorization: Bearer for the API. Either
// replaces any Authorization the agent sent.
func (a *App) Inject(req *http.Request, tok credentials.Secret) {
	if IsGitRequest(req) {
		req.SetBasicAuth("x-access-token", tok.Reveal())
		return
	}
	req.Header.Set("Authorization", "Bearer "+tok.Reveal())
}

// IsGitRequest reports whether req belongs to git's smart-HTTP protocol: the ref
// advertisement (/info/refs?service=git-upload-pack or git-receive-pack) or a pack exchange
// (/git-upload-pack, /git-receive-pack), or Git LFS (<repo>.git/info/lfs/...).
func IsGitRequest(req *http.Request) bool {
	p := req.URL.Path
	switch {
	case strings.HasSuffix(p, "/git-upload-pack"), strings.HasSuffix(p, "/git-receive-pack"):
		return true
	case strings.Contains(p, ".git/info/lfs/"):
		return true // Git LFS's batch API, which git-lfs calls with git's credentials
	case strings.HasSuffix(p, "/info/refs"):
		// As url.Values would read it, without building them on every request.
		for rest := req.URL.RawQuery; rest != ""; {
			var kv string
			kv, rest, _ = strings.Cut(rest, "&")
			if k, v, _ := strings.Cut(kv, "="); k == "service" {
				return v == "git-upload-pack" || v == "git-receive-pack"
			}
		}
	}
	return false
}
