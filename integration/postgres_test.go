//go:build linux

package integration

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/capbroker/capbroker/credentials/vaulttest"
	"github.com/capbroker/capbroker/internal/testpki"
)

// The Postgres front door end to end (docs/postgres.md), in the sandbox topology: the agent's
// namespace reaches only the broker (10.250.0.1); Postgres (Debian's server, TLS on), Vault
// (dev, with the database secrets engine and its Postgres plugin) and the broker share the
// broker's namespace, on its loopback. Real clients: psql, psycopg2, Node's pg.

const (
	pgPort       = "5432"
	pgCanaryPass = "pgcanary-static-5b1e0c7a9d"
)

// requirePostgresTools skips (fails in CI) without the server, psql and psycopg2.
func requirePostgresTools(t *testing.T) string {
	t.Helper()
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	var missing []string
	if len(bins) == 0 {
		missing = append(missing, "postgresql (server)")
	}
	for _, tool := range []string{"psql", "node"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if err := exec.Command("/usr/bin/python3", "-c", "import psycopg2").Run(); err != nil {
		missing = append(missing, "python3-psycopg2")
	}
	if len(missing) > 0 {
		if os.Getenv("CI") != "" || os.Getenv("CAPBROKER_REQUIRE_VAULT") == "1" {
			t.Fatalf("missing for the Postgres tests: %v (scripts/install-test-tools.sh installs them)", missing)
		}
		t.Skipf("skipped: missing %v (scripts/install-test-tools.sh installs them)", missing)
	}
	return filepath.Dir(bins[len(bins)-1])
}

// pgNet is the two namespaces, named for this test file.
func pgNet(t *testing.T) *sandboxNet {
	t.Helper()
	return newSandboxNetNamed(t, "cbpg")
}

// pgServer is a Postgres server in the broker's namespace.
type pgServer struct {
	dir, sock string
	caFile    string
}

// startPGServer runs initdb and the server as user postgres, TLS on with a leaf of a test CA,
// TCP on the broker namespace's 127.0.0.1:5432, the superuser reachable only over its
// private Unix socket (trust) and over TCP with its password without TLS (Vault's plugin).
func startPGServer(t *testing.T, binDir, ns, superPass string) *pgServer {
	t.Helper()
	dir, err := os.MkdirTemp("", "cbpg-server-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	pki := testpki.New(t, "postgres test CA")
	leaf := pki.Server(t, time.Now().Add(24*time.Hour), "localhost", "127.0.0.1")
	keyDER, err := x509.MarshalPKCS8PrivateKey(leaf.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"server.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Certificate[0]}),
		"server.key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		"pwfile":     []byte(superPass + "\n"),
	}
	s := &pgServer{dir: dir, sock: filepath.Join(dir, "sock"), caFile: filepath.Join(dir, "ca.crt")}
	if err := os.WriteFile(s.caFile, pki.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(s.sock, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) {
		t.Helper()
		out, err := exec.Command("setpriv", append([]string{"--reuid", "postgres", "--regid", "postgres", "--clear-groups"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	if out, err := exec.Command("chown", "-R", "postgres:postgres", dir).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v %s", err, out)
	}
	_ = os.Chmod(dir, 0o755)
	run(filepath.Join(binDir, "initdb"), "-D", filepath.Join(dir, "data"), "-U", "postgres", "--auth-local=trust",
		"--auth-host=scram-sha-256", "--pwfile", filepath.Join(dir, "pwfile"), "-E", "UTF8", "--no-sync")
	hba := "local all postgres trust\n" +
		"hostnossl all postgres 127.0.0.1/32 scram-sha-256\n" +
		"hostssl all all 127.0.0.1/32 scram-sha-256\n"
	if err := os.WriteFile(filepath.Join(dir, "data", "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = exec.Command("chown", "postgres:postgres", filepath.Join(dir, "data", "pg_hba.conf")).Run()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "setpriv", "--reuid", "postgres", "--regid", "postgres",
		"--clear-groups", filepath.Join(binDir, "postgres"), "-D", filepath.Join(dir, "data"),
		"-c", "listen_addresses=127.0.0.1", "-c", "port="+pgPort, "-c", "unix_socket_directories="+s.sock,
		"-c", "unix_socket_permissions=0700", "-c", "ssl=on", "-c", "ssl_cert_file="+filepath.Join(dir, "server.crt"),
		"-c", "ssl_key_file="+filepath.Join(dir, "server.key"), "-c", "fsync=off", "-c", "max_connections=60")
	logs := newLogTail()
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
	})
	logs.wait(t, "database system is ready to accept connections")
	s.sql(t, "postgres", "CREATE DATABASE app")
	s.sql(t, "app", "CREATE TABLE items (id int PRIMARY KEY, name text); INSERT INTO items VALUES (1, 'one'), (2, 'two');"+
		"CREATE ROLE static_user LOGIN PASSWORD '"+pgCanaryPass+"'; GRANT SELECT, INSERT ON items TO static_user;")
	return s
}

// sql runs statements as the superuser over the private socket.
func (s *pgServer) sql(t *testing.T, db, stmts string) string {
	t.Helper()
	out, err := exec.Command("psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", s.sock, "-p", pgPort, "-U", "postgres", "-d", db, "-c", stmts).CombinedOutput()
	if err != nil {
		t.Fatalf("psql %s: %v\n%s", stmts, err, out)
	}
	return strings.TrimSpace(string(out))
}

// inNS runs a command in the broker's namespace.
func inNS(t *testing.T, ns string, env []string, argv ...string) string {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %v\n%s", argv, err, out)
	}
	return string(out)
}

func TestPostgresFrontDoor(t *testing.T) {
	top := t
	binDir := requirePostgresTools(t)
	vaultBin, err := vaulttest.Binary()
	if err != nil {
		if os.Getenv("CAPBROKER_REQUIRE_VAULT") == "1" {
			t.Fatalf("no Vault binary: %v", err)
		}
		t.Skipf("skipped: no Vault binary: %v", err)
	}
	sn := pgNet(t)
	superPass := "super-" + randHex(12)
	pg := startPGServer(t, binDir, sn.brokerNS, superPass)

	// Vault in dev mode in the broker's namespace, with the database engine.
	rootToken := "root-" + randHex(8)
	vctx, vcancel := context.WithCancel(context.Background())
	vault := exec.CommandContext(vctx, "ip", "netns", "exec", sn.brokerNS, vaultBin, "server", "-dev",
		"-dev-root-token-id="+rootToken, "-dev-listen-address=127.0.0.1:8200", "-dev-no-store-token")
	vlog := newLogTail()
	vault.Stdout, vault.Stderr, vault.Env = vlog, vlog, []string{"HOME=" + sn.agentDir, "PATH=" + agentPath}
	if err := vault.Start(); err != nil {
		t.Fatal(err)
	}
	vaultStopped := false
	stopVault := func() {
		if !vaultStopped {
			vaultStopped = true
			vcancel()
			_ = vault.Wait()
		}
	}
	t.Cleanup(stopVault)
	vlog.wait(t, "Development mode should NOT be used")
	venv := []string{"VAULT_ADDR=http://127.0.0.1:8200", "VAULT_TOKEN=" + rootToken}
	vcli := func(args ...string) string { return inNS(t, sn.brokerNS, venv, append([]string{vaultBin}, args...)...) }
	// Vault's raw audit log holds every password it issues: the canaries of the last check.
	vaultAudit := filepath.Join(sn.agentDir, "..", "cbpg-vault-audit-"+randHex(4)+".log")
	t.Cleanup(func() { os.Remove(vaultAudit) })
	vcli("audit", "enable", "file", "file_path="+vaultAudit, "log_raw=true")
	vcli("secrets", "enable", "database")
	vcli("write", "database/config/app", "plugin_name=postgresql-database-plugin",
		"connection_url=postgresql://{{username}}:{{password}}@127.0.0.1:"+pgPort+"/app?sslmode=disable",
		"username=postgres", "password="+superPass, "allowed_roles=readonly,readwrite,short", "verify_connection=true")
	vcli("write", "database/roles/readonly", "db_name=app", "default_ttl=10m", "max_ttl=1h",
		`creation_statements=CREATE ROLE "{{name}}" WITH LOGIN PASSWORD '{{password}}' VALID UNTIL '{{expiration}}'; GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{{name}}";`)
	vcli("write", "database/roles/readwrite", "db_name=app", "default_ttl=10m", "max_ttl=1h",
		`creation_statements=CREATE ROLE "{{name}}" WITH LOGIN PASSWORD '{{password}}' VALID UNTIL '{{expiration}}'; GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO "{{name}}"; GRANT CREATE, USAGE ON SCHEMA public TO "{{name}}";`)
	vcli("write", "database/roles/short", "db_name=app", "default_ttl=1s", "max_ttl=2s",
		`creation_statements=CREATE ROLE "{{name}}" WITH LOGIN PASSWORD '{{password}}' VALID UNTIL '{{expiration}}'; GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{{name}}";`)
	vcli("kv", "put", "secret/pg/static", "username=static_user", "password="+pgCanaryPass)

	token := "tok-" + randHex(16)
	shipped, err := os.ReadFile("../policies/postgres.rego")
	if err != nil {
		t.Fatal(err)
	}
	opts := brokerOpts{
		netns:  sn.brokerNS,
		listen: brokerSideIP + ":0",
		mode:   "enforce",
		policy: "package broker\n\nimport data.postgres\n\ndecision := postgres.decision if input.phase == \"postgres\"\n",
		files: map[string]string{"postgres.rego": string(shipped), "data.yaml": `settings:
  postgres:
    databases:
      app: {role: readonly, access: read}
      app_rw: {role: readwrite, access: ask}
      app_static: {access: write}
      app_short: {role: short, access: read}
`},
		env: []string{"CODER_1_TOKEN=" + token, "BROKER_VAULT_TOKEN=" + rootToken},
		config: fmt.Sprintf(`agents:
  - {id: coder-1, token_env: CODER_1_TOKEN}
audit: {include_input: false}
vault:
  address: http://127.0.0.1:8200
  auth: {method: token, token_env: BROKER_VAULT_TOKEN}
postgres:
  listen: %q
  tls: required
  statements: true
  max_connections_per_agent: 4
  upstreams:
    - {name: app, address: "127.0.0.1:%s", ca_file: %q, vault: {default_role: readonly}}
    - {name: app_rw, address: "127.0.0.1:%s", database: app, ca_file: %q, vault: {roles: [readwrite]}}
    - {name: app_short, address: "127.0.0.1:%s", database: app, ca_file: %q, vault: {default_role: short}}
    - name: app_static
      address: "127.0.0.1:%s"
      database: app
      ca_file: %q
      static: {mount: secret, path: pg/static}
`, brokerSideIP+":"+pgPort, pgPort, pg.caFile, pgPort, pg.caFile, pgPort, pg.caFile, pgPort, pg.caFile),
	}
	b := startBroker(t, opts)
	b.logs.wait(t, "listening for Postgres clients")

	ca := filepath.Join(sn.agentDir, "broker-ca.crt")
	caPEM, err := os.ReadFile(b.caFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	var agentOut strings.Builder // everything the agent saw
	dsn := func(db, ssl string) string {
		return fmt.Sprintf("host=%s port=%s user=coder-1 dbname=%s sslmode=%s sslrootcert=%s connect_timeout=10", brokerSideIP, pgPort, db, ssl, ca)
	}
	env := []string{"PATH=" + agentPath, "HOME=" + sn.agentDir, "LANG=C.UTF-8", "PGPASSWORD=" + token}
	psql := func(db, ssl, sql string) (string, error) {
		t.Helper()
		out, err := sn.agent(t, env, "psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", dsn(db, ssl), "-c", sql)
		agentOut.WriteString(out)
		return out, err
	}
	connEvent := func() auditEvent {
		t.Helper()
		return b.waitAuditWhere(t, 1, "the connection's audit event", func(e auditEvent) bool {
			p, _ := e["postgres"].(map[string]any)
			return p != nil && e["method"] == "CONNECT" && e["decision"] == "allow" && p["lease_id"] != nil && p["statements"] != nil
		})[0]
	}

	t.Run("connect, query, lease revoked at disconnect", func(t *testing.T) {
		out, err := psql("app", "verify-full", "SELECT current_user, count(*) FROM items")
		if err != nil {
			t.Fatalf("psql: %v\n%s", err, out)
		}
		user, count, _ := strings.Cut(strings.TrimSpace(out), "|")
		if !strings.HasPrefix(user, "v-token-readonly-") || count != "2" {
			t.Fatalf("want a Vault user of role readonly and 2 rows, got %q", out)
		}
		ev := connEvent()
		p := ev["postgres"].(map[string]any)
		if p["role"] != "readonly" || !strings.HasPrefix(fmt.Sprint(p["lease_id"]), "database/creds/readonly/") ||
			p["database"] != "app" || p["tls"] != true {
			t.Fatalf("connection event: %v", ev)
		}
		if st := p["statements"].(map[string]any); st["read"] != float64(1) {
			t.Fatalf("statement counts: %v", st)
		}
		// The event is written after the lease is revoked: the user is gone.
		if n := pg.sql(t, "app", "SELECT count(*) FROM pg_roles WHERE rolname = '"+user+"'"); n != "0" {
			t.Fatalf("the connection's database user %s still exists after it closed", user)
		}
	})

	t.Run("agent-env: a DATABASE_URL without a secret", func(t *testing.T) {
		cmd := exec.Command(brokerBin, "agent-env", "--config", filepath.Join(b.dir, "broker.yaml"), "--agent", "coder-1",
			"--proxy", brokerSideIP+":8080", "--ca-file", ca, "--format", "env")
		cmd.Env = append(os.Environ(), "CODER_1_TOKEN="+token)
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		var agentVars []string
		var url string
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			agentVars = append(agentVars, line)
			if v, ok := strings.CutPrefix(line, "DATABASE_URL="); ok {
				url = v
			}
		}
		if url == "" || strings.Contains(url, token) || strings.Contains(url, rootToken) {
			t.Fatalf("DATABASE_URL %q: missing, or holds a secret", url)
		}
		got, err := sn.agent(t, append(agentVars, "PATH="+agentPath, "HOME="+sn.agentDir), "sh", "-c", `psql -X -A -t "$DATABASE_URL" -c 'SELECT 40 + 2'`)
		agentOut.WriteString(got)
		if err != nil || strings.TrimSpace(got) != "42" {
			t.Fatalf("psql with agent-env's DATABASE_URL: %v\n%s", err, got)
		}
	})

	t.Run("refused write and DDL under a read-only role", func(t *testing.T) {
		out, err := psql("app", "verify-full", "INSERT INTO items VALUES (3, 'secret-literal')")
		if err == nil || !strings.Contains(out, `database "app" is read-only: INSERT (write) is not allowed`) {
			t.Fatalf("want the insert refused, got %v\n%s", err, out)
		}
		out, err = psql("app", "verify-full", "CREATE TABLE x (a int)")
		if err == nil || !strings.Contains(out, "CREATE TABLE (ddl) is not allowed") {
			t.Fatalf("want the DDL refused, got %v\n%s", err, out)
		}
		ev := b.waitAuditWhere(t, 1, "the refused insert", func(e auditEvent) bool { return e["method"] == "INSERT" })[0]
		st := ev["postgres"].(map[string]any)["statement"].(map[string]any)
		if st["kind"] != "write" || st["text"] != "INSERT INTO items VALUES (?, ?)" || ev["decision"] != "deny" {
			t.Fatalf("refused statement's event: %v", ev)
		}
		if n := pg.sql(t, "app", "SELECT count(*) FROM items"); n != "2" {
			t.Fatalf("the refused insert ran: %s rows", n)
		}
	})

	t.Run("SET ROLE postgres and multi-statement smuggling", func(t *testing.T) {
		out, err := psql("app", "verify-full", "SET ROLE postgres")
		if err == nil || !strings.Contains(out, "SET ROLE is not allowed") {
			t.Fatalf("want SET ROLE refused, got %v\n%s", err, out)
		}
		out, err = psql("app", "verify-full", "SELECT 1; SET SESSION AUTHORIZATION postgres; SELECT current_user")
		if err == nil || !strings.Contains(out, "SET SESSION AUTHORIZATION is not allowed") {
			t.Fatalf("want the batch refused, got %v\n%s", err, out)
		}
		out, err = psql("app", "verify-full", "SELECT set_config('role', 'postgres', false)")
		if err == nil || !strings.Contains(out, "function set_config is not allowed") {
			t.Fatalf("want set_config refused, got %v\n%s", err, out)
		}
		out, err = psql("app", "verify-full", "SELECT 1 /* unterminated")
		if err == nil || !strings.Contains(out, "cannot read it") {
			t.Fatalf("want an unreadable statement refused, got %v\n%s", err, out)
		}
	})

	t.Run("TLS required and a wrong token", func(t *testing.T) {
		out, err := psql("app", "disable", "SELECT 1")
		if err == nil || !strings.Contains(out, "requires TLS") {
			t.Fatalf("want a plaintext connection refused, got %v\n%s", err, out)
		}
		bad := append(append([]string(nil), env[:len(env)-1]...), "PGPASSWORD=wrong-token")
		out, err = sn.agent(t, bad, "psql", "-X", dsn("app", "verify-full"), "-c", "SELECT 1")
		agentOut.WriteString(out)
		if err == nil || !strings.Contains(out, "password authentication failed") {
			t.Fatalf("want a wrong token refused, got %v\n%s", err, out)
		}
	})

	t.Run("approved DDL", func(t *testing.T) {
		done := make(chan string, 1)
		go func() {
			out, _ := sn.agent(t, env, "psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", dsn("app_rw", "verify-full"), "-c", "CREATE TABLE approved_t (a int)")
			done <- out
		}()
		var id string
		deadline := time.Now().Add(waitTimeout)
		for id == "" && time.Now().Before(deadline) {
			out := inNS(t, sn.brokerNS, nil, brokerBin, "approvals", "list", "--json", "--admin", "http://"+b.adminAddr)
			var held struct{ Pending []map[string]any }
			_ = json.Unmarshal([]byte(out), &held)
			if list := held.Pending; len(list) > 0 {
				id, _ = list[0]["id"].(string)
				if list[0]["body_preview"] != "CREATE TABLE approved_t (a int)" {
					t.Errorf("the approver is shown %v", list[0]["body_preview"])
				}
			} else {
				time.Sleep(50 * time.Millisecond) // polling the approvals API
			}
		}
		if id == "" {
			t.Fatal("the DDL was never held for approval")
		}
		inNS(t, sn.brokerNS, nil, brokerBin, "approvals", "approve", id, "--admin", "http://"+b.adminAddr)
		out := <-done
		agentOut.WriteString(out)
		if !strings.Contains(out, "CREATE TABLE") {
			t.Fatalf("approved DDL: %s", out)
		}
		if n := pg.sql(t, "app", "SELECT count(*) FROM pg_tables WHERE tablename = 'approved_t'"); n != "1" {
			t.Fatal("the approved table does not exist")
		}
	})

	t.Run("cancel a long query with psycopg2", func(t *testing.T) {
		script := `
import psycopg2, threading, sys
dsn = sys.argv[1]
c = psycopg2.connect(dsn)
res = {}
def run():
    try:
        c.cursor().execute("SELECT pg_sleep(20)")
        res["r"] = "finished"
    except psycopg2.errors.QueryCanceled as e:
        res["r"] = "CANCELED"
t = threading.Thread(target=run); t.start()
# A cancel that arrives before the query runs is ignored: send one until the query ends.
while t.is_alive():
    c.cancel()
    t.join(0.2)
print(res.get("r"))
`
		out, err := sn.agent(t, env, "python3", "-c", script, dsn("app", "verify-full"))
		agentOut.WriteString(out)
		if err != nil || strings.TrimSpace(out) != "CANCELED" {
			t.Fatalf("cancel: %v\n%s", err, out)
		}
	})

	t.Run("node pg", func(t *testing.T) {
		nodeDir, _ := filepath.Abs("testdata/node")
		if _, err := os.Stat(filepath.Join(nodeDir, "node_modules", "pg")); err != nil {
			t.Skip("skipped: node_modules/pg is not installed (scripts/install-test-tools.sh)")
		}
		script := fmt.Sprintf(`
const { Client } = require(%q);
const fs = require("fs");
const c = new Client({host: %q, port: %s, user: "coder-1", database: "app", password: process.env.PGPASSWORD,
  ssl: {ca: fs.readFileSync(%q, "utf8")}});
(async () => {
  await c.connect();
  const r = await c.query("SELECT name FROM items WHERE id = $1", [2]);
  console.log("row:" + r.rows[0].name);
  try { await c.query("DELETE FROM items"); } catch (e) { console.log("refused:" + e.message); }
  await c.end();
})().catch(e => { console.log("error:" + e.message); process.exit(1); });
`, filepath.Join(nodeDir, "node_modules", "pg"), brokerSideIP, pgPort, ca)
		out, err := sn.agent(t, env, "node", "-e", script)
		agentOut.WriteString(out)
		if err != nil || !strings.Contains(out, "row:two") || !strings.Contains(out, "refused:capbroker: statement refused by policy") {
			t.Fatalf("node pg: %v\n%s", err, out)
		}
	})

	t.Run("static user: its password never reaches the agent", func(t *testing.T) {
		// A hostile agent makes the upstream echo the password back in an error. (psql
		// itself prints the statement it sent, which is the agent's own text: only the
		// upstream's message is checked.)
		out, _ := sn.agent(t, env, "psql", "-X", "-A", "-t", dsn("app_static", "verify-full"), "-c", "SELECT '"+pgCanaryPass+"'::int")
		errLine, _, _ := strings.Cut(out, "\n")
		if strings.Contains(errLine, pgCanaryPass) || !strings.Contains(errLine, `"[REDACTED]"`) {
			t.Fatalf("the upstream's error was not scrubbed: %s", out)
		}
		out, err := psql("app_static", "verify-full", "SELECT current_user")
		if err != nil || strings.TrimSpace(out) != "static_user" {
			t.Fatalf("static user: %v\n%s", err, out)
		}
	})

	t.Run("the connection ends with its lease", func(t *testing.T) {
		out, err := psql("app_short", "verify-full", "SELECT pg_sleep(20)")
		if err == nil || !strings.Contains(out, "its database user's lease ended") {
			t.Fatalf("want the connection closed at the lease's max_ttl, got %v\n%s", err, out)
		}
	})

	t.Run("options smuggling a role, and the per-agent cap", func(t *testing.T) {
		out, err := sn.agent(t, append(env, "PGOPTIONS=-c role=postgres"), "psql", "-X", dsn("app", "verify-full"), "-c", "SELECT current_user")
		agentOut.WriteString(out)
		if err == nil || !strings.Contains(out, `the startup parameter "options" is not passed upstream`) {
			t.Fatalf("want options refused, got %v\n%s", err, out)
		}
		script := `
import psycopg2, sys
conns = [psycopg2.connect(sys.argv[1]) for _ in range(4)]
try:
    psycopg2.connect(sys.argv[1])
    print("fifth connected")
except psycopg2.OperationalError as e:
    print(str(e).strip())
`
		mark := b.auditLog.mark()
		out, err = sn.agent(t, env, "python3", "-c", script, dsn("app", "verify-full"))
		agentOut.WriteString(out)
		if err != nil || !strings.Contains(out, "holds 4 connections, the most it may") {
			t.Fatalf("want the fifth connection refused, got %v\n%s", err, out)
		}
		// The four are over once their events are written (after their leases are revoked).
		b.auditLog.waitLines(t, mark, 4, "the four connections' events", func(line string) bool {
			return strings.Contains(line, `"method":"CONNECT"`) && strings.Contains(line, `"decision":"allow"`)
		})
	})

	t.Run("shutdown revokes the users of open connections", func(t *testing.T) {
		done := make(chan string, 1)
		go func() {
			out, _ := sn.agent(t, env, "psql", "-X", dsn("app", "verify-full"), "-c", "SELECT pg_sleep(60)")
			done <- out
		}()
		var user string
		for deadline := time.Now().Add(waitTimeout); user == "" && time.Now().Before(deadline); {
			user = pg.sql(t, "app", "SELECT usename FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)' AND state = 'active'")
			if user == "" {
				select {
				case out := <-done:
					t.Fatalf("psql ended before its query was seen: %s", out)
				case <-time.After(50 * time.Millisecond): // polling the server's own view
				}
			}
		}
		if !strings.HasPrefix(user, "v-token-readonly-") {
			t.Fatalf("the held connection's user: %q", user)
		}
		if err := b.stop(t); err != nil {
			t.Fatalf("the broker's exit: %v\n%s", err, b.logs.String())
		}
		agentOut.WriteString(<-done)
		if n := pg.sql(t, "app", "SELECT count(*) FROM pg_roles WHERE rolname = '"+user+"'"); n != "0" {
			t.Fatalf("user %s of a connection open at shutdown still exists", user)
		}
		logs, audit := b.logs.String(), b.auditLog.String()
		b = startBroker(top, opts) // the test's, not this subtest's: it serves the next one
		b.logs.wait(t, "listening for Postgres clients")
		b.logs.Write([]byte(logs))
		b.auditLog.Write([]byte(audit))
		newCA, err := os.ReadFile(b.caFile) // a new broker, a new CA
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(ca, newCA, 0o644); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Vault down: a clear error", func(t *testing.T) {
		stopVault()
		out, err := psql("app", "verify-full", "SELECT 1")
		if err == nil || !strings.Contains(out, "database credentials are unavailable") || !strings.Contains(out, "Vault") {
			t.Fatalf("want a clear error with Vault down, got %v\n%s", err, out)
		}
		metrics := inNS(t, sn.brokerNS, nil, "curl", "-sS", "http://"+b.adminAddr+"/metrics")
		for _, want := range []string{
			`capbroker_postgres_connections_total{outcome="credential_unavailable",role="readonly",upstream="app"} 1`,
		} {
			if !strings.Contains(metrics, want) {
				t.Errorf("/metrics has no %s", want)
			}
		}
	})

	for what, text := range map[string]string{"the agent's output": agentOut.String(), "the broker's log": b.logs.String(), "the audit": b.auditLog.String()} {
		if strings.Contains(text, pgCanaryPass) || strings.Contains(text, superPass) {
			t.Errorf("a database password is in %s", what)
		}
	}
	raw, err := os.ReadFile(vaultAudit)
	if err != nil {
		t.Fatal(err)
	}
	issued := regexp.MustCompile(`"password":"([^"]{8,})"`).FindAllStringSubmatch(string(raw), -1)
	if len(issued) < 5 {
		t.Fatalf("Vault's audit log shows %d passwords issued; want one per connection", len(issued))
	}
	for _, m := range issued {
		for what, text := range map[string]string{"the agent's output": agentOut.String(), "the broker's log": b.logs.String(), "the audit": b.auditLog.String()} {
			if strings.Contains(text, m[1]) {
				t.Errorf("a password Vault issued is in %s", what)
			}
		}
	}
}
