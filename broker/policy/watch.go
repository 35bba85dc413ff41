package policy

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// settle is how long Watch waits after a change before reloading, so that an editor's
// write-rename-chmod burst compiles once.
const settle = 100 * time.Millisecond

// NewDir compiles the policy in the directory dir (Rego and data files). Errors name files
// by their path under dir, as the user wrote it.
func NewDir(ctx context.Context, dir string) (*Engine, error) {
	e := &Engine{}
	if err := e.LoadDir(ctx, dir); err != nil {
		return nil, err
	}
	return e, nil
}

// LoadDir is Load for a directory; errors name files by their path under dir.
func (e *Engine) LoadDir(ctx context.Context, dir string) error {
	return e.load(ctx, os.DirFS(dir), dir)
}

// WatchDir starts watching dir before it returns, so that a change made after that is seen,
// and returns the loop that reloads, for the caller to run (typically in a goroutine): it
// reloads the policy from dir whenever a policy or data file in it, or in a directory below
// it, changes, until ctx ends. Each reload is reported to onReload with its error (nil on
// success); a failed reload leaves the last good policy in place. A reload that finds the
// files as they were (a touch, a chmod, the second event burst of a ConfigMap update) is not
// reported, unless it ends a run of failures.
func (e *Engine) WatchDir(dir string) (run func(ctx context.Context, onReload func(revision string, err error)) error, err error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, err
	}
	addSubdirs(w, dir)
	return func(ctx context.Context, onReload func(revision string, err error)) error {
		defer w.Close()
		return e.watch(ctx, w, dir, onReload)
	}, nil
}

func (e *Engine) watch(ctx context.Context, w *fsnotify.Watcher, dir string, onReload func(revision string, err error)) error {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	failing := false // the last report was an error
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if ev.Has(fsnotify.Create) {
				if st, err := os.Stat(ev.Name); err == nil && st.IsDir() && !hidden(ev.Name) {
					addSubdirs(w, ev.Name)
					_ = w.Add(ev.Name)
					timer.Reset(settle) // a directory moved in may bring files
				}
			}
			if relevant(ev.Name) {
				timer.Reset(settle)
			}
			if ev.Has(fsnotify.Remove|fsnotify.Rename) && filepath.Ext(ev.Name) == "" && !hidden(ev.Name) {
				timer.Reset(settle) // perhaps a directory of policy files moved away
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			failing = true
			onReload(e.Revision(), err)
		case <-timer.C:
			before := e.Revision()
			err := e.LoadDir(ctx, dir)
			if err == nil && !failing && e.Revision() == before {
				continue // nothing changed
			}
			failing = err != nil
			onReload(e.Revision(), err)
		}
	}
}

// addSubdirs watches every directory below root that policies are read from (not hidden ones).
func addSubdirs(w *fsnotify.Watcher, root string) {
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || p == root {
			return nil
		}
		if strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		_ = w.Add(p)
		return nil
	})
}

func hidden(name string) bool { return strings.HasPrefix(filepath.Base(name), ".") }

func relevant(name string) bool {
	switch filepath.Ext(name) {
	case ".rego", ".json", ".yaml", ".yml":
		return true
	}
	// Kubernetes ConfigMap volumes swap a ..data symlink rather than the files.
	return filepath.Base(name) == "..data"
}
