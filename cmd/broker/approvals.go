package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

const approvalsUsage = `Usage: broker approvals COMMAND [flags]

  list                          requests held for approval
  approve ID [--scope once|agent|always] [--duration 30m] [--method M] [--path-prefix P] [--comment C]
  deny ID [--comment C]
  grants                        live grants
  revoke ID                     end a grant

Flags of every command:
  --admin URL        the broker's admin listener (default http://127.0.0.1:9090)
  --token-env VAR    variable holding the admin token (default CAPBROKER_ADMIN_TOKEN, when set)
  --ca-file, --cert-file, --key-file   for an admin listener with admin.tls (mTLS)
  --json             print the API's JSON
`

// approvalsClient talks to the admin API.
type approvalsClient struct {
	base   string
	token  string
	client *http.Client
	csrf   string // fetched once, when no token is configured (loopback-only broker)
}

func cmdApprovals(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, approvalsUsage)
		return errUsage
	}
	sub, rest := args[0], args[1:]
	var id string
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		id, rest = rest[0], rest[1:]
	}
	fs := newFlags("approvals "+sub, "approvals "+sub+" [flags]", stderr)
	fs.Usage = func() { fmt.Fprint(stderr, approvalsUsage) }
	admin := fs.String("admin", "http://127.0.0.1:9090", "admin listener URL")
	tokenEnv := fs.String("token-env", "", "environment variable holding the admin token")
	caFile := fs.String("ca-file", "", "CA of the admin listener's certificate (admin.tls)")
	certFile := fs.String("cert-file", "", "client certificate (admin.tls)")
	keyFile := fs.String("key-file", "", "client key (admin.tls)")
	asJSON := fs.Bool("json", false, "print JSON")
	scope := fs.String("scope", "once", "approve: once, agent or always")
	duration := fs.String("duration", "", "approve --scope agent: how long the grant lasts (default 30m)")
	method := fs.String("method", "", "approve: the grant's method (default the request's; * for any)")
	pathPrefix := fs.String("path-prefix", "", "approve: the grant's path prefix (default the request's directory)")
	comment := fs.String("comment", "", "approve, deny: a comment for the audit log (and the agent, on deny)")
	if err := fs.Parse(rest); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return errUsage
	}
	if id == "" && fs.NArg() > 0 {
		id = fs.Arg(0)
	}
	needID := sub == "approve" || sub == "deny" || sub == "revoke"
	if needID && id == "" {
		fmt.Fprintf(stderr, "broker approvals %s: the ID is required\n\n%s", sub, approvalsUsage)
		return errUsage
	}
	c, err := newApprovalsClient(*admin, *tokenEnv, *caFile, *certFile, *keyFile)
	if err != nil {
		return err
	}
	var out map[string]any
	switch sub {
	case "list":
		out, err = c.do(http.MethodGet, "/api/approvals", nil)
	case "grants":
		out, err = c.do(http.MethodGet, "/api/grants", nil)
	case "approve":
		body := map[string]string{"scope": *scope, "duration": *duration, "method": *method, "path_prefix": *pathPrefix, "comment": *comment}
		out, err = c.do(http.MethodPost, "/api/approvals/"+url.PathEscape(id)+"/approve", body)
	case "deny":
		out, err = c.do(http.MethodPost, "/api/approvals/"+url.PathEscape(id)+"/deny", map[string]string{"comment": *comment})
	case "revoke":
		out, err = c.do(http.MethodDelete, "/api/grants/"+url.PathEscape(id), nil)
	default:
		fmt.Fprintf(stderr, "broker approvals: unknown command %q\n\n%s", sub, approvalsUsage)
		return errUsage
	}
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	printApprovals(stdout, sub, id, out)
	return nil
}

func newApprovalsClient(admin, tokenEnv, caFile, certFile, keyFile string) (*approvalsClient, error) {
	if !strings.Contains(admin, "://") {
		admin = "http://" + admin
	}
	u, err := url.Parse(admin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--admin %q: want http://host:port", admin)
	}
	c := &approvalsClient{base: strings.TrimRight(admin, "/")}
	switch {
	case tokenEnv != "":
		if c.token = os.Getenv(tokenEnv); c.token == "" {
			return nil, fmt.Errorf("--token-env: %s is not set", tokenEnv)
		}
	default:
		c.token = os.Getenv("CAPBROKER_ADMIN_TOKEN")
	}
	tr := &http.Transport{Proxy: nil} // the admin listener is never reached through a proxy
	if caFile != "" || certFile != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if caFile != "" {
			pem, err := os.ReadFile(caFile)
			if err != nil {
				return nil, fmt.Errorf("--ca-file: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--ca-file: %s holds no PEM certificate", caFile)
			}
		}
		if certFile != "" {
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, fmt.Errorf("--cert-file/--key-file: %w", err)
			}
			tc.Certificates = []tls.Certificate{cert}
		}
		tr.TLSClientConfig = tc
	}
	c.client = &http.Client{Timeout: 30 * time.Second, Transport: tr}
	return c, nil
}

func (c *approvalsClient) do(method, path string, body any) (map[string]any, error) {
	if method != http.MethodGet && c.token == "" && c.csrf == "" {
		// A broker without admin authentication (loopback only) wants the CSRF token it
		// hands out on GET /api/session.
		s, err := c.do(http.MethodGet, "/api/session", nil)
		if err != nil {
			return nil, err
		}
		c.csrf, _ = s["csrf"].(string)
	}
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.csrf != "" {
		req.Header.Set("X-CSRF-Token", c.csrf)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("admin API: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("admin API %s %s: %s: not JSON", method, path, resp.Status)
	}
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("admin API %s %s: %s: %v: %v", method, path, resp.Status, out["error"], out["reason"])
	}
	return out, nil
}

func printApprovals(w io.Writer, sub, id string, out map[string]any) {
	str := func(m map[string]any, k string) string {
		switch v := m[k].(type) {
		case string:
			return v
		case float64:
			return fmt.Sprint(int64(v))
		case nil:
			return ""
		default:
			return fmt.Sprint(v)
		}
	}
	// grantHost is a grant's scheme, host and port: it covers that port only.
	grantHost := func(g map[string]any) string {
		h := str(g, "host")
		if p := str(g, "port"); p != "" && p != "0" {
			h += ":" + p
		}
		if s := str(g, "scheme"); s != "" {
			h = s + "://" + h
		}
		return h
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	switch sub {
	case "list":
		list, _ := out["pending"].([]any)
		if len(list) == 0 {
			fmt.Fprintln(tw, "no requests held for approval")
			return
		}
		fmt.Fprintln(tw, "ID\tAGENT\tREQUEST\tCREDENTIALS\tREASON\tEXPIRES\tSCOPES")
		for _, x := range list {
			p, _ := x.(map[string]any)
			host, scheme, port := str(p, "host"), str(p, "scheme"), str(p, "port")
			if !(scheme == "https" && port == "443" || scheme == "http" && port == "80") {
				host += ":" + port
			}
			// What approving lets through: the query with its values (secrets scrubbed).
			query := url.Values{}
			q, _ := p["query"].(map[string]any)
			for k, vs := range q {
				vals, _ := vs.([]any)
				for _, v := range vals {
					query.Add(k, fmt.Sprint(v))
				}
			}
			target := str(p, "method") + " " + scheme + "://" + host + str(p, "path")
			if len(query) > 0 {
				target += "?" + query.Encode()
			}
			if str(p, "phase") == "connect" {
				target = "CONNECT " + str(p, "host") + ":" + port
			}
			var scopes, creds []string
			for _, x := range p["scopes"].([]any) {
				scopes = append(scopes, fmt.Sprint(x))
			}
			names, _ := p["credentials"].([]any)
			for _, x := range names {
				creds = append(creds, fmt.Sprint(x))
			}
			if len(creds) == 0 {
				creds = []string{"-"}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", str(p, "id"), str(p, "agent"), target, strings.Join(creds, ","), str(p, "reason"), str(p, "expires"), strings.Join(scopes, ","))
		}
	case "grants":
		list, _ := out["grants"].([]any)
		if len(list) == 0 {
			fmt.Fprintln(tw, "no grants")
			return
		}
		fmt.Fprintln(tw, "ID\tKIND\tAGENT\tMETHOD\tHOST\tPATH_PREFIX\tEXPIRES\tBY")
		for _, x := range list {
			g, _ := x.(map[string]any)
			method, expires := str(g, "method"), str(g, "expires")
			if method == "" {
				method = "*"
			}
			if expires == "" {
				expires = "never (policy data)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", str(g, "id"), str(g, "kind"), str(g, "agent"), method, grantHost(g), str(g, "path_prefix"), expires, str(g, "created_by"))
		}
	case "approve":
		if g, ok := out["grant"].(map[string]any); ok {
			fmt.Fprintf(tw, "approved %s; grant %s (%s) for %s %s%s\n", id, str(g, "id"), str(g, "kind"), str(g, "agent"), grantHost(g), str(g, "path_prefix"))
			return
		}
		fmt.Fprintf(tw, "approved %s (this request only)\n", id)
	case "deny":
		fmt.Fprintf(tw, "denied %s\n", id)
	case "revoke":
		fmt.Fprintf(tw, "revoked %s\n", id)
	}
}
