package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestConfigReload drives the binary through reloads of its whole config: a new agent token, a
// new secret source and a lower request limit take effect at once, while a request in flight
// finishes with the credential it started with; a broken file is refused with its problems
// logged and the running config keeps serving; a rewritten file reloads without a signal, and
// a changed listener address is reported as needing a restart; SIGHUP alone, with the file
// untouched, reads the agents' token files again; the process never exits.
func TestConfigReload(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/custom/slow" {
			close(started)
			<-release
		}
		fmt.Fprint(w, "done")
	})
	newToken, thirdToken := randHex(16), randHex(16)
	e := newEnv(t, envOpts{handler: slow, env: []string{"CODER1_NEW_TOKEN=" + newToken, "CODER1_THIRD_TOKEN=" + thirdToken}})
	b := e.broker
	cfgFile := filepath.Join(b.dir, "broker.yaml")
	original, err := os.ReadFile(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	newSecret := "sk-reloaded-" + randHex(12)
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte(newSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	get := func(token, path string) (int, error) {
		resp, err := b.client(t, agentID, token).Get(e.url(path))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	// lastAuth is the Authorization header of the last request the upstream received at path.
	lastAuth := func(path string) string {
		auth := ""
		for _, r := range e.received() {
			if r.URL.Path == path {
				auth = r.Header.Get("Authorization")
			}
		}
		return auth
	}
	write := func(content string) {
		t.Helper()
		tmp := cfgFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, cfgFile); err != nil {
			t.Fatal(err)
		}
	}
	replace := func(s string, pairs ...string) string {
		t.Helper()
		for i := 0; i < len(pairs); i += 2 {
			if !strings.Contains(s, pairs[i]) {
				t.Fatalf("config lacks %q:\n%s", pairs[i], s)
			}
			s = strings.Replace(s, pairs[i], pairs[i+1], 1)
		}
		return s
	}

	// A request in flight under the old config.
	inflight := make(chan error, 1)
	go func() {
		code, err := get(e.token, "/api/custom/slow")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("status %d", code)
		}
		inflight <- err
	}()
	<-started

	// SIGHUP with a new token, the canary from a file, and one request at a time per agent.
	reloaded := replace(string(original),
		"token_env: CODER1_TOKEN", "token_env: CODER1_NEW_TOKEN",
		"source: {env: CANARY_SECRET}", fmt.Sprintf("source: {file: %q}", secretFile),
		`proxy: {listen: "127.0.0.1:0"`, `proxy: {listen: "127.0.0.1:0", max_requests_per_agent: 1`)
	mark := b.logs.mark()
	// Written in place and signalled at once: whichever of the file watch and SIGHUP comes
	// first reloads it; the other reloads the same config again.
	write(reloaded)
	if err := b.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	line := b.logs.waitFrom(t, mark, `"message":"config reloaded"`)
	if !strings.Contains(line, `"credentials_changed":["canary"]`) {
		t.Errorf("reload log line: %s", line)
	}
	// The in-flight request holds the agent's only request slot under the new limit.
	if code, err := get(newToken, "/api/limited"); err != nil || code != http.StatusTooManyRequests {
		t.Fatalf("second request with a limit of 1 while one runs: %d %v", code, err)
	}
	close(release)
	if err := <-inflight; err != nil {
		t.Fatalf("request in flight during the reload: %v", err)
	}
	if got := lastAuth("/api/custom/slow"); got != "Bearer "+e.canary {
		t.Errorf("the request in flight was sent with %q, want the old credential", got)
	}
	if code, err := get(newToken, "/api/new"); err != nil || code != http.StatusOK {
		t.Fatalf("new token after reload: %d %v", code, err)
	}
	if got := lastAuth("/api/new"); got != "Bearer "+newSecret {
		t.Errorf("after reload the upstream got %q, want the new secret", got)
	}
	if _, err := get(e.token, "/api/old"); err == nil || !strings.Contains(err.Error(), "Proxy Authentication Required") {
		t.Errorf("old token after reload: %v, want 407", err)
	}

	// A broken file, without a signal: refused, every problem logged; the running config serves.
	mark = b.logs.mark()
	write(replace(reloaded, "mode: enforce", "mode: strict", "audit: {", "audit: {colour: blue, "))
	line = b.logs.waitFrom(t, mark, `"message":"config reload refused`)
	for _, want := range []string{`policy.mode: must be \"enforce\" or \"monitor\"`, "audit.colour: unknown key"} {
		if !strings.Contains(line, want) {
			t.Errorf("refusal lacks %q: %s", want, line)
		}
	}
	if code, err := get(newToken, "/api/still"); err != nil || code != http.StatusOK || lastAuth("/api/still") != "Bearer "+newSecret {
		t.Fatalf("after a refused reload: %d %v", code, err)
	}

	// The file fixed, with the token now in a file and a new admin address: reloaded without
	// a signal; the address needs a restart and says so.
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(thirdToken), 0o600); err != nil {
		t.Fatal(err)
	}
	mark = b.logs.mark()
	write(replace(reloaded, "token_env: CODER1_NEW_TOKEN", fmt.Sprintf("token_file: %q", tokenFile), `admin: {listen: "127.0.0.1:0"}`, `admin: {listen: "127.0.0.1:1"}`))
	if line := b.logs.waitFrom(t, mark, `"message":"config reloaded"`); !strings.Contains(line, `"trigger":"file changed"`) {
		t.Errorf("reload line: %s", line)
	}
	if !strings.Contains(strings.Join(b.logs.snapshot()[mark:], "\n"), "admin.listen changed: it needs a restart") {
		t.Errorf("no restart warning for admin.listen:\n%s", b.logs.String())
	}
	if code, err := get(thirdToken, "/api/third"); err != nil || code != http.StatusOK {
		t.Fatalf("third token: %d %v", code, err)
	}
	if _, err := get(newToken, "/api/second"); err == nil {
		t.Error("the replaced token still works")
	}

	// SIGHUP alone, the config file untouched: the token file is read again.
	fourthToken := randHex(16)
	if err := os.WriteFile(tokenFile, []byte(fourthToken), 0o600); err != nil {
		t.Fatal(err)
	}
	mark = b.logs.mark()
	if err := b.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if line := b.logs.waitFrom(t, mark, `"message":"config reloaded"`); !strings.Contains(line, `"trigger":"SIGHUP"`) {
		t.Errorf("reload line: %s", line)
	}
	if code, err := get(fourthToken, "/api/fourth"); err != nil || code != http.StatusOK {
		t.Fatalf("token read again on SIGHUP: %d %v", code, err)
	}
	if _, err := get(thirdToken, "/api/third-again"); err == nil {
		t.Error("the token replaced in its file still works")
	}

	select {
	case err := <-b.done:
		b.done <- err
		t.Fatalf("the broker exited: %v", err)
	default:
	}
	if err := b.stop(t); err != nil {
		t.Fatalf("broker exit after SIGTERM: %v", err)
	}
	if strings.Contains(b.logs.String()+strings.Join(b.auditLog.snapshot(), "\n"), newSecret) {
		t.Error("the reloaded secret appears in a log")
	}
}
