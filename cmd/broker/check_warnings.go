package main

import (
	"fmt"
	"io"
	"os"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy"
)

// warnPolicy prints, one line each on w, the policy's costly constructs that still load
// (policy.Warnings: membership tests and iteration over data arrays of more than 1,000
// entries), with the file and line of each expression. Warnings do not fail check-config.
// A bundle is not read for warnings.
func warnPolicy(cfg *config.Config, w io.Writer) {
	if cfg.Policy.Bundle != nil {
		return
	}
	if st, err := os.Stat(cfg.Policy.Dir); err != nil || !st.IsDir() {
		return
	}
	for _, warning := range policy.Warnings(os.DirFS(cfg.Policy.Dir), cfg.Policy.Dir) {
		fmt.Fprintf(w, "warning: policy.dir: %s\n", warning)
	}
}
