//go:build !linux

package main

// pgLayout is where the Postgres bench's processes run (pglayout_linux.go). Without Linux's
// CPU affinity there is one layout: every process on every CPU.
type pgLayout struct{ name string }

func pgLayouts() []pgLayout {
	return []pgLayout{{name: "one machine (every process on every CPU)"}}
}

func (pgLayout) place(int) error { return nil }
