package github

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/capbroker/capbroker/credentials"
)

// levels orders GitHub's permission levels: a token may hold a permission at or below what
// was asked, never above.
var levels = map[string]int{"read": 1, "write": 2, "admin": 3}

// implied are permissions GitHub adds to every installation token whatever was asked
// (metadata is mandatory for an App). They are not counted as a wider scope.
var implied = map[string]string{"metadata": "read"}

// scope is a decision's grant narrowed to what GitHub understands. Nil slices/maps mean "not
// narrowed": the installation's default.
type scope struct {
	repos []string          // repository names, sorted, as the policy wrote them
	perms map[string]string // permission name -> read|write|admin
	key   string            // canonical form: equal for equal scopes however they were written
}

// errScope is a grant scope this credential cannot honour: a policy mistake. It fails the
// request closed, like any unavailable credential.
var errScope = errors.New("github_app scope")

func scopeErr(format string, args ...any) error {
	return fmt.Errorf("%w: %w: %s", credentials.ErrUnavailable, errScope, fmt.Sprintf(format, args...))
}

// parseScope reads a decision's scope: {"repositories": [names], "permissions": {name: level}}.
// Anything else in it is refused: a misspelt key must not widen the token to the
// installation's default.
func parseScope(s credentials.Scope) (scope, error) {
	var out scope
	for k, v := range s {
		switch k {
		case "repositories":
			repos, err := parseRepos(v)
			if err != nil {
				return scope{}, err
			}
			out.repos = repos
		case "permissions":
			perms, err := parsePerms(v)
			if err != nil {
				return scope{}, err
			}
			out.perms = perms
		default:
			return scope{}, scopeErr("unknown key %q (repositories, permissions)", k)
		}
	}
	out.key = canonical(out)
	return out, nil
}

// appendKey appends to dst the canonical key of a decision's scope, as parseScope computes
// it, without building the scope or allocating: the per-request path looks cached tokens up
// by it. ok is false when the scope is not one appendKey reads quickly (then parseScope
// decides, and says what is wrong).
func appendKey(dst []byte, s credentials.Scope) (key []byte, ok bool) {
	var repoBuf, permBuf [8]string
	repos, perms := repoBuf[:0], permBuf[:0]
	var pm map[string]any
	hasRepos := false
	for k, v := range s {
		switch k {
		case "repositories":
			hasRepos = true
			l, isList := v.([]any)
			if !isList || len(l) == 0 {
				return dst, false
			}
			for _, x := range l {
				n, isStr := x.(string)
				if !isStr || n == "" || strings.ContainsAny(n, "/ \t\r\n") {
					return dst, false
				}
				repos = append(repos, strings.ToLower(n))
			}
		case "permissions":
			m, isMap := v.(map[string]any)
			if !isMap || len(m) == 0 {
				return dst, false
			}
			for name, x := range m {
				l, isStr := x.(string)
				if !isStr || levels[l] == 0 || name == "" || strings.ContainsAny(name, " \t\r\n\"") {
					return dst, false
				}
				perms = append(perms, name)
			}
			pm = m
		default:
			return dst, false
		}
	}
	b := dst
	if hasRepos {
		slices.Sort(repos)
		repos = slices.Compact(repos)
		b = append(b, "r="...)
		for i, r := range repos {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, r...)
		}
	}
	b = append(b, ';')
	slices.Sort(perms)
	for i, name := range perms {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, name...)
		b = append(b, ':')
		b = append(b, pm[name].(string)...)
	}
	return b, true
}

func parseRepos(v any) ([]string, error) {
	var names []string
	switch l := v.(type) {
	case []string:
		names = slices.Clone(l)
	case []any:
		for _, x := range l {
			n, ok := x.(string)
			if !ok {
				return nil, scopeErr("repositories must be a list of names")
			}
			names = append(names, n)
		}
	default:
		return nil, scopeErr("repositories must be a list of names")
	}
	if len(names) == 0 {
		return nil, scopeErr("repositories must not be empty (leave it out for the installation's repositories)")
	}
	for _, n := range names {
		if n == "" || strings.ContainsAny(n, "/ \t\r\n") {
			return nil, scopeErr("repository %q must be a bare name, without the owner", n)
		}
	}
	sort.Strings(names)
	return slices.Compact(names), nil
}

func parsePerms(v any) (map[string]string, error) {
	out := map[string]string{}
	switch m := v.(type) {
	case map[string]string:
		for k, l := range m {
			out[k] = l
		}
	case map[string]any:
		for k, x := range m {
			l, ok := x.(string)
			if !ok {
				return nil, scopeErr("permission %q must be read, write or admin", k)
			}
			out[k] = l
		}
	default:
		return nil, scopeErr("permissions must be an object of name: read|write|admin")
	}
	if len(out) == 0 {
		return nil, scopeErr("permissions must not be empty (leave it out for the installation's permissions)")
	}
	for k, l := range out {
		if k == "" || strings.ContainsAny(k, " \t\r\n\"") {
			return nil, scopeErr("permission name %q is not valid", k)
		}
		if levels[l] == 0 {
			return nil, scopeErr("permission %q must be read, write or admin", k)
		}
	}
	return out, nil
}

// canonical is the cache key of a scope. Repository names are compared as GitHub does,
// without regard to case.
func canonical(s scope) string {
	var b strings.Builder
	if s.repos != nil {
		lower := make([]string, len(s.repos))
		for i, r := range s.repos {
			lower[i] = strings.ToLower(r)
		}
		sort.Strings(lower)
		b.WriteString("r=" + strings.Join(slices.Compact(lower), ","))
	}
	b.WriteString(";")
	if s.perms != nil {
		names := make([]string, 0, len(s.perms))
		for k := range s.perms {
			names = append(names, k)
		}
		sort.Strings(names)
		for i, k := range names {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(k + ":" + s.perms[k])
		}
	}
	return b.String()
}

// body is the JSON request for a token with this scope (nil fields are left out, asking for
// the installation's default).
func (s scope) body() map[string]any {
	m := map[string]any{}
	if s.repos != nil {
		m["repositories"] = s.repos
	}
	if s.perms != nil {
		m["permissions"] = s.perms
	}
	return m
}

// within reports whether what GitHub granted is no wider than s. It names what is wider, never
// a value.
func (s scope) within(perms map[string]string, selection string, repos []string) error {
	if s.perms != nil {
		for k, got := range perms {
			want, asked := s.perms[k]
			if !asked {
				if implied[k] != "" && levels[got] <= levels[implied[k]] {
					continue
				}
				return fmt.Errorf("permission %s was not asked for", k)
			}
			if levels[got] == 0 || levels[got] > levels[want] {
				return fmt.Errorf("permission %s is wider than %s", k, want)
			}
		}
	}
	if s.repos != nil {
		if selection != "selected" {
			return fmt.Errorf("repository selection is %q, not the repositories asked for", selection)
		}
		for _, r := range repos {
			if !slices.ContainsFunc(s.repos, func(w string) bool { return strings.EqualFold(w, r) }) {
				return errors.New("a repository was not asked for")
			}
		}
	}
	return nil
}
