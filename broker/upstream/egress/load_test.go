package egress

import (
	"bytes"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadPAC(t *testing.T) {
	script := []byte(corpPAC)
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(script) }))
	defer plain.Close()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/proxy.pac":
			w.Header().Set("Content-Type", "application/x-ns-proxy-autoconfig")
			w.Write(script)
		case "/moved.pac":
			http.Redirect(w, r, plain.URL+"/proxy.pac", http.StatusFound)
		case "/big.pac":
			w.Write(bytes.Repeat([]byte("/"), MaxPACSize+1))
		default:
			http.NotFound(w, r)
		}
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the untrusted case's handshake error
	srv.StartTLS()
	defer srv.Close()
	dir := t.TempDir()
	file := filepath.Join(dir, "proxy.pac")
	big := filepath.Join(dir, "big.pac")
	empty := filepath.Join(dir, "empty.pac")
	os.WriteFile(file, script, 0o600)
	os.WriteFile(big, bytes.Repeat([]byte("/"), MaxPACSize+1), 0o600)
	os.WriteFile(empty, nil, 0o600)
	exact := filepath.Join(dir, "exact.pac")
	os.WriteFile(exact, bytes.Repeat([]byte("/"), MaxPACSize), 0o600)

	cases := map[string]struct {
		source  string
		client  *http.Client
		wantErr string
	}{
		"file":            {file, nil, ""},
		"file url":        {"file://" + file, nil, ""},
		"file at limit":   {exact, nil, ""},
		"https":           {srv.URL + "/proxy.pac", srv.Client(), ""},
		"https too big":   {srv.URL + "/big.pac", srv.Client(), "larger than"},
		"https to http":   {srv.URL + "/moved.pac", srv.Client(), "not https"},
		"https 404":       {srv.URL + "/nope.pac", srv.Client(), "status 404"},
		"https untrusted": {srv.URL + "/proxy.pac", &http.Client{}, "fetch"},
		"https no client": {srv.URL + "/proxy.pac", nil, "no HTTP client"},
		"http refused":    {"http://127.0.0.1:1/proxy.pac", http.DefaultClient, "only https"},
		"ftp refused":     {"ftp://127.0.0.1/proxy.pac", nil, "only https"},
		"file too big":    {big, nil, "larger than"},
		"file empty":      {empty, nil, "empty"},
		"file missing":    {filepath.Join(dir, "missing.pac"), nil, "no such file"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := LoadPAC(context.Background(), c.source, c.client)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(b) == 0 || len(b) > MaxPACSize {
				t.Errorf("read %d bytes", len(b))
			}
		})
	}
}
