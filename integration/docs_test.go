package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"unicode"

	"github.com/capbroker/capbroker/credentials/vaulttest"
	"github.com/capbroker/capbroker/internal/harness"
)

// The documentation's shell blocks are tested: every ```sh block in README.md and docs/ says,
// in an HTML comment on the line before it, how:
//
//	<!-- doc-test: run -->          run with bash -euo pipefail; it must exit 0
//	<!-- doc-test: serve -->        run until the broker it starts says it is listening
//	<!-- doc-test: vault -->        run, against a Vault dev server (VAULT_ADDR, VAULT_TOKEN)
//	<!-- doc-test: skip: why -->    not run here, and why (a Docker engine, a cluster...)
//	<!-- doc-test: file NAME -->    (before any other block) its text is the file NAME
//
// Blocks run in a fresh folder holding a copy of policies/, a few fixtures the documents
// assume (input.json, audit.jsonl, candidate/), the files the document's `file` blocks give,
// the top-level folders of the repository (the documents are followed from a clone's root),
// and, first on PATH, the broker the suite built as `broker`, with a `go` that serves
// `go build -o X ./cmd/broker` and `go run ./cmd/broker ...` from it. The documents' fixed
// ports (8080, 9090) become ephemeral ones, /run/broker the folder's run/broker (not made), and in `vault` blocks the
// documents' Vault (http://127.0.0.1:8200) the dev server.

// docBlock is one fenced block of a document and what its annotation says.
type docBlock struct {
	file string
	line int
	lang string
	mode string // run, serve, vault, skip, file
	arg  string // the file name for "file", the reason for "skip"
	text string
}

func docBlocks(t *testing.T) []docBlock {
	t.Helper()
	files, _ := filepath.Glob("../docs/*.md")
	files = append([]string{"../README.md"}, files...)
	var out []docBlock
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(data), "\n")
		for i := 0; i < len(lines); i++ {
			lang, ok := strings.CutPrefix(lines[i], "```")
			if !ok || lang == "" {
				continue
			}
			b := docBlock{file: strings.TrimPrefix(f, "../"), line: i + 1, lang: lang}
			if i > 0 {
				if ann, ok := strings.CutPrefix(strings.TrimSpace(lines[i-1]), "<!-- doc-test:"); ok {
					ann = strings.TrimSpace(strings.TrimSuffix(ann, "-->"))
					b.mode, b.arg, _ = strings.Cut(ann, " ")
					b.mode = strings.TrimSuffix(b.mode, ":")
					b.arg = strings.TrimSpace(b.arg)
				}
			}
			j := i + 1
			for j < len(lines) && !strings.HasPrefix(lines[j], "```") {
				j++
			}
			b.text = strings.Join(lines[i+1:j], "\n") + "\n"
			out = append(out, b)
			i = j
		}
	}
	return out
}

func isShell(lang string) bool {
	switch lang {
	case "sh", "bash", "shell", "console":
		return true
	}
	return false
}

// TestDocShellBlocks runs the documentation's shell blocks as their annotations say.
func TestDocShellBlocks(t *testing.T) {
	blocks := docBlocks(t)
	files := map[string][]docBlock{}
	for _, b := range blocks {
		switch {
		case b.mode == "file":
			files[b.file] = append(files[b.file], b)
		case !isShell(b.lang):
		case b.mode == "":
			t.Errorf("%s:%d: a shell block without a <!-- doc-test: ... --> annotation", b.file, b.line)
		case b.mode == "skip" && b.arg == "":
			t.Errorf("%s:%d: doc-test: skip needs a reason", b.file, b.line)
		}
	}
	for _, b := range blocks {
		if !isShell(b.lang) || b.mode == "skip" || b.mode == "" {
			continue
		}
		t.Run(fmt.Sprintf("%s:%d", b.file, b.line), func(t *testing.T) {
			dir := docFolder(t, files[b.file])
			cmd := exec.Command("bash", "-euo", "pipefail", "-c", localise(b.text, dir))
			cmd.Dir = dir
			cmd.Env = append(harness.Env(), "PATH="+filepath.Join(dir, ".bin")+":"+os.Getenv("PATH"), "HOME="+dir)
			switch b.mode {
			case "run":
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("%v\n%s", err, out)
				}
			case "vault":
				v := vaulttest.Start(t)
				bin, err := vaulttest.Binary()
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(bin, filepath.Join(dir, ".bin", "vault")); err != nil {
					t.Fatal(err)
				}
				cmd.Env = append(cmd.Env, "VAULT_ADDR="+v.Addr, "VAULT_TOKEN="+v.RootToken)
				for _, f := range files[b.file] { // the documents' Vault is this one
					p := filepath.Join(dir, f.arg)
					text, _ := os.ReadFile(p)
					if err := os.WriteFile(p, []byte(strings.ReplaceAll(string(text), "http://127.0.0.1:8200", v.Addr)), 0o600); err != nil {
						t.Fatal(err)
					}
				}
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("%v\n%s", err, out)
				}
			case "serve":
				logs := newLogTail()
				cmd.Stdout, cmd.Stderr = logs, logs
				cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				done := make(chan error, 1)
				go func() {
					err := cmd.Wait()
					fmt.Fprintf(logs, "the block exited: %v\n", err)
					done <- err
				}()
				t.Cleanup(func() {
					_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
					<-done
				})
				// The block's exit ends the wait too: a block that fails says why at once.
				line := logs.waitLines(t, 0, 1, "listening, or the block's exit", func(l string) bool {
					return strings.Contains(l, `"message":"listening"`) || strings.HasPrefix(l, "the block exited:")
				})[0]
				if strings.HasPrefix(line, "the block exited:") {
					t.Fatalf("the block stopped before the broker listened:\n%s", logs.String())
				}
			default:
				t.Fatalf("unknown doc-test mode %q", b.mode)
			}
		})
	}
}

// localise makes the documents' fixed ports ephemeral and their /run/broker the folder
// dir/run/broker, which does not exist until a block makes it, as on a fresh machine.
func localise(s, dir string) string {
	return strings.NewReplacer("127.0.0.1:8080", "127.0.0.1:0", "127.0.0.1:9090", "127.0.0.1:0",
		"/run/broker", filepath.Join(dir, "run", "broker")).Replace(s)
}

// docFolder is a fresh folder for one block (see TestDocShellBlocks).
func docFolder(t *testing.T, files []docBlock) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, ".bin")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(bin, 0o755))
	must(os.Symlink(brokerBin, filepath.Join(bin, "broker")))
	// go build -o X writes into X when X is a folder, as go does.
	goShim := `#!/bin/sh
# go, as the documentation uses it: build or run ./cmd/broker (the suite has built it).
case "$1 $2 $3 $4" in
  "build -o "*" ./cmd/broker")
    out="$3"; if [ -d "$out" ]; then out="$out/broker"; else mkdir -p "$(dirname "$out")"; fi
    cp "` + brokerBin + `" "$out"; exit ;;
esac
if [ "$1 $2" = "run ./cmd/broker" ]; then shift 2; exec broker "$@"; fi
echo "go shim: $* is not what the documentation runs" >&2; exit 2
`
	must(os.WriteFile(filepath.Join(bin, "go"), []byte(goShim), 0o755))
	must(os.CopyFS(filepath.Join(dir, "policies"), os.DirFS("../policies")))
	// The documents are followed from a clone's root: its folders are there (broker/, cmd/...).
	top, err := os.ReadDir("..")
	must(err)
	for _, e := range top {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && e.Name() != "policies" && e.Name() != "bin" {
			must(os.Mkdir(filepath.Join(dir, e.Name()), 0o755))
		}
	}
	must(os.CopyFS(filepath.Join(dir, "candidate"), os.DirFS("../policies")))
	input := `{"phase":"request","agent":{"id":"coder-1","labels":{"team":"platform"}},"source":{"ip":"10.0.0.5"},` +
		`"request":{"method":"GET","scheme":"https","host":"api.github.com","port":443,"path":"/repos/o/r","query":{},"headers":{}},"credentials":["github"]}`
	must(os.WriteFile(filepath.Join(dir, "input.json"), []byte(input+"\n"), 0o644))
	event := `{"time":"2026-12-04T00:00:00Z","level":"info","msg":"decision","request_id":"doc1","agent":"coder-1","phase":"request",` +
		`"method":"GET","host":"api.github.com","path":"/repos/o/r","decision":"deny","credentials":[],"input":` + input + `}`
	must(os.WriteFile(filepath.Join(dir, "audit.jsonl"), []byte(event+"\n"), 0o644))
	for _, f := range files {
		must(os.WriteFile(filepath.Join(dir, f.arg), []byte(localise(f.text, dir)), 0o600))
	}
	return dir
}

// TestDocLinks checks every relative link of README.md and docs/*.md as GitHub renders them:
// the file or folder exists in the repository, and an #anchor names a heading (or an
// <a id>/<a name>) of the document it points into.
func TestDocLinks(t *testing.T) {
	files, _ := filepath.Glob("../docs/*.md")
	files = append([]string{"../README.md"}, files...)
	anchors := map[string]map[string]bool{} // cleaned path -> anchors
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		anchors[path] = docAnchors(string(data))
		return anchors[path]
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range docLinks(string(data)) {
			target, frag, _ := strings.Cut(l.target, "#")
			where := fmt.Sprintf("%s:%d: link %q", strings.TrimPrefix(f, "../"), l.line, l.target)
			path := filepath.Clean(f)
			if target != "" {
				path = filepath.Join(filepath.Dir(f), target)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s: no such file in the repository", where)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(path, ".md") && !anchorsOf(path)[frag] {
				t.Errorf("%s: %s has no heading with the anchor #%s", where, strings.TrimPrefix(path, "../"), frag)
			}
		}
	}
}

type docLink struct {
	line   int
	target string
}

var (
	mdLinkRe   = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	htmlLinkRe = regexp.MustCompile(`(?:src|href)="([^"]+)"`)
	refLinkRe  = regexp.MustCompile(`^\s*\[[^\]]+\]:\s*(\S+)`)
	codeSpanRe = regexp.MustCompile("`[^`]*`")
	anchorRe   = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)
)

// docLinks is every relative link of a document outside code blocks and code spans.
func docLinks(doc string) []docLink {
	var out []docLink
	inCode := false
	for i, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		line = codeSpanRe.ReplaceAllString(line, "")
		var targets []string
		for _, re := range []*regexp.Regexp{mdLinkRe, htmlLinkRe, refLinkRe} {
			for _, m := range re.FindAllStringSubmatch(line, -1) {
				targets = append(targets, m[1])
			}
		}
		for _, tg := range targets {
			tg = strings.Trim(tg, "<>")
			if strings.Contains(tg, "://") || strings.HasPrefix(tg, "mailto:") {
				continue
			}
			out = append(out, docLink{i + 1, tg})
		}
	}
	return out
}

// docAnchors is the anchors GitHub gives a document's headings (lower case, punctuation
// dropped, spaces as hyphens, -1, -2... for repeats), and its explicit <a id> anchors.
func docAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	inCode := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		for _, m := range anchorRe.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		text, ok := strings.CutPrefix(line, "#")
		if !ok {
			continue
		}
		text = strings.TrimLeft(text, "#")
		if !strings.HasPrefix(text, " ") {
			continue
		}
		slug := githubSlug(text)
		for n, s := 0, slug; ; n++ {
			if n > 0 {
				s = fmt.Sprintf("%s-%d", slug, n)
			}
			if !out[s] {
				out[s] = true
				break
			}
		}
	}
	return out
}

// githubSlug is the anchor GitHub makes of a heading's text.
func githubSlug(heading string) string {
	heading = mdLinkRe.ReplaceAllString(heading, "]") // [text](url) reads as its text
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

func TestGithubSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Node 20 (fetch, undici)":                 "node-20-fetch-undici",
		"`broker policy test`: the Rego tests":    "broker-policy-test-the-rego-tests",
		"A [linked](other.md) heading, v1.2":      "a-linked-heading-v12",
		"Vault login fails (`permission denied`)": "vault-login-fails-permission-denied",
	} {
		if got := githubSlug(heading); got != want {
			t.Errorf("githubSlug(%q) = %q, want %q", heading, got, want)
		}
	}
}

// TestDocFences checks that every fenced block of README.md and docs/*.md names its language
// (text for diagrams and output): a shell block must not escape TestDocShellBlocks unlabelled.
func TestDocFences(t *testing.T) {
	files, _ := filepath.Glob("../docs/*.md")
	for _, f := range append([]string{"../README.md"}, files...) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		open := false
		for i, line := range strings.Split(string(data), "\n") {
			if !strings.HasPrefix(line, "```") {
				continue
			}
			if !open && strings.TrimSpace(line) == "```" {
				t.Errorf("%s:%d: a fenced block without a language (sh, text, yaml...)", strings.TrimPrefix(f, "../"), i+1)
			}
			open = !open
		}
	}
}

// TestDocNoInternalReferences checks that README.md and docs/ cite nothing a user of the
// repository does not have: the project's working notes (the contract and its sections).
func TestDocNoInternalReferences(t *testing.T) {
	files, _ := filepath.Glob("../docs/*.md")
	internal := regexp.MustCompile(`CONTRACT|(?:^|[^.\w])shared/tools|/work/|HELPERS\d*\.md|STYLE\.md|(?i:the issue this)`)
	for _, f := range append([]string{"../README.md"}, files...) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(data), "\n") {
			if m := internal.FindString(line); m != "" {
				t.Errorf("%s:%d: %q refers to the project's internal notes, which users do not have", strings.TrimPrefix(f, "../"), i+1, m)
			}
		}
	}
}

// TestDocCommandList checks that docs/configuration.md's command table names every command
// the binary's usage lists (broker help), sub-commands included.
func TestDocCommandList(t *testing.T) {
	out, _ := exec.Command(brokerBin, "help").CombinedOutput()
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || fields[0] != "broker" || strings.HasPrefix(fields[1], "-") || strings.HasSuffix(fields[1], ":") {
			continue
		}
		cmd := "broker " + fields[1]
		if len(fields) > 2 && fields[2] != "|" && fields[2] == strings.ToLower(fields[2]) && !strings.ContainsAny(fields[2], "[-|") {
			cmd += " " + fields[2] // policy test, ca init, transparent rules
		}
		n++
		if !strings.Contains(string(doc), "`"+cmd) {
			t.Errorf("docs/configuration.md does not list %q (broker help: %q)", cmd, strings.TrimSpace(line))
		}
	}
	if n < 10 {
		t.Fatalf("broker help listed %d commands:\n%s", n, out)
	}
}
