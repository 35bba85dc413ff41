package policy

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWatchReportsChangesOnly: an event that leaves the files as they were (chmod, touch) is
// not reported as a reload; a change is, once; a good policy after a failed one is reported
// even when it is the policy already deciding.
func TestWatchReportsChangesOnly(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "p.rego")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	good := "package broker\n\ndecision := {\"allow\": false}\n"
	write(good)
	e, err := New(context.Background(), os.DirFS(dir))
	if err != nil {
		t.Fatal(err)
	}
	reloads := watch(t, e, dir)
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := os.Chtimes(p, now, now); err != nil {
		t.Fatal(err)
	}
	// No report for them: a window ten times the settle delay (a negative check; on the old
	// behaviour the reload is reported within the settle delay plus one compile).
	select {
	case err := <-reloads:
		t.Fatalf("chmod and touch reported as a reload (%v)", err)
	case <-time.After(10 * settle):
	}
	// A real change after them: the first report is that change.
	write("package broker\n\ndecision := {\"allow\": true}\n")
	if err := <-reloads; err != nil {
		t.Fatal(err)
	}
	if d, _ := e.Decide(context.Background(), req()); !d.Allow {
		t.Fatal("the change was not the first report")
	}
	write("package broker\n\ndecision := {\n")
	if err := <-reloads; err == nil {
		t.Fatal("a broken policy reported as loaded")
	}
	write("package broker\n\ndecision := {\"allow\": true}\n") // the policy still deciding
	if err := <-reloads; err != nil {
		t.Fatalf("the fix after a failure: %v", err)
	}
	// Exactly one report per change: nothing more is pending once a further change is seen.
	write(good)
	if err := <-reloads; err != nil {
		t.Fatal(err)
	}
	if d, _ := e.Decide(context.Background(), req()); d.Allow {
		t.Fatal("the last change was not the last report")
	}
	select {
	case err := <-reloads:
		t.Fatalf("an extra report: %v", err)
	default:
	}
}
