package gitssh

import (
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

func TestCheckValidity(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	at := func(d time.Duration) uint64 { return uint64(now.Add(d).Unix()) }
	for name, c := range map[string]struct {
		after, before uint64
		want          string
	}{
		"valid":              {at(-30 * time.Second), at(2 * time.Minute), ""},
		"expired":            {at(-10 * time.Minute), at(-time.Second), "expired"},
		"not yet valid":      {at(10 * time.Minute), at(12 * time.Minute), "valid only from"},
		"forever":            {at(-time.Second), ssh.CertTimeInfinity, "longer than"},
		"longer than config": {at(-time.Second), at(time.Hour), "longer than"},
	} {
		err := checkValidity(&ssh.Certificate{ValidAfter: c.after, ValidBefore: c.before}, now)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}
