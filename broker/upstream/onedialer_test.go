package upstream

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// outboundRe finds the ways Go code dials out on its own, around this package's Dialer.
var outboundRe = regexp.MustCompile(`net\.Dial\(|net\.DialTimeout\(|net\.Dialer\{|http\.DefaultTransport|http\.DefaultClient|http\.Get\(|http\.Post\(|http\.Transport\{`)

// ownDialers are the files outside broker/upstream that may make a connection of their own,
// each with why. Every other outbound connection goes through the Dialer, which chains it
// through upstream.proxy; a new file that dials on its own fails TestOneDialer.
var ownDialers = map[string]string{
	"broker/broker.go":            "goproxy's Transport, which refuses every dial",
	"cmd/broker/approvals.go":     "the CLI, to the broker's own admin listener",
	"cmd/broker/healthcheck.go":   "the CLI, to the broker's own admin listener",
	"internal/tcppair/tcppair.go": "a loopback socket pair for tests",
	"internal/svcdial/svcdial.go": "the broker's own clients' transports, around an injected dial (DialService)",
}

// TestOneDialer fails when Go code outside broker/upstream (tests and test helpers aside)
// makes an outbound connection of its own rather than through the Dialer.
func TestOneDialer(t *testing.T) {
	root := filepath.Join("..", "..")
	var found []string
	for _, top := range []string{"broker", "cmd", "credentials", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			rel = filepath.ToSlash(rel)
			if d.IsDir() {
				if d.Name() == "testdata" || strings.HasSuffix(d.Name(), "test") || rel == "broker/upstream" {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if outboundRe.Match(b) {
				if _, ok := ownDialers[rel]; !ok {
					found = append(found, rel)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	sort.Strings(found)
	if len(found) > 0 {
		t.Errorf("these files dial out on their own, around upstream.Dialer (and so around upstream.proxy): %v", found)
	}
}
