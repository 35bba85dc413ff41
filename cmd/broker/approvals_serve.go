package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"

	"github.com/rs/zerolog"

	"github.com/capbroker/capbroker/broker"
	"github.com/capbroker/capbroker/broker/approvals"
	"github.com/capbroker/capbroker/broker/audit"
	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/console"
)

// defaultStateFile is approvals.state_file when it is not set: beside the config file.
const defaultStateFile = "capbroker-approvals.json"

// approvalsSetup is what serve needs of approvals: the queue for the broker, and the admin API.
type approvalsSetup struct {
	queue *approvals.Queue
	api   *approvals.API
}

// adminTLS is the admin listener's TLS config for admin.tls: a client certificate from
// client_ca_file is required.
func adminTLS(t *config.AdminTLS) (*tls.Config, error) {
	if t == nil {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("admin.tls: %w", err)
	}
	pem, err := os.ReadFile(t.ClientCAFile)
	if err != nil {
		return nil, fmt.Errorf("admin.tls.client_ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("admin.tls.client_ca_file: %s holds no PEM certificate", t.ClientCAFile)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// buildApprovals makes the approvals queue (its grants loaded from the state file, or from
// the shared store, into which the state file's grants are moved once), its webhook, and the
// admin API. policyDir is "" when the policy is not a directory.
func buildApprovals(ctx context.Context, cfg *config.Config, configPath, policyDir string, adminAddr net.Addr,
	token string, mtls bool, auditLog *audit.Logger, metrics *broker.Metrics, log zerolog.Logger, grants approvals.GrantStore, shared approvals.Shared) (*approvalsSetup, error) {
	a := cfg.Approvals
	state := a.StateFile
	if state == "" && configPath != "" {
		state = filepath.Join(filepath.Dir(configPath), defaultStateFile)
	}
	consoleURL := a.ConsoleURL
	if consoleURL == "" {
		scheme := "http"
		if mtls {
			scheme = "https"
		}
		consoleURL = scheme + "://" + adminAddr.String() + "/console/"
	}
	m := approvals.NewMetrics(metrics.Registry())
	o := approvals.Options{Timeout: a.Timeout, MaxPending: a.MaxPending, MaxPendingPerAgent: a.MaxPendingPerAgent,
		StateFile: state, PolicyDir: policyDir, Audit: auditLog, Metrics: m, Log: log, Grants: grants, Shared: shared}
	if w := a.Webhook; w != nil {
		hook := &approvals.Webhook{URL: w.URL, ConsoleURL: consoleURL, Metrics: m, Log: log, Dial: ownDial(cfg)}
		if w.SecretEnv != "" {
			secret := os.Getenv(w.SecretEnv)
			if secret == "" {
				return nil, fmt.Errorf("approvals.webhook.secret_env: %s is not set or empty", w.SecretEnv)
			}
			hook.Secret = []byte(secret)
		}
		hook.Start(ctx)
		o.Notify = hook.Notify
	}
	q, err := approvals.New(o)
	if err != nil && a.StateFile == "" && grants == nil {
		return nil, fmt.Errorf("%w; approvals.state_file is not set, and its default is beside the config file", err)
	}
	if err != nil {
		return nil, err
	}
	auditLog.SetTap(q.Events.AuditTap)
	var origins []string
	if u, err := url.Parse(consoleURL); err == nil && a.ConsoleURL != "" {
		origins = append(origins, u.Scheme+"://"+u.Host)
	}
	return &approvalsSetup{queue: q, api: approvals.NewAPI(approvals.APIOptions{Queue: q, Token: token, MTLS: mtls, Origins: origins})}, nil
}

// adminMux serves the admin handler, under /api/ the approvals API, and under /console/ the
// web console. The API's status endpoint reports the same readiness /readyz does.
func adminMux(admin http.Handler, api *approvals.API, revision broker.PolicyRevision) http.Handler {
	api.SetStatus(func() (string, map[string]any) {
		rec := httptest.NewRecorder()
		admin.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		var ready map[string]any
		_ = json.Unmarshal(rec.Body.Bytes(), &ready)
		return revision.Revision(), ready
	})
	mux := http.NewServeMux()
	mux.Handle("/", admin)
	mux.Handle("/api/", api)
	mux.Handle("/console", console.Handler())
	mux.Handle("/console/", console.Handler())
	return mux
}
