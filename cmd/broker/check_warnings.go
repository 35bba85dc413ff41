package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/policy"
)

// warnPolicy prints, one line each on w, the policy's costly constructs that still load
// (policy.Warnings: membership tests and iteration over data arrays of more than 1,000
// entries), with the file and line of each expression. Warnings do not fail check-config.
// A bundle is downloaded again for them.
func warnPolicy(cfg *config.Config, w io.Writer) {
	if b := cfg.Policy.Bundle; b != nil {
		o, err := bundleOptions(b, ownDial(cfg))
		if err != nil {
			return
		}
		for _, warning := range policy.BundleWarnings(context.Background(), o) {
			fmt.Fprintf(w, "warning: policy.bundle: %s\n", warning)
		}
		return
	}
	if st, err := os.Stat(cfg.Policy.Dir); err != nil || !st.IsDir() {
		return
	}
	for _, warning := range policy.Warnings(os.DirFS(cfg.Policy.Dir), cfg.Policy.Dir) {
		fmt.Fprintf(w, "warning: policy.dir: %s\n", warning)
	}
}
