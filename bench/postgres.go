package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/capbroker/capbroker/credentials/vaulttest"
)

// postgresPairs is -only postgres-pairs: pgbench's default workload (TPC-B-like, simple
// protocol) at -conns clients through the Postgres front door over the same pgbench run
// directly against the same server, in pairs of adjacent runs of -slice each (at least 2s),
// with statement decisions off (connection-level brokering) and on, after the floor: a
// TLS-terminating byte relay that reads nothing of the protocol (pgRelay). Both sides use TLS
// to the server; through the broker or the relay the agent's side is TLS too. Each line
// gives the CPU per transaction of the broker (or relay) too. It runs in both of pgLayouts'
// layouts, and reads the target from the database on a CPU of its own. It needs root (the server runs as
// user postgres), Debian's server and pgbench, and a Vault binary ($VAULT_BIN, or vault on
// PATH, or the repository's shared/tools/vault-bin).
func postgresPairs(ctx context.Context, bin, dir string, o options) error {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	if os.Geteuid() != 0 || len(bins) == 0 {
		return errors.New("-only postgres-pairs needs root and Debian's postgresql server")
	}
	if _, err := exec.LookPath("pgbench"); err != nil {
		return errors.New("-only postgres-pairs needs pgbench (postgresql-client)")
	}
	vaultBin, err := vaulttest.Binary()
	if err != nil {
		return err
	}
	pgBin := filepath.Dir(bins[len(bins)-1])
	// Not under dir: the server runs as user postgres, which must reach its files.
	dir, err = os.MkdirTemp("", "cbpg-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	_ = os.Chmod(dir, 0o755)
	superPass, benchPass, token := rand.Text(), rand.Text(), rand.Text()
	pgPort, vaultPort := freePort(), freePort()
	sock := filepath.Join(dir, "sock")
	certFile, keyFile := filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	if err := selfSigned(certFile, keyFile); err != nil {
		return err
	}
	_ = os.Mkdir(sock, 0o700)
	if err := os.WriteFile(filepath.Join(dir, "pwfile"), []byte(superPass+"\n"), 0o600); err != nil {
		return err
	}
	if out, err := exec.Command("chown", "-R", "postgres:postgres", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("chown: %v %s", err, out)
	}
	asPostgres := func(args ...string) *exec.Cmd {
		return exec.Command("setpriv", append([]string{"--reuid", "postgres", "--regid", "postgres", "--clear-groups"}, args...)...)
	}
	data := filepath.Join(dir, "data")
	if out, err := asPostgres(filepath.Join(pgBin, "initdb"), "-D", data, "-U", "postgres", "--auth-local=trust",
		"--auth-host=scram-sha-256", "--pwfile", filepath.Join(dir, "pwfile"), "--no-sync").CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %v %s", err, out)
	}
	hba := "local all postgres trust\nhostnossl all postgres 127.0.0.1/32 scram-sha-256\nhostssl all all 127.0.0.1/32 scram-sha-256\n"
	if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return err
	}
	_ = exec.Command("chown", "postgres:postgres", filepath.Join(data, "pg_hba.conf")).Run()
	pg, err := startProcess(asPostgres(filepath.Join(pgBin, "postgres"), "-D", data, "-c", "listen_addresses=127.0.0.1",
		"-c", "port="+pgPort, "-c", "unix_socket_directories="+sock, "-c", "ssl=on", "-c", "ssl_cert_file="+certFile,
		"-c", "ssl_key_file="+keyFile, "-c", "max_connections=100", "-c", "fsync=off", "-c", "synchronous_commit=off"), nil)
	if err != nil {
		return err
	}
	defer pg.stop()
	if err := pg.waitListening("127.0.0.1:"+pgPort, 30*time.Second); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	super := func(db, sql string) error {
		out, err := exec.Command("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", sock, "-p", pgPort, "-U", "postgres", "-d", db, "-c", sql).CombinedOutput()
		if err != nil {
			return fmt.Errorf("psql %s: %v %s", sql, err, out)
		}
		return nil
	}
	if err := super("postgres", "CREATE DATABASE bench"); err != nil {
		return err
	}
	if out, err := exec.Command("pgbench", "-i", "-q", "-s", "4", "-h", sock, "-p", pgPort, "-U", "postgres", "bench").CombinedOutput(); err != nil {
		return fmt.Errorf("pgbench -i: %v %s", err, out)
	}
	if err := super("bench", "CREATE ROLE bench LOGIN PASSWORD '"+benchPass+"'; GRANT ALL ON ALL TABLES IN SCHEMA public TO bench"); err != nil {
		return err
	}

	vaultAddr := "http://127.0.0.1:" + vaultPort
	vault, err := startProcess(exec.Command(vaultBin, "server", "-dev", "-dev-root-token-id="+token, "-dev-listen-address=127.0.0.1:"+vaultPort, "-dev-no-store-token"), nil)
	if err != nil {
		return err
	}
	defer vault.stop()
	if err := vault.waitListening("127.0.0.1:"+vaultPort, 30*time.Second); err != nil {
		return fmt.Errorf("vault: %w", err)
	}
	vcli := func(args ...string) error {
		var out []byte
		var err error
		for range 50 { // the dev server listens a moment before it is unsealed
			cmd := exec.Command(vaultBin, args...)
			cmd.Env = append(os.Environ(), "VAULT_ADDR="+vaultAddr, "VAULT_TOKEN="+token)
			if out, err = cmd.CombinedOutput(); err == nil {
				return nil
			}
			time.Sleep(100 * time.Millisecond)
		}
		return fmt.Errorf("vault %v: %v %s", args, err, out)
	}
	for _, args := range [][]string{
		{"secrets", "enable", "database"},
		{"write", "database/config/bench", "plugin_name=postgresql-database-plugin", "allowed_roles=bench",
			"connection_url=postgresql://{{username}}:{{password}}@127.0.0.1:" + pgPort + "/bench?sslmode=disable",
			"username=postgres", "password=" + superPass},
		{"write", "database/roles/bench", "db_name=bench", "default_ttl=1h", "max_ttl=2h",
			`creation_statements=CREATE ROLE "{{name}}" WITH LOGIN PASSWORD '{{password}}' VALID UNTIL '{{expiration}}'; GRANT ALL ON ALL TABLES IN SCHEMA public TO "{{name}}";`},
	} {
		if err := vcli(args...); err != nil {
			return err
		}
	}
	shipped, err := os.ReadFile("policies/postgres.rego")
	if err != nil {
		return fmt.Errorf("run from the repository root: %w", err)
	}
	startPG := func(name string, statements bool) (string, *process, error) {
		bdir, err := os.MkdirTemp(dir, name+"-") // a broker of each kind in each layout
		if err != nil {
			return "", nil, err
		}
		pol := filepath.Join(bdir, "policies")
		if err := os.MkdirAll(pol, 0o755); err != nil {
			return "", nil, err
		}
		if out, err := exec.Command(bin, "ca", "init", "--out", filepath.Join(bdir, "ca")).CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("ca init: %v %s", err, out)
		}
		files := map[string]string{
			"broker.rego":   "package broker\n\nimport data.postgres\n\ndecision := postgres.decision if input.phase == \"postgres\"\n",
			"postgres.rego": string(shipped),
			"data.yaml":     "settings:\n  postgres:\n    databases:\n      bench: {role: bench, access: write}\n",
		}
		for n, c := range files {
			if err := os.WriteFile(filepath.Join(pol, n), []byte(c), 0o644); err != nil {
				return "", nil, err
			}
		}
		listen := "127.0.0.1:" + freePort()
		cfg := fmt.Sprintf(`proxy: {listen: "127.0.0.1:0"}
admin: {listen: "127.0.0.1:0"}
ca: {cert_file: %q, key_file: %q}
policy: {dir: %q}
audit: {file: %q}
agents:
  - {id: bench-agent, token_env: BENCH_AGENT_TOKEN}
vault: {address: %q, auth: {method: token, token_env: BENCH_VAULT_TOKEN}}
postgres:
  listen: %q
  statements: %v
  max_connections_per_agent: 64
  upstreams:
    - {name: bench, address: "127.0.0.1:%s", ca_file: %q, vault: {default_role: bench}}
`, filepath.Join(bdir, "ca", "ca.crt"), filepath.Join(bdir, "ca", "ca.key"), pol, filepath.Join(bdir, "audit.log"),
			vaultAddr, listen, statements, pgPort, certFile)
		cfgFile := filepath.Join(bdir, "broker.yaml")
		if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
			return "", nil, err
		}
		cmd := exec.Command(bin, "run", "--config", cfgFile, "--log-level", "warn")
		cmd.Env = append(os.Environ(), "BENCH_AGENT_TOKEN="+token, "BENCH_VAULT_TOKEN="+token)
		p, err := startProcess(cmd, nil)
		if err != nil {
			return "", nil, err
		}
		if err := p.waitListening(listen, 30*time.Second); err != nil {
			p.stop()
			return "", nil, err
		}
		host, port, _ := net.SplitHostPort(listen)
		return fmt.Sprintf("host=%s port=%s user=bench-agent password=%s dbname=bench sslmode=require", host, port, token), p, nil
	}
	direct := fmt.Sprintf("host=127.0.0.1 port=%s user=bench password=%s dbname=bench sslmode=require", pgPort, benchPass)
	conns := o.conns
	if conns <= 0 || conns == 32 { // -conns' default is the HTTP bench's; pgbench's target is at 8
		conns = 8
	}
	slice := max(o.slice, 2*time.Second)
	pairs := max(o.pairs/4, 3)
	// The floor: what a TLS-terminating relay that reads nothing costs on the same machine.
	relay, err := startPGRelay("127.0.0.1:"+pgPort, certFile, keyFile)
	if err != nil {
		return err
	}
	defer relay.stop()
	variants := []pgVariant{{"byte relay", false}, {"connection-level", false}, {"statements-level", true}}
	host, port, _ := net.SplitHostPort(relay.addr())
	relayDSN := fmt.Sprintf("host=%s port=%s user=bench password=%s dbname=bench sslmode=require channel_binding=disable", host, port, benchPass)
	layouts := pgLayouts()
	var medians map[string]float64
	for _, layout := range layouts {
		if err := layout.place(pg.cmd.Process.Pid); err != nil {
			return err
		}
		fmt.Printf("postgres, %s:\n", layout.name)
		if medians, err = pgVariants(ctx, variants, startPG, relay, relayDSN, direct, conns, pairs, slice); err != nil {
			return err
		}
	}
	// The target (issue 38): connection-level brokering within 10% of direct, read from the
	// last layout (the database on its own CPU where the machine has two).
	got, verdict := medians["connection-level"], "met"
	if got < 0.9 {
		verdict = "not met"
	}
	fmt.Printf("target: connection-level/direct >= 0.9x at %d clients (%s): %.3fx, %s\n", conns, layouts[len(layouts)-1].name, got, verdict)
	return nil
}

// pgVariant is one way pgbench reaches the server besides directly: the byte relay, or a
// broker with statement decisions off or on.
type pgVariant struct {
	name       string
	statements bool
}

// pgVariants runs pgbench through each variant and directly, in pairs, and prints the
// ratios and the CPU per transaction of the broker or relay.
func pgVariants(ctx context.Context, variants []pgVariant, startPG func(string, bool) (string, *process, error),
	relay *pgRelay, relayDSN, direct string, conns, pairs int, slice time.Duration) (map[string]float64, error) {
	medians := map[string]float64{}
	for _, v := range variants {
		var dsn string
		var cpu func() time.Duration
		stop := func() {}
		if v.name == "byte relay" {
			dsn = relayDSN
			cpu = relay.cpu
		} else {
			d, broker, err := startPG(v.name, v.statements)
			if err != nil {
				return nil, fmt.Errorf("broker (%s): %w", v.name, err)
			}
			dsn, cpu, stop = d, broker.cpu, broker.stop
		}
		// Warm up, and check: a count of transactions, not a time, which a loaded machine
		// may fill with connection set-up alone.
		if out, err := exec.CommandContext(ctx, "pgbench", "-n", "-c", strconv.Itoa(conns), "-j", "2", "-t", "5", dsn).CombinedOutput(); err != nil {
			err = fmt.Errorf("%v %s", err, out)
			stop()
			return nil, fmt.Errorf("pgbench through the %s: %w", v.name, err)
		}
		// The CPU per transaction of the broker (or the relay): less noisy than tps on a
		// shared machine, where the ratio moves with whatever else runs.
		var ratios, viaTPS, directTPS, cpuPerTx []float64
		for i := range pairs {
			order := []string{dsn, direct}
			if i%2 == 1 {
				order = []string{direct, dsn}
			}
			got := map[string]float64{}
			for _, d := range order {
				cpu0 := cpu()
				tps, txs, err := pgbench(ctx, d, conns, slice)
				if err != nil {
					stop()
					return nil, err
				}
				got[d] = tps
				if d == dsn && txs > 0 {
					cpuPerTx = append(cpuPerTx, float64((cpu()-cpu0).Microseconds())/float64(txs))
				}
			}
			ratios = append(ratios, got[dsn]/got[direct])
			viaTPS, directTPS = append(viaTPS, got[dsn]), append(directTPS, got[direct])
		}
		stop()
		fmt.Printf("postgres %s/direct at %d clients: median %.3f (pairs %s; tps via it %s, direct %s); its CPU per transaction: median %.0f µs (%s)\n",
			v.name, conns, median(ratios), fmts(ratios, "%.3f"), fmts(viaTPS, "%.0f"), fmts(directTPS, "%.0f"),
			median(cpuPerTx), fmts(cpuPerTx, "%.0f"))
		medians[v.name] = median(ratios)
	}
	return medians, nil
}

var (
	tpsRe = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)
	txsRe = regexp.MustCompile(`number of transactions actually processed: ([0-9]+)`)
)

// pgbench runs pgbench's default workload at conns clients for d and returns its tps and
// the number of transactions it ran.
func pgbench(ctx context.Context, dsn string, conns int, d time.Duration) (float64, int, error) {
	cmd := exec.CommandContext(ctx, "pgbench", "-n", "-c", strconv.Itoa(conns), "-j", "2", "-T", strconv.Itoa(int(d.Seconds())), dsn)
	out, err := cmd.CombinedOutput()
	m, n := tpsRe.FindSubmatch(out), txsRe.FindSubmatch(out)
	if err != nil || m == nil || n == nil {
		return 0, 0, fmt.Errorf("pgbench: %v %s", err, out)
	}
	tps, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		return 0, 0, err
	}
	txs, err := strconv.Atoi(string(n[1]))
	return tps, txs, err
}

func fmts(v []float64, f string) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf(f, x)
	}
	return strings.Join(parts, " ")
}

func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "0"
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key: the server's own,
// trusted as itself.
func selfSigned(certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	kd, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd}), 0o600)
}
