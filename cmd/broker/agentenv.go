package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/capbroker/capbroker/broker/config"
)

// cmdAgentEnv prints what an agent's shell needs to work through the broker: the proxy and
// CA variables, NO_PROXY, and for each credential the variables the SDKs read, set to
// placeholders. An SDK refuses to start without a key, and some check its format; the broker
// replaces or re-signs whatever the agent sends, so the placeholders are worth nothing
// outside it.
func cmdAgentEnv(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("agent-env", "agent-env --agent ID [--config FILE] [--proxy HOST:PORT] [--ca-file PATH] [--write-ca FILE] [--format sh|env] [--ssh HOST:PORT --ssh-dir DIR [--ssh-write]]\n       agent-env --print-ca [--config FILE]", stderr)
	var configPath, agentID, proxyAddr, caFile, writeCA, format, sshAddr, sshDir string
	var printCA, sshWrite bool
	fs.StringVar(&configPath, "config", "", "config file (default: the embedded dev config)")
	fs.StringVar(&agentID, "agent", "", "the agent's id (required)")
	fs.StringVar(&proxyAddr, "proxy", "", "host:port the agent reaches the broker at (default: proxy.listen)")
	fs.StringVar(&caFile, "ca-file", "", "path of the broker's CA certificate as the agent sees it (default: ca.cert_file, ca.vault_pki.root_file or --write-ca)")
	fs.StringVar(&writeCA, "write-ca", "", "write the certificate agents trust (ca.vault_pki: the PKI's root, read from Vault) to this file")
	fs.BoolVar(&printCA, "print-ca", false, "print the certificate agents trust (PEM) and nothing else")
	fs.StringVar(&format, "format", "sh", "sh: export lines; env: NAME=value lines (docker --env-file, Kubernetes)")
	fs.StringVar(&sshAddr, "ssh", "", "host:port the agent reaches the SSH front door at (default: ssh.listen)")
	fs.StringVar(&sshDir, "ssh-dir", "/etc/capbroker/ssh", "where the agent finds the ssh_config and known_hosts for git over SSH")
	fs.BoolVar(&sshWrite, "ssh-write", false, "write the ssh files into --ssh-dir here (in sh format they are also printed as shell that writes them)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if !printCA {
		if err := requireFlag(fs, "agent", agentID); err != nil {
			return err
		}
	}
	if format != "sh" && format != "env" {
		fmt.Fprintf(stderr, "--format must be sh or env, not %q\n", format)
		fs.Usage()
		return errUsage
	}
	cfg := config.Dev()
	if configPath != "" {
		var err error
		if cfg, err = config.Load(configPath); err != nil {
			return err
		}
	}
	if printCA || writeCA != "" {
		pemCA, err := agentCA(cfg)
		if err != nil {
			return fmt.Errorf("agent-env: %w", err)
		}
		if printCA {
			_, err = stdout.Write(pemCA)
			return err
		}
		if err := os.WriteFile(writeCA, pemCA, 0o644); err != nil {
			return fmt.Errorf("agent-env: --write-ca: %w", err)
		}
		if caFile == "" {
			caFile = writeCA
		}
	}
	i := slices.IndexFunc(cfg.Agents, func(a config.Agent) bool { return a.ID == agentID })
	if i < 0 {
		return fmt.Errorf("agent-env: no agent %q in the config", agentID)
	}
	if proxyAddr == "" {
		proxyAddr = cfg.Proxy.Listen
	}
	if p := cfg.CA.VaultPKI; p != nil && caFile == "" {
		if p.RootFile == "" {
			return errors.New("agent-env: with ca.vault_pki agents trust the PKI's root: pass --write-ca FILE (read from Vault), --ca-file PATH, or set ca.vault_pki.root_file")
		}
		abs, err := filepath.Abs(p.RootFile)
		if err != nil {
			return err
		}
		caFile = abs
	}
	if caFile == "" {
		abs, err := filepath.Abs(cfg.CA.CertFile)
		if err != nil {
			return err
		}
		caFile = abs
	}
	admin, err := net.ResolveTCPAddr("tcp", cfg.Admin.Listen)
	if err != nil {
		return fmt.Errorf("admin.listen: %w", err)
	}
	token := agentToken(cfg.Agents[i])
	env := agentEnv(cfg, cfg.Agents[i], token, proxyAddr, admin, caFile)
	if cfg.SSH.Listen != "" { // git over SSH (docs/ssh.md)
		if sshAddr == "" {
			sshAddr = cfg.SSH.Listen
		}
		f, err := sshFiles(cfg, cfg.Agents[i], token, sshAddr, sshDir)
		if err != nil {
			return err
		}
		if sshWrite {
			if err := f.writeFiles(); err != nil {
				return fmt.Errorf("agent-env: --ssh-write: %w", err)
			}
		}
		if format == "sh" && !sshWrite {
			f.writeScript(stdout)
		}
		env = append(env, f.env()...)
	}
	writeEnv(stdout, env, format)
	return nil
}

// agentCA is the PEM certificate agents trust: ca.cert_file, or with ca.vault_pki the root of
// the PKI (vaultRoot).
func agentCA(cfg *config.Config) ([]byte, error) {
	if cfg.CA.VaultPKI == nil {
		return os.ReadFile(cfg.CA.CertFile)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return vaultRoot(ctx, cfg)
}

// agentToken is the agent's proxy password where the broker can read it (token_env,
// token_file); a reference to a variable the agent's environment must set otherwise.
func agentToken(a config.Agent) string {
	switch {
	case a.TokenEnv != "" && os.Getenv(a.TokenEnv) != "":
		return os.Getenv(a.TokenEnv)
	case a.TokenFile != "":
		if b, err := os.ReadFile(a.TokenFile); err == nil {
			return strings.TrimSpace(string(b))
		}
	case len(a.Addresses) > 0 && a.TokenEnv == "" && a.TokenSHA256 == "":
		return "" // identified by its source address
	}
	return "${CAPBROKER_AGENT_TOKEN}"
}

type envVar struct{ name, value string }

// envNotes are printed as comments above their variable (sh format). Node 20's fetch ignores
// NODE_USE_ENV_PROXY (Node 24 reads it), and Node reports a refused CONNECT without the
// broker's reason.
var envNotes = map[string]string{"NODE_USE_ENV_PROXY": `Node 24+: fetch uses the proxy with this. Node 20 ignores it: preload undici's EnvHttpProxyAgent
# (NODE_OPTIONS=--import=..., docs/clients.md). Node's "Proxy response (403)" omits why: curl -v says.`}

// agentEnv lists the variables, in a fixed order: the proxy, NO_PROXY, the CA, then each
// credential's SDK variables.
func agentEnv(cfg *config.Config, a config.Agent, token, proxy string, admin net.Addr, caFile string) []envVar {
	url := "http://" + proxy
	if token != "" {
		url = fmt.Sprintf("http://%s:%s@%s", a.ID, token, proxy)
	}
	noProxy := strings.Join(noProxyHosts(admin), ",")
	env := []envVar{
		{"HTTPS_PROXY", url}, {"HTTP_PROXY", url}, {"https_proxy", url}, {"http_proxy", url},
		{"NO_PROXY", noProxy}, {"no_proxy", noProxy},
		{"NODE_USE_ENV_PROXY", "1"},
	}
	for _, v := range []string{"SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
		"GIT_SSL_CAINFO", "AWS_CA_BUNDLE", "PIP_CERT", "CARGO_HTTP_CAINFO"} {
		env = append(env, envVar{v, caFile})
	}
	env = append(env, postgresEnv(cfg, a, token, proxy, caFile)...)
	seen := map[string]bool{}
	for _, c := range cfg.Credentials {
		for _, v := range credentialEnv(c) {
			if !seen[v.name] { // the first credential that names a variable sets it
				seen[v.name] = true
				env = append(env, v)
			}
		}
	}
	return env
}

// credentialEnv is what the SDKs for a credential's hosts read, set to placeholders. A
// placeholder credential's variables hold its placeholder, which the broker swaps for the
// secret; the others hold values of the right shape that the broker replaces or re-signs.
func credentialEnv(c config.Credential) []envVar {
	names := c.AgentEnv
	if len(names) == 0 {
		names = defaultEnvNames(c)
	}
	if c.AWSSigV4 != nil {
		// The CLI and SDKs sign with these; the broker strips the signature and signs again.
		key := "AKIA" + strings.ToUpper(fake(c.Name, "access", 16))
		return []envVar{{"AWS_ACCESS_KEY_ID", key}, {"AWS_SECRET_ACCESS_KEY", fake(c.Name, "secret", 40)}}
	}
	value := c.Inject.Placeholder
	if value == "" {
		value = placeholderFor(c)
	}
	out := make([]envVar, 0, len(names))
	for _, n := range names {
		out = append(out, envVar{n, value})
	}
	return out
}

// defaultEnvNames are the variables the usual SDKs read for the usual hosts.
func defaultEnvNames(c config.Credential) []string {
	var names []string
	add := func(ns ...string) {
		for _, n := range ns {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	if c.GitHubApp != nil {
		add("GH_TOKEN", "GITHUB_TOKEN")
	}
	for _, h := range c.Hosts {
		switch h {
		case "api.github.com", "github.com", "uploads.github.com":
			add("GH_TOKEN", "GITHUB_TOKEN")
		case "api.openai.com":
			add("OPENAI_API_KEY")
		case "api.anthropic.com":
			add("ANTHROPIC_API_KEY")
		case "generativelanguage.googleapis.com":
			add("GEMINI_API_KEY", "GOOGLE_API_KEY")
		case "api.mistral.ai":
			add("MISTRAL_API_KEY")
		case "api.groq.com":
			add("GROQ_API_KEY")
		case "openrouter.ai":
			add("OPENROUTER_API_KEY")
		case "api.together.xyz":
			add("TOGETHER_API_KEY")
		}
	}
	return names
}

// placeholderFor is a value in the shape the credential's SDK checks for, if it checks one.
func placeholderFor(c config.Credential) string {
	body := fake(c.Name, "token", 36)
	switch {
	case c.GitHubApp != nil:
		return "ghs_" + body
	case slices.Contains(c.Hosts, "api.github.com") || slices.Contains(c.Hosts, "github.com"):
		return "ghp_" + body
	case slices.Contains(c.Hosts, "api.anthropic.com"):
		return "sk-ant-api03-capbroker-" + body
	case slices.Contains(c.Hosts, "generativelanguage.googleapis.com"):
		return "AIza" + fake(c.Name, "token", 35)
	}
	return "sk-capbroker-placeholder-" + body
}

// fake is n characters derived from the credential's name: the same on every run, so an
// agent's environment does not change, and derived from nothing secret.
func fake(name, what string, n int) string {
	var out []byte
	for i := 0; len(out) < n; i++ {
		sum := sha256.Sum256([]byte(fmt.Sprintf("capbroker placeholder %s %s %d", what, name, i)))
		out = append(out, hex.EncodeToString(sum[:])...)
	}
	return string(out[:n])
}

// writeEnv writes env as export lines (values shell-quoted) or as NAME=value lines.
func writeEnv(w io.Writer, env []envVar, format string) {
	for _, v := range env {
		if format == "env" {
			fmt.Fprintf(w, "%s=%s\n", v.name, v.value)
			continue
		}
		if note := envNotes[v.name]; note != "" {
			fmt.Fprintf(w, "# %s\n", note)
		}
		fmt.Fprintf(w, "export %s=%s\n", v.name, shellQuote(v.value))
	}
}

// shellQuote quotes s for a POSIX shell unless it needs none; a ${VAR} reference is left to
// expand.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:@,=+%", r))
	}) < 0 {
		return s
	}
	if strings.HasPrefix(s, "${") || strings.Contains(s, "${CAPBROKER_AGENT_TOKEN}") {
		return `"` + s + `"`
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// postgresEnv is the Postgres front door's side of the agent (docs/postgres.md): a
// DATABASE_URL naming the first upstream, with no secret in it, and the libpq variables. The
// password is the agent's proxy token (PGPASSWORD), checked by SCRAM: worth nothing outside
// the broker, like HTTPS_PROXY's.
func postgresEnv(cfg *config.Config, a config.Agent, token, proxy, caFile string) []envVar {
	p := cfg.Postgres
	if p.Listen == "" || len(p.Upstreams) == 0 {
		return nil
	}
	host, _, _ := net.SplitHostPort(proxy)
	_, port, _ := net.SplitHostPort(p.Listen)
	ssl := "verify-full"
	if p.TLS == config.PostgresTLSOff {
		ssl = "disable"
	}
	db := p.Upstreams[0].Name
	u := fmt.Sprintf("postgresql://%s@%s/%s?sslmode=%s&sslrootcert=%s", a.ID, net.JoinHostPort(host, port), db, ssl, caFile)
	env := []envVar{{"DATABASE_URL", u}, {"PGHOST", host}, {"PGPORT", port}, {"PGUSER", a.ID},
		{"PGDATABASE", db}, {"PGSSLMODE", ssl}, {"PGSSLROOTCERT", caFile}}
	if token != "" {
		env = append(env, envVar{"PGPASSWORD", token})
	}
	return env
}
