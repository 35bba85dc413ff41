package credentials

import (
	"context"
	"math/rand/v2"
	"time"
)

// backoff produces exponentially growing delays with jitter, so that repeated failures against
// Vault never turn into a hot loop and many brokers do not retry in step. Not safe for
// concurrent use.
type backoff struct {
	min, max time.Duration
	n        int // failures since the last reset
}

// next returns the delay before the next attempt: a random value in [d/2, d], where d doubles
// with every call from min up to max.
func (b *backoff) next() time.Duration {
	d := b.min
	for i := 0; i < b.n && d < b.max; i++ {
		d *= 2
	}
	d = min(d, b.max)
	b.n++
	if d <= 1 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// reset starts the sequence again from min.
func (b *backoff) reset() { b.n = 0 }

// sleep waits for d or until ctx is done; it reports whether the full delay passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
