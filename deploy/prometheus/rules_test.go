// Package prometheus holds the alerting rules shipped for capbroker (capbroker-rules.yml);
// its tests check them with promtool and against the metrics the broker exports.
package prometheus

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const (
	rulesFile = "capbroker-rules.yml"
	root      = "../.."
)

// requirePromtool returns promtool's path. Without it the test fails in CI, where
// scripts/install-test-tools.sh installs Debian's prometheus package, and is skipped elsewhere.
func requirePromtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatal("promtool is missing: run scripts/install-test-tools.sh (Debian package prometheus)")
	}
	t.Skip("skipped: promtool is missing (run scripts/install-test-tools.sh: Debian package prometheus)")
	return ""
}

// TestRulesWithPromtool: the rule file is valid, and each alert fires on the failure it is
// for and stays silent otherwise (capbroker-rules.test.yml).
func TestRulesWithPromtool(t *testing.T) {
	promtool := requirePromtool(t)
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", "capbroker-rules.test.yml"}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// exported finds the metric families the broker registers, by reading its sources.
func exported(t *testing.T) []string {
	t.Helper()
	re := regexp.MustCompile(`(?:Name:\s*|NewDesc\(|perCredential\()"(capbroker_[a-z_]+)"`)
	var out []string
	for _, dir := range []string{"broker", "cmd", "credentials"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range re.FindAllStringSubmatch(string(src), -1) {
				out = append(out, m[1])
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) < 20 {
		t.Fatalf("found only %d metric families: %v", len(out), out)
	}
	return out
}

// TestEveryMetricDocumented: docs/operations.md has a row for every family the broker
// exports, and the rules use none that it does not.
func TestEveryMetricDocumented(t *testing.T) {
	families := exported(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if !strings.Contains(string(doc), "| `"+f+"` |") {
			t.Errorf("docs/operations.md has no row for %s", f)
		}
	}
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, used := range regexp.MustCompile(`\bcapbroker_[a-z_]+`).FindAllString(string(rules), -1) {
		if !slices.Contains(families, used) {
			t.Errorf("%s uses %s, which the broker does not export", rulesFile, used)
		}
	}
}
