package gitssh

import (
	"errors"
	"strings"
	"unicode/utf8"
)

// Services: what git does over SSH, as input.ssh.service names it.
const (
	ServiceFetch   = "fetch"
	ServicePush    = "push"
	ServiceArchive = "archive"
)

// programs are the only commands an agent may run, by the service each is.
var programs = map[string]string{
	"git-upload-pack":    ServiceFetch,
	"git-receive-pack":   ServicePush,
	"git-upload-archive": ServiceArchive,
}

// maxRepository bounds a repository path.
const maxRepository = 1024

// errBadCommand is refused with its text shown to the agent.
var errBadCommand = errors.New("only git-upload-pack, git-receive-pack and git-upload-archive with one quoted repository are allowed")

// command is an exec request read as git-shell reads it.
type command struct {
	program    string // git-upload-pack, git-receive-pack or git-upload-archive
	service    string // fetch, push or archive
	repository string // normalised: no leading "/", no empty, "." or ".." segment
}

// parseCommand reads an exec request's command line as git-shell does (git's shell.c and
// quote.c sq_dequote): "git-upload-pack 'path'" or "git upload-pack 'path'", the path one
// single-quoted word in which a quote or "!" is written '\” or '\!', and not starting with
// "-". Then the path is normalised (normaliseRepository). Anything else is errBadCommand.
func parseCommand(line string) (command, error) {
	if !utf8.ValidString(line) || strings.ContainsFunc(line, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return command{}, errBadCommand
	}
	// git-shell turns "git foo" into "git-foo" (any white space after "git").
	if len(line) > 3 && line[:3] == "git" && line[3] == ' ' {
		line = "git-" + line[4:]
	}
	prog, arg, ok := strings.Cut(line, " ")
	service, known := programs[prog]
	if !ok || !known {
		return command{}, errBadCommand
	}
	path, ok := sqDequote(arg)
	if !ok || strings.HasPrefix(path, "-") {
		return command{}, errBadCommand
	}
	repo, err := normaliseRepository(path)
	if err != nil {
		return command{}, err
	}
	return command{program: prog, service: service, repository: repo}, nil
}

// sqDequote undoes git's sq_quote: one word in single quotes, where a quote or "!" outside
// the quotes, backslashed and followed by a reopening quote, stands for itself.
func sqDequote(s string) (string, bool) {
	if !strings.HasPrefix(s, "'") {
		return "", false
	}
	var b strings.Builder
	i := 1
	for {
		j := strings.IndexByte(s[i:], '\'')
		if j < 0 {
			return "", false // no closing quote
		}
		b.WriteString(s[i : i+j])
		i += j + 1 // past the closing quote
		if i == len(s) {
			return b.String(), true
		}
		if i+2 < len(s) && s[i] == '\\' && (s[i+1] == '\'' || s[i+1] == '!') && s[i+2] == '\'' {
			b.WriteByte(s[i+1])
			i += 3
			continue
		}
		return "", false
	}
}

// sqQuote is git's sq_quote: the word in single quotes, a quote or "!" as '\” or '\!'.
func sqQuote(s string) string {
	var b strings.Builder
	b.WriteByte('\'')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '\'' || c == '!' {
			b.WriteString("'\\")
			b.WriteByte(c)
			b.WriteByte('\'')
			continue
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('\'')
	return b.String()
}

// errBadRepository is refused with its text shown to the agent.
var errBadRepository = errors.New("the repository path must be relative segments (org/repo.git): no empty, \".\" or \"..\" segment, no backslash, no \"~\"")

// normaliseRepository is the repository as the policy sees it and the upstream is asked for:
// one leading "/" dropped (ssh://host/org/repo.git and host:org/repo.git name the same
// repository, as on GitHub and GitLab), then segments that are neither empty, "." nor "..".
// A path is never absolute upstream, so it cannot name a directory outside the git user's.
func normaliseRepository(p string) (string, error) {
	p = strings.TrimPrefix(p, "/")
	if p == "" || len(p) > maxRepository || strings.ContainsAny(p, "\\") || strings.HasPrefix(p, "~") {
		return "", errBadRepository
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return "", errBadRepository
		}
	}
	return p, nil
}
