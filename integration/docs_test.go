package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

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
// ports (8080, 9090) become ephemeral ones, /run/broker the folder, and in `vault` blocks the
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
				logs.wait(t, `"message":"listening"`)
			default:
				t.Fatalf("unknown doc-test mode %q", b.mode)
			}
		})
	}
}

// localise makes the documents' fixed ports ephemeral and their /run/broker the folder dir.
func localise(s, dir string) string {
	return strings.NewReplacer("127.0.0.1:8080", "127.0.0.1:0", "127.0.0.1:9090", "127.0.0.1:0", "/run/broker", dir).Replace(s)
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
