package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker"
	"github.com/capbroker/capbroker/broker/approvals"
	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/policy"
	sandboxdns "github.com/capbroker/capbroker/broker/transparent/dns"
)

// drainGrace is how long SIGTERM waits for requests in flight.
const drainGrace = 30 * time.Second

// serveFlags are the flags run and dev share; they override config keys.
type serveFlags struct {
	listen, adminListen, logLevel string
}

func (f *serveFlags) register(fs interface {
	StringVar(*string, string, string, string)
}) {
	fs.StringVar(&f.listen, "listen", "", "proxy listen address (overrides proxy.listen)")
	fs.StringVar(&f.adminListen, "admin-listen", "", "admin listen address (overrides admin.listen)")
	fs.StringVar(&f.logLevel, "log-level", "info", "operational log level: debug, info, warn, error")
}

// apply overrides config keys with the flags that were set, and validates the result.
func (f *serveFlags) apply(cfg *config.Config) error {
	if f.listen != "" {
		cfg.Proxy.Listen = f.listen
	}
	if f.adminListen != "" {
		cfg.Admin.Listen = f.adminListen
	}
	return errors.Join(cfg.Validate()...)
}

func cmdRun(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("run", "run --config FILE [--listen ADDR] [--admin-listen ADDR] [--log-level LEVEL]", stderr)
	path := fs.String("config", "", "config file (YAML)")
	var sf serveFlags
	sf.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := requireFlag(fs, "config", *path); err != nil {
		return err
	}
	cfg, err := config.Load(*path)
	if err == nil {
		err = sf.apply(cfg)
	}
	if err != nil {
		return configError(*path, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return serve(ctx, cfg, serveOptions{level: sf.logLevel, stdout: stdout, stderr: stderr, configPath: *path, flags: sf})
}

// configError lists every problem on its own line.
func configError(path string, err error) error {
	lines := strings.Split(err.Error(), "\n")
	return fmt.Errorf("invalid config %s:\n  %s", path, strings.Join(lines, "\n  "))
}

type serveOptions struct {
	level          string
	stdout, stderr io.Writer
	// policyFS, when set, is a fixed policy (the embedded one); otherwise policy.dir is loaded and watched.
	policyFS fs.FS
	// onListen is called with the bound addresses once both listeners are up.
	onListen func(proxy, admin net.Addr)
	// configPath is the config file, reloaded on SIGHUP and when it changes ("" for dev);
	// flags are applied again to each reloaded config.
	configPath string
	flags      serveFlags
}

// serve builds the stages from the config and runs until ctx ends, then drains.
func serve(ctx context.Context, cfg *config.Config, o serveOptions) error {
	// SIGHUP reloads the config (reloader). It is caught from the start, so that it never
	// ends the process (its default action); one that comes while the broker starts is
	// handled once it is running.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	level, err := zerolog.ParseLevel(o.level)
	if err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := zerolog.New(o.stderr).Level(level).With().Timestamp().Logger()

	// The broker's own clients connect as cfg's upstream.proxy says (and a reload's, later).
	own.use(cfg)
	own.log.Store(&log)
	ca, err := loadFileCA(cfg) // nil with ca.vault_pki: started below, once Vault is
	if err != nil {
		return err
	}
	policyFS, watch := o.policyFS, o.policyFS == nil && cfg.Policy.Bundle == nil
	if watch {
		policyFS = os.DirFS(cfg.Policy.Dir)
	}
	var engine *policy.Engine
	var bundlePoller *policy.BundlePoller
	if cfg.Policy.Bundle != nil && o.policyFS == nil {
		// policy.bundle: no policy until the poller (started below) loads one, so every decision
		// until then is a 503 policy_error: the broker fails closed.
		engine = new(policy.Engine)
		if bundlePoller, err = newBundlePoller(engine, cfg.Policy.Bundle, ownDial(cfg)); err != nil {
			return err
		}
	} else if engine, err = policy.New(ctx, policyFS); err != nil {
		return fmt.Errorf("policy.dir %s: %w", cfg.Policy.Dir, err)
	}
	// One registry of the secrets the broker sends, for the life of the process: reloads
	// and minted-token rotation do not make it forget a value (inject.Known).
	known := inject.NewKnown(inject.KnownOptions{Retain: knownRetain(cfg)})
	creds, err := buildCredentials(cfg, log, known)
	if err != nil {
		return err
	}
	if err := creds.start(ctx, log); err != nil {
		return err
	}
	if ca == nil {
		if ca, err = startVaultCA(ctx, cfg, creds, log); err != nil {
			return err
		}
	}
	reloading := false // rl.run is running
	rl := &reloader{path: o.configPath, flags: o.flags, log: log, cur: cfg, creds: creds, ready: new(readyStore), done: make(chan struct{})}
	rl.ready.p.Store(creds)
	if o.configPath != "" {
		rl.last, _ = os.ReadFile(o.configPath)
	}
	defer func() {
		// Revoke leases on the way out, with a bound: shutdown must not hang on Vault. The
		// Vault client is the same across reloads; a reload still running finishes first.
		if reloading {
			<-rl.done
		}
		closeCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rl.creds.close(closeCtx); err != nil {
			log.Warn().Err(err).Msg("closing the Vault client")
		}
	}()
	auditW, closeAudit, err := openAudit(cfg.Audit.File, o.stdout)
	if err != nil {
		return err
	}
	defer closeAudit()
	if f, ok := auditW.(*audit.File); ok {
		rl.auditFile = f // SIGHUP reopens it, after log rotation
	}
	auditLog := audit.NewWith(auditW, auditOptions(cfg.Audit))
	defer auditLog.Close() // before the file closes: the last events are written

	// The listeners close when serve returns, whichever way (the servers close them too
	// when they stop; a second Close only returns an error, ignored).
	proxyLn, err := net.Listen("tcp", cfg.Proxy.Listen)
	if err != nil {
		return fmt.Errorf("proxy.listen: %w", err)
	}
	defer proxyLn.Close()
	token, err := cfg.Admin.Token()
	if err != nil {
		return err
	}
	adminTLSConfig, err := adminTLS(cfg.Admin.TLS)
	if err != nil {
		return err
	}
	adminLn, err := net.Listen("tcp", cfg.Admin.Listen)
	if err != nil {
		return fmt.Errorf("admin.listen: %w", err)
	}
	defer adminLn.Close()
	self := selfAddrs(proxyLn.Addr(), adminLn.Addr())
	var dnsLn *sandboxdns.Listener // the sandbox's resolver (transparent.dns.listen)
	if cfg.Transparent.DNS.Listen != "" {
		if dnsLn, err = sandboxdns.Listen(cfg.Transparent.DNS.Listen); err != nil {
			return fmt.Errorf("transparent.dns.listen: %w", err)
		}
		defer dnsLn.Close()
		self = append(self, selfAddrs(dnsLn.Addr())...)
	}
	metrics := broker.NewMetrics(nil)
	metrics.SetBuild(version, buildCommit())
	own.metrics.Store(metrics)
	approvalsPolicyDir := ""
	if watch {
		approvalsPolicyDir = cfg.Policy.Dir
	}
	budgets, budgetStore, err := buildBudgets(cfg, engine, metrics, log)
	if err != nil {
		return err
	}
	var grants approvals.GrantStore
	if budgetStore != nil {
		defer budgetStore.Close()
		grants = &approvals.RedisGrants{Client: budgetStore.Client(), Key: budgetStore.Prefix() + "grants"}
	}
	fl := buildFleet(cfg, budgetStore, metrics.Registry(), log)
	var shared approvals.Shared
	if fl != nil {
		shared = fl.shared
	}
	ap, err := buildApprovals(ctx, cfg, o.configPath, approvalsPolicyDir, adminLn.Addr(), token, adminTLSConfig != nil, auditLog, metrics, log, grants, shared)
	if err != nil {
		return err
	}
	if fl != nil {
		// The fleet's part outlives the listener: held requests are decided from other
		// replicas during the drain.
		fleetCtx, stopFleet := context.WithCancel(context.WithoutCancel(ctx))
		defer stopFleet()
		fl.run(fleetCtx, ap.queue, auditLog)
	}
	ap.api.SetUsage(func(ctx context.Context) (any, error) { return budgets.Summary(ctx, agentLabels(cfg)) })
	var transparentLn net.Listener // connections the sandbox's rules redirect (transparent mode)
	if cfg.Transparent.Listen != "" {
		if transparentLn, err = net.Listen("tcp", cfg.Transparent.Listen); err != nil {
			return fmt.Errorf("transparent.listen: %w", err)
		}
		defer transparentLn.Close()
		self = append(self, selfAddrs(transparentLn.Addr())...)
	}
	sshLn, err := listenSSH(cfg) // git over SSH (ssh.listen)
	if err != nil {
		return err
	}
	if sshLn != nil {
		defer sshLn.Close()
		self = append(self, selfAddrs(sshLn.Addr())...)
	}
	tel, err := startTelemetry(ctx, cfg, known, metrics, auditLog, log)
	if err != nil {
		return err
	}
	defer tel.close()
	deps := broker.Deps{
		Policy: engine, Secrets: creds, CA: ca, Metrics: metrics, Log: log,
		Audit:     auditLog,
		Self:      append(append(self, vaultAddrs(cfg)...), redisAddrs(cfg)...),
		Approvals: ap.queue,
		Budgets:   budgets,
		Recorder:  budgets, // prices each metered LLM call and counts it against the budgets
		Known:     known,
	}
	if tr := tel.Tracer(); tr != nil { // a nil *Tracer in the interface would not be nil
		deps.Tracer = tr
	}
	fl.brokerDeps(&deps)
	b, err := broker.New(cfg, deps)
	if err != nil {
		return err
	}
	rl.b, rl.metrics = b, metrics
	waitPostgres, err := startPostgres(ctx, cfg, postgresDeps{engine: engine, creds: creds, queue: ap.queue, ca: ca,
		audit: auditLog, known: known, metrics: metrics.Registry(), log: log})
	if err != nil {
		return err
	}
	defer waitPostgres() // every connection closed and its lease revoked, before Vault closes
	if dnsLn != nil {
		defer b.StartResolver(dnsLn, cfg.Transparent).Close() // after the drain, before the audit log closes
	}
	if g := cfg.Transparent.LogGroup; g != 0 {
		stopRefused, err := readRefused(ctx, b, g, log)
		if err != nil {
			return fmt.Errorf("transparent.log_group: %w", err)
		}
		defer stopRefused()
	}
	if adminTLSConfig != nil {
		adminLn = tls.NewListener(adminLn, adminTLSConfig)
	}
	var adminH http.Handler = broker.AdminHandler(metrics, rl.ready, engine)
	if fl != nil {
		adminH = fl.readiness(adminH)
	}
	admin := &http.Server{Handler: adminMux(adminH, ap.api, engine), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = admin.Serve(adminLn) }()
	defer admin.Close()

	// reported counts a policy reload in the metrics and logs it with these messages.
	reported := func(failed, loaded string) func(rev string, err error) {
		return func(rev string, err error) {
			metrics.PolicyReload(err)
			if err != nil {
				log.Error().Err(err).Str("policy_revision", rev).Msg(failed)
				return
			}
			log.Info().Str("policy_revision", rev).Msg(loaded)
		}
	}
	if watch {
		// The directory is watched before the broker says it is listening, so a policy
		// written after that is always seen.
		run, err := engine.WatchDir(cfg.Policy.Dir)
		go func() {
			if err == nil {
				err = run(ctx, reported("policy reload failed; keeping the last good policy", "policy reloaded"))
			}
			if err != nil {
				log.Error().Err(err).Msg("policy watch stopped; policy changes need a restart")
			}
		}()
	}
	if bundlePoller != nil {
		go bundlePoller.Run(ctx, reported("policy bundle not loaded; keeping the last good policy", "policy bundle loaded"))
	}
	if sshLn != nil {
		if err := serveSSH(ctx, sshLn, cfg, b, engine, auditLog, creds, metrics, log); err != nil {
			return err
		}
	}
	rl.watch(ctx)
	reloading = true
	go rl.run(ctx, hup)
	log.Info().Str("proxy", proxyLn.Addr().String()).Str("admin", adminLn.Addr().String()).
		Str("policy_revision", engine.Revision()).Str("policy_mode", cfg.Policy.Mode).Msg("listening")
	if o.onListen != nil {
		o.onListen(proxyLn.Addr(), adminLn.Addr())
	}
	if transparentLn != nil {
		log.Info().Str("transparent", transparentLn.Addr().String()).Msg("listening for redirected connections")
		go func() {
			if err := b.ServeTransparent(ctx, transparentLn); err != nil {
				log.Error().Err(err).Msg("transparent listener stopped")
			}
		}()
	}
	serveCtx := ctx
	if fl != nil {
		serveCtx = fl.serveUntil(ctx)
	}
	err = b.Serve(serveCtx, proxyLn, drainGrace)
	log.Info().Msg("stopped")
	return err
}

// selfAddrs are the broker's own services, which agents must not reach through it.
func selfAddrs(addrs ...net.Addr) []netip.AddrPort {
	var out []netip.AddrPort
	for _, a := range addrs {
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			out = append(out, ap)
		}
	}
	return out
}

// openAudit opens the audit destination: a file (appended, 0600, an *audit.File that SIGHUP
// reopens) or stdout.
func openAudit(path string, stdout io.Writer) (io.Writer, func(), error) {
	if path == "" {
		return stdout, func() {}, nil
	}
	f, err := audit.OpenFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("audit.file: %w", err)
	}
	return f, func() { _ = f.Close() }, nil
}
