package gitssh

import "testing"

func TestParseCommand(t *testing.T) {
	good := map[string]command{
		"git-upload-pack 'org/repo.git'":          {"git-upload-pack", ServiceFetch, "org/repo.git"},
		"git upload-pack 'org/repo.git'":          {"git-upload-pack", ServiceFetch, "org/repo.git"},
		"git-receive-pack '/org/repo.git'":        {"git-receive-pack", ServicePush, "org/repo.git"},
		"git-upload-archive 'org/repo'":           {"git-upload-archive", ServiceArchive, "org/repo"},
		`git-upload-pack 'it'\''s/r.git'`:         {"git-upload-pack", ServiceFetch, "it's/r.git"},
		`git-upload-pack 'wow'\!'/r.git'`:         {"git-upload-pack", ServiceFetch, "wow!/r.git"},
		"git-upload-pack 'group/sub/project.git'": {"git-upload-pack", ServiceFetch, "group/sub/project.git"},
		"git-upload-pack 'with space/r.git'":      {"git-upload-pack", ServiceFetch, "with space/r.git"},
	}
	for line, want := range good {
		got, err := parseCommand(line)
		if err != nil || got != want {
			t.Errorf("parseCommand(%q) = %+v, %v; want %+v", line, got, err, want)
		}
	}
	bad := []string{
		"", "sh", "bash -c id", "git-upload-pack", "git-upload-pack org/repo.git",
		"git-upload-pack 'a' 'b'", "git-upload-pack 'a'; id", "git-upload-pack 'a",
		"git-upload-pack '-u/x'", "git-upload-pack '--upload-pack=id'", "git-upload-pack  'a'",
		"git  upload-pack 'a'", "git-upload-packx 'a'", "git-shell 'a'", "scp -t /tmp",
		"git-upload-pack '../etc'", "git-upload-pack 'a/../../b'", "git-upload-pack 'a//b'",
		"git-upload-pack './a'", "git-upload-pack '//etc/passwd'", "git-upload-pack 'a\\b'",
		"git-upload-pack '~root/x'", "git-upload-pack 'a/'", "git-upload-pack '/'",
		"git-upload-pack 'a\nb'", "git-upload-pack 'a\x00b'", `git-upload-pack 'a'\x'b'`,
		"git-upload-pack \xff'a'", "git-receive-pack 'a'\n",
	}
	for _, line := range bad {
		if got, err := parseCommand(line); err == nil {
			t.Errorf("parseCommand(%q) = %+v, want an error", line, got)
		}
	}
}

func TestSQQuoteRoundTrip(t *testing.T) {
	for _, s := range []string{"org/repo.git", "it's", "a!b", "''", "!"} {
		if got, ok := sqDequote(sqQuote(s)); !ok || got != s {
			t.Errorf("sqDequote(sqQuote(%q)) = %q, %v", s, got, ok)
		}
	}
}
