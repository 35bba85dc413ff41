package audit

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestFileReopenAfterRename rotates the audit file as logrotate does (rename, then reopen)
// several times while events are written from many goroutines: every event is in exactly
// one of the files, whole, and the events after the last reopen are in the file at the path.
func TestFileReopenAfterRename(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	l := New(f)
	const writers, each, rotations = 4, 1500, 5
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				l.Write(&Event{RequestID: fmt.Sprintf("%d-%d", w, i), Reason: strings.Repeat("r", 100), Start: time.Now()})
			}
		})
	}
	for i := range rotations {
		if err := os.Rename(path, fmt.Sprintf("%s.%d", path, i)); err != nil {
			t.Fatal(err)
		}
		if err := f.Reopen(); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	l.Write(&Event{RequestID: "after-rotation", Start: time.Now()})
	l.Close()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	seen := map[string]int{}
	files, _ := filepath.Glob(path + "*")
	if len(files) != rotations+1 {
		t.Fatalf("files %v", files)
	}
	for _, name := range files {
		fh, err := os.Open(name)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var ev struct {
				ID string `json:"request_id"`
			}
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Fatalf("%s: a line is not a whole event: %q", name, sc.Text())
			}
			seen[ev.ID]++
			if ev.ID == "after-rotation" && name != path {
				t.Fatalf("the event after the last reopen went to %s", name)
			}
		}
		fh.Close()
	}
	if len(seen) != writers*each+1 {
		t.Fatalf("%d distinct events, want %d", len(seen), writers*each+1)
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("event %s written %d times", id, n)
		}
	}
	if info, err := os.Stat(path); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("reopened file: %v %v", info, err)
	}
}
