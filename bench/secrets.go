package main

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"github.com/capbroker/capbroker/broker/config"
	"github.com/capbroker/capbroker/broker/inject"
	"github.com/capbroker/capbroker/broker/scrub"
	"github.com/capbroker/capbroker/credentials"
)

// Issue 40's many-secrets target: a response from a host with 100 keys bound to it is
// scrubbed at least 0.9x as fast as one from a host with one key, each key in every form the
// broker redacts (broker/inject's Reveals: the value, percent-, JSON-, base64- and
// hex-encoded, and runs of a key with special characters). Measured in this process, on the
// broker's own scrubber (the Reader a streamed response is read through), in pairs of adjacent
// rounds of 64 MiB of JSON-like text, one key first in one pair and 100 in the next, each
// round timed by its thread's CPU time.

// secretsResult is, by kind of key ("plain": "sk-live-" and hex; "special": with characters
// an encoder escapes), 100 keys' scrubbing throughput over one key's of the same kind.
type secretsResult map[string]*secretsKind

type secretsKind struct {
	Keys       int       `json:"keys"`
	Patterns   []int     `json:"patterns"`  // with one key, and with Keys
	MBps       []float64 `json:"mib_per_s"` // the best round: one key, Keys keys
	Ratios     []float64 `json:"ratios"`
	Median     float64   `json:"median"`
	MiBPerPair int       `json:"mib_per_round"`
}

// keyForms are the scrubber's pairs for n keys bound to one host with a header rule: keys of
// one kind, "sk-live-" and 32 hex digits, or with special, keys with characters an encoder
// escapes ("/", "+", "="), whose forms are more and shorter.
func keyForms(n int, special bool) ([]string, int) {
	set := inject.NewSet([]config.Credential{{Name: "k", Hosts: []string{"api.bench"},
		Inject: config.Inject{Header: "Authorization", Value: "Bearer {{secret}}"}}})
	bs, err := set.Resolve([]string{"k"}, "api.bench")
	if err != nil {
		panic(err)
	}
	rng := rand.New(rand.NewPCG(40, uint64(n)))
	var pairs []string
	for range n {
		key := fmt.Sprintf("sk-live-%016x%016x", rng.Uint64(), rng.Uint64())
		if special {
			key = fmt.Sprintf("ghs_%016x/%08x+%016x==", rng.Uint64(), rng.Uint32(), rng.Uint64())
		}
		for _, f := range bs[0].Reveals(credentials.NewSecret(key)) {
			pairs = append(pairs, f, "[REDACTED]")
		}
	}
	return pairs, len(pairs) / 2
}

// scrubText is a streamed chat completion's text, with the prefix of the keys in it.
func scrubText() []byte {
	var b []byte
	for i := 0; len(b) < 4<<20; i++ {
		b = fmt.Appendf(b, `data: {"id":"chatcmpl-%d","choices":[{"delta":{"content":"token %d of the answer, sk-live- and ghs_ are prefixes"}}]}`+"\n\n", i, i)
	}
	return b
}

// scrubRound reads text through r's Reader rounds times, as the broker reads a streamed
// response (16 KiB reads), and returns MiB/s.
func scrubRound(r *scrub.Replacer, text []byte, rounds int) float64 {
	p := make([]byte, 16<<10)
	// The thread's CPU time where it can be read: on a busy machine, wall time is mostly
	// other processes'.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start, cpu0 := time.Now(), threadCPU()
	for range rounds {
		rd := r.Reader(io.NopCloser(bytes.NewReader(text)))
		for {
			if _, err := rd.Read(p); err != nil {
				break
			}
		}
		rd.Close()
	}
	took := time.Since(start)
	if cpu := threadCPU() - cpu0; cpu0 > 0 && cpu > 0 {
		took = cpu
	}
	return float64(len(text)*rounds) / (1 << 20) / took.Seconds()
}

func measureSecrets(pairs int) secretsResult {
	const keys = 100
	text := scrubText()
	rounds := 16 // 64 MiB
	res := secretsResult{}
	for _, kind := range []string{"plain", "special"} {
		onePairs, oneN := keyForms(1, kind == "special")
		manyPairs, manyN := keyForms(keys, kind == "special")
		one, many := scrub.New(onePairs...), scrub.New(manyPairs...)
		r := &secretsKind{Keys: keys, Patterns: []int{oneN, manyN}, MBps: []float64{0, 0}, MiBPerPair: len(text) * rounds >> 20}
		scrubRound(many, text, 1) // warm
		for i := range pairs {
			var a, b float64
			if i%2 == 0 {
				b = scrubRound(one, text, rounds)
				a = scrubRound(many, text, rounds)
			} else {
				a = scrubRound(many, text, rounds)
				b = scrubRound(one, text, rounds)
			}
			r.MBps[0], r.MBps[1] = max(r.MBps[0], b), max(r.MBps[1], a)
			r.Ratios = append(r.Ratios, a/b)
		}
		r.Median = median(r.Ratios)
		fmt.Fprintf(stderr, "  scrubbing, %d %s keys (%d patterns) / 1 key (%d): median %.2fx of %d pairs\n", keys, kind, manyN, oneN, r.Median, len(r.Ratios))
		res[kind] = r
	}
	return res
}

func (res secretsResult) print(out io.Writer) {
	for _, kind := range []string{"plain", "special"} {
		r := res[kind]
		if r == nil || len(r.Ratios) == 0 {
			continue
		}
		fmt.Fprintf(out, "  scrubbing %d %s keys (%d patterns) / 1 key (%d patterns): %.2fx (%.2f to %.2f, %d pairs); best %.0f and %.0f MiB/s\n",
			r.Keys, kind, r.Patterns[1], r.Patterns[0], r.Median, slices.Min(r.Ratios), slices.Max(r.Ratios), len(r.Ratios), r.MBps[1], r.MBps[0])
	}
}
