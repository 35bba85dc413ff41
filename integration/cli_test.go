package integration

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/capbroker/capbroker/internal/harness"
)

// run runs the broker binary and returns its combined output and exit code.
func run(t *testing.T, dir string, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(brokerBin, args...)
	cmd.Dir = dir
	cmd.Env = harness.Env()
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

func TestCAInit(t *testing.T) {
	dir := t.TempDir()
	out, code := run(t, dir, "ca", "init", "--out", "ca")
	if code != 0 {
		t.Fatalf("ca init: %d %s", code, out)
	}
	for name, mode := range map[string]os.FileMode{"ca.crt": 0o644, "ca.key": 0o600} {
		st, err := os.Stat(filepath.Join(dir, "ca", name))
		if err != nil || st.Mode().Perm() != mode {
			t.Fatalf("%s: %v %v, want mode %o", name, st.Mode(), err, mode)
		}
	}
	before, _ := os.ReadFile(filepath.Join(dir, "ca", "ca.key"))
	if out, code := run(t, dir, "ca", "init", "--out", "ca"); code != 1 || !strings.Contains(out, "--force") {
		t.Fatalf("overwrite without --force: %d %s", code, out)
	}
	after, _ := os.ReadFile(filepath.Join(dir, "ca", "ca.key"))
	if string(before) != string(after) {
		t.Fatal("the CA key changed without --force")
	}
	if out, code := run(t, dir, "ca", "init", "--out", "ca", "--force"); code != 0 {
		t.Fatalf("--force: %d %s", code, out)
	}
	if out, code := run(t, dir, "ca", "init"); code != 2 || !strings.Contains(out, "--out is required") {
		t.Fatalf("missing --out: %d %s", code, out)
	}
}

func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	if out, code := run(t, dir, "ca", "init", "--out", "ca"); code != 0 {
		t.Fatal(out)
	}
	os.MkdirAll(filepath.Join(dir, "policies"), 0o755)
	os.WriteFile(filepath.Join(dir, "policies", "broker.rego"), []byte(testPolicy), 0o644)
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o600)
		return p
	}
	good := write("good.yaml", `ca: {cert_file: ca/ca.crt, key_file: ca/ca.key}
policy: {dir: policies}
agents: [{id: a, token_sha256: "`+strings.Repeat("ab", 32)+`"}]
`)
	if out, code := run(t, dir, "check-config", "--config", good); code != 0 || !strings.Contains(out, "OK") {
		t.Fatalf("good config: %d %s", code, out)
	}
	bad := write("bad.yaml", `proxy: {listen: nowhere}
ca: {cert_file: ca/ca.crt, key_file: ca/ca.key}
policy: {dir: policies, mode: strict}
credentials:
  - name: gh
    hosts: ["https://api.github.com"]
    source: {env: GH}
    inject: {header: Authorization}
`)
	out, code := run(t, dir, "check-config", "--config", bad)
	if code != 1 {
		t.Fatalf("bad config exit %d: %s", code, out)
	}
	for _, want := range []string{"proxy.listen:", "policy.mode:", "credentials[0].hosts[0]:", "credentials[0].inject.value: must contain {{secret}}"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// A config that validates, but whose policy does not compile, whose CA key is too open and
	// whose credential cannot be read: all reported, with file:line for the policy.
	os.WriteFile(filepath.Join(dir, "policies", "broken.rego"), []byte("package broker\n\nx := http.send({})\n"), 0o644)
	os.Chmod(filepath.Join(dir, "ca", "ca.key"), 0o644)
	cfg := write("runtime.yaml", `ca: {cert_file: ca/ca.crt, key_file: ca/ca.key}
policy: {dir: policies}
credentials:
  - name: gh
    hosts: ["api.github.com"]
    source: {env: CHECK_CONFIG_UNSET_VAR}
    inject: {header: Authorization, value: "Bearer {{secret}}"}
`)
	out, code = run(t, dir, "check-config", "--config", cfg)
	if code != 1 {
		t.Fatalf("exit %d: %s", code, out)
	}
	for _, want := range []string{"broken.rego:3", "must not be accessible by group or others", `credential "gh"`, "CHECK_CONFIG_UNSET_VAR"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// The broker refuses to start with an open CA key.
	if out, code := run(t, dir, "run", "--config", good); code != 1 || !strings.Contains(out, "must not be accessible") {
		t.Fatalf("run with a 0644 CA key: %d %s", code, out)
	}
}

func TestVersionAndUsage(t *testing.T) {
	out, code := run(t, t.TempDir(), "version")
	if code != 0 || !regexp.MustCompile(`^capbroker \S+ \(commit \S+, go \d+\.\d+`).MatchString(out) {
		t.Fatalf("version: %d %q", code, out)
	}
	if out, code := run(t, t.TempDir(), "frobnicate"); code != 2 || !strings.Contains(out, "unknown command") {
		t.Fatalf("unknown command: %d %s", code, out)
	}
	if out, code := run(t, t.TempDir(), "run", "--help"); code != 0 || !strings.Contains(out, "-config") {
		t.Fatalf("run --help: %d %s", code, out)
	}
}

// TestDevQuickStart runs `broker dev` as the README says, in an empty folder.
func TestDevQuickStart(t *testing.T) {
	dir := t.TempDir()
	start := func() (exports map[string]string, stop func()) {
		cmd := exec.Command(brokerBin, "dev", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")
		cmd.Dir = dir
		cmd.Env = harness.Env()
		stdout, _ := cmd.StdoutPipe()
		cmd.Stderr = io.Discard
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exports = map[string]string{}
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "export ") {
				for _, kv := range strings.Fields(strings.TrimPrefix(line, "export ")) {
					k, v, _ := strings.Cut(kv, "=")
					exports[k] = v
				}
			}
			if strings.HasPrefix(line, "# Audit events follow") {
				break
			}
		}
		go io.Copy(io.Discard, stdout)
		return exports, func() {
			cmd.Process.Signal(syscall.SIGTERM)
			if err := cmd.Wait(); err != nil {
				t.Errorf("broker dev exit: %v", err)
			}
		}
	}
	exports, stop := start()
	for _, k := range []string{"HTTPS_PROXY", "HTTP_PROXY", "SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO"} {
		if exports[k] == "" {
			t.Fatalf("dev printed no %s: %v", k, exports)
		}
	}
	if st, err := os.Stat(filepath.Join(dir, ".broker", "ca.key")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("dev CA key: %v %v", st, err)
	}
	// The agent's first call, to a host the shipped policy does not allow: refused before any TLS.
	cmd := exec.Command("curl", "-sS", "-o", "/dev/null", "-w", "%{http_connect}", "--max-time", "20", "https://not-allowed.invalid/")
	cmd.Env = append(harness.Env(), "HTTPS_PROXY="+exports["HTTPS_PROXY"], "CURL_CA_BUNDLE="+exports["CURL_CA_BUNDLE"])
	out, _ := cmd.Output()
	if string(out) != "403" {
		t.Fatalf("denied CONNECT through dev broker: %q", out)
	}
	stop()
	again, stop := start()
	defer stop()
	if again["HTTPS_PROXY"] == "" || strings.Split(again["HTTPS_PROXY"], "@")[0] != strings.Split(exports["HTTPS_PROXY"], "@")[0] {
		t.Fatal("dev token changed between runs")
	}
}
