package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// configMapVolume lays out dir as the kubelet does for a ConfigMap volume: the keys live in a
// timestamped directory, ..data points at it, and each key is a symlink through ..data.
type configMapVolume struct {
	t   *testing.T
	dir string
	gen int
}

func (v *configMapVolume) publish(data map[string]string) {
	t := v.t
	t.Helper()
	v.gen++
	ts := filepath.Join(v.dir, "..2026_12_05_20_00_0"+string(rune('0'+v.gen))+".123456789")
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	for k, s := range data {
		if err := os.WriteFile(filepath.Join(ts, k), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(v.dir, "..data"))
	// The atomic swap: a new symlink, renamed over ..data.
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for k := range data {
		link := filepath.Join(v.dir, k)
		if _, err := os.Lstat(link); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", k), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(v.dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWatchFileSeesConfigMapSwap: a config file in a ConfigMap volume (mounted as a
// directory, not with subPath) changes only by the kubelet's swap of the ..data symlink; the
// watch must report each swap, and the path then reads the new content.
func TestWatchFileSeesConfigMapSwap(t *testing.T) {
	v := &configMapVolume{t: t, dir: t.TempDir()}
	v.publish(map[string]string{"broker.yaml": "one\n", "other.yaml": "x\n"})
	path := filepath.Join(v.dir, "broker.yaml")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changes, err := watchFile(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"two\n", "three\n"} {
		v.publish(map[string]string{"broker.yaml": want, "other.yaml": "x\n"})
		select {
		case <-changes:
		case <-time.After(10 * time.Second):
			t.Fatalf("no change reported after the ..data swap to %q", want)
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != want {
			t.Fatalf("after the swap %s reads %q, %v; want %q", path, b, err, want)
		}
	}
}
