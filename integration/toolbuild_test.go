package integration

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// toolBuild is a test tool built from a module of its own under testdata/ (so the project's
// go.mod never takes its dependencies), once per test binary.
type toolBuild struct {
	once sync.Once
	bin  string
	err  error
}

// binary builds testdata/dir's package pkg as name, cached under the user cache directory by
// the hash of the module's files (a cold build can take a minute), and returns its path. A
// failed build skips the test, and fails it in CI (CAPBROKER_REQUIRE_VAULT=1).
func (b *toolBuild) binary(t *testing.T, what, dir, pkg, name string, files ...string) string {
	t.Helper()
	b.once.Do(func() {
		src := filepath.Join("testdata", dir)
		h := sha256.New()
		for _, f := range files {
			data, err := os.ReadFile(filepath.Join(src, f))
			if err != nil {
				b.err = err
				return
			}
			h.Write(data)
		}
		cache, err := os.UserCacheDir()
		if err != nil {
			cache = os.TempDir()
		}
		b.bin = filepath.Join(cache, "capbroker-"+dir, hex.EncodeToString(h.Sum(nil))[:16], name)
		if _, err := os.Stat(b.bin); err == nil {
			return
		}
		tmp := b.bin + ".tmp"
		build := exec.Command("go", "build", "-o", tmp, pkg)
		build.Dir = src
		build.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		if out, err := build.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("building %s: %v\n%s", what, err, out)
			return
		}
		b.err = os.Rename(tmp, b.bin)
	})
	if b.err != nil {
		if os.Getenv("CAPBROKER_REQUIRE_VAULT") == "1" {
			t.Fatal(b.err)
		}
		t.Skip(b.err)
	}
	return b.bin
}
