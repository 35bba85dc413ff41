package policy

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// settle is how long Watch waits after a change before reloading, so that an editor's
// write-rename-chmod burst compiles once.
const settle = 100 * time.Millisecond

// Watch reloads the policy from dir whenever a file in it changes, until ctx ends. Each reload
// is reported to onReload with its error (nil on success); a failed reload leaves the last
// good policy in place.
func (e *Engine) Watch(ctx context.Context, dir string, onReload func(revision string, err error)) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		return err
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if relevant(ev.Name) {
				timer.Reset(settle)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			onReload(e.Revision(), err)
		case <-timer.C:
			err := e.Load(ctx, os.DirFS(dir))
			onReload(e.Revision(), err)
		}
	}
}

func relevant(name string) bool {
	switch filepath.Ext(name) {
	case ".rego", ".json", ".yaml", ".yml":
		return true
	}
	// Kubernetes ConfigMap volumes swap a ..data symlink rather than the files.
	return filepath.Base(name) == "..data"
}
