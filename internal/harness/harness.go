// Package harness holds what the programs that start the broker and its neighbours as child
// processes (the integration tests, the benchmark, the Vault test server) need alike.
package harness

import (
	"net"
	"os"
	"strings"
)

// Env is this process's environment without proxy settings (HTTP_PROXY, HTTPS_PROXY,
// NO_PROXY, ALL_PROXY, in any case), so that a child process never routes through a proxy of
// the developer's.
func Env() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch strings.ToUpper(k) {
		case "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// FreeAddr returns a loopback host:port that was free a moment ago, for a program that must
// be told its port rather than listen on port 0 and report it. Another process may take the
// port in between: callers retry, or report the failure.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
