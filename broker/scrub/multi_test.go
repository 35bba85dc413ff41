package scrub_test

import (
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/capbroker/capbroker/broker/scrub"
)

// TestAtOnceAndOneByOne runs the Replacer's tests with every set of patterns, one pattern
// included, searched for at once, and with every set searched for pattern by pattern.
func TestAtOnceAndOneByOne(t *testing.T) {
	for _, mode := range []struct {
		name string
		from int
	}{{"at once", 1}, {"one by one", 1 << 30}} {
		t.Run(mode.name, func(t *testing.T) {
			defer scrub.SearchAtOnceFrom(mode.from)()
			t.Run("String", TestString)
			t.Run("Reader", TestReader)
			t.Run("ReaderRandom", TestReaderRandom)
			t.Run("ReaderPrompt", TestReaderPrompt)
			t.Run("Header", TestHeader)
			t.Run("Masking", TestMasking)
			t.Run("Following", TestFollowing)
			t.Run("ManyPatterns", testManyPatterns)
			t.Run("LargeReads", TestReaderLargeReads)
		})
	}
}

// testManyPatterns: up to 200 patterns of 1 to 60 bytes, many sharing long prefixes (as a
// host's keys do, "sk-live-..."), found in random text read in random pieces: the Reader
// gives what the naive replacer gives, holds back no more than a pattern's proper prefix at
// each read, and leaves no pattern in the output.
func testManyPatterns(t *testing.T) {
	for seed := range uint64(60) {
		rng := rand.New(rand.NewPCG(seed, 7))
		prefix := randString(rng, "sk-", rng.IntN(10))
		var pairs, secrets []string
		for range 1 + rng.IntN(200) {
			secret := prefix + randString(rng, "abcdef", 1+rng.IntN(50))
			if seed%2 == 0 && rng.IntN(8) == 0 {
				secret = randString(rng, "abc", 1+rng.IntN(4)) // a short one among long ones
			}
			pairs = append(pairs, secret, "[REDACTED]")
			secrets = append(secrets, secret)
		}
		var b strings.Builder
		for b.Len() < 1000+rng.IntN(6000) {
			switch s := secrets[rng.IntN(len(secrets))]; rng.IntN(3) {
			case 0:
				b.WriteString(s)
			case 1:
				b.WriteString(s[:rng.IntN(len(s))])
			default:
				b.WriteString(randString(rng, "abcdefsk- \n", 1+rng.IntN(40)))
			}
		}
		in := b.String()
		want := naive(pairs, in)
		r := scrub.New(pairs...)
		if got := r.String(in); got != want {
			t.Fatalf("seed %d: String differs from the naive replacer", seed)
		}
		var out []byte
		src := &randomChunks{rng: rng, data: in}
		src.check = func() {
			if rng.IntN(10) > 0 {
				return // the check is slow: one read in ten
			}
			read := in[:len(in)-len(src.data)]
			if !heldBackOnly(pairs, read, string(out)) {
				t.Fatalf("seed %d: after reading %d bytes the Reader returned only %d", seed, len(read), len(out))
			}
		}
		rd := r.Reader(io.NopCloser(src))
		p := make([]byte, 4096)
		for {
			n, err := rd.Read(p[:1+rng.IntN(len(p))])
			out = append(out, p[:n]...)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
		}
		if string(out) != want {
			t.Fatalf("seed %d: Reader differs from the naive replacer", seed)
		}
		for _, s := range secrets {
			if strings.Contains(string(out), s) && !strings.Contains("[REDACTED]", s) {
				t.Fatalf("seed %d: %q survived", seed, s)
			}
		}
	}
}

// FuzzAtOnce: for any patterns, input and read split, searching for the patterns at once
// gives what searching for them one by one gives, from String and from the Reader.
func FuzzAtOnce(f *testing.F) {
	f.Add("xx sk-secret yy sk-sec sk-other", "sk-secret", "sk-other", "sk-sec", 3)
	f.Add("aaaa", "aa", "a", "aaa", 1)
	f.Add("abcabcabd", "abcabd", "bca", "cab", 2)
	f.Fuzz(func(t *testing.T, in, p1, p2, p3 string, chunk int) {
		pairs := []string{p1, "[REDACTED]", p2, "[R]", p3, ""}
		want := scrub.NewOneByOne(pairs...).String(in)
		r := scrub.New(pairs...)
		if got := r.String(in); got != want {
			t.Fatalf("at once %q, one by one %q", got, want)
		}
		if chunk <= 0 || chunk > 64 {
			chunk = 1 + len(in)%7
		}
		got, err := io.ReadAll(r.Reader(io.NopCloser(iotest.OneByteReader(&chunked{s: in, n: chunk}))))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Fatalf("Reader at once %q, one by one %q", got, want)
		}
	})
}

// TestReaderLargeReads: a Reader read with buffers as large as its input buffer or larger
// (the broker's 32 KiB) reads src straight into them and returns from there what holds nothing
// to replace; a read that holds a pattern is replaced through its output buffer (replacements
// much longer than what they replace among them): either way the stream is what String gives,
// and nothing of one read is found in the next, though the caller overwrites its buffer.
func TestReaderLargeReads(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 9))
		repl := "[REDACTED]"
		if seed%2 == 0 {
			repl = strings.Repeat("#", 1+rng.IntN(200)) // longer than any pattern
		}
		var pairs, secrets []string
		for range 1 + rng.IntN(30) {
			s := randString(rng, "abcdef", 2+rng.IntN(20))
			pairs, secrets = append(pairs, s, repl), append(secrets, s)
		}
		var b strings.Builder
		for b.Len() < 50_000+rng.IntN(150_000) {
			if rng.IntN(4) == 0 {
				b.WriteString(secrets[rng.IntN(len(secrets))])
			} else {
				b.WriteString(randString(rng, "abcdefxyz \n", 1+rng.IntN(60)))
			}
		}
		in := b.String()
		r := scrub.New(pairs...)
		want := r.String(in)
		var src io.Reader = strings.NewReader(in) // reads as large as asked
		if seed%3 == 0 {
			src = &randomChunks{rng: rng, data: in, check: func() {}}
		}
		rd := r.Reader(io.NopCloser(src))
		var out []byte
		for {
			p := make([]byte, 4<<10+rng.IntN(60<<10))
			n, err := rd.Read(p)
			out = append(out, p[:n]...)
			for i := range p {
				p[i] = '!' // a caller reusing its buffer
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		rd.Close()
		if string(out) != want {
			t.Fatalf("seed %d: the Reader's %d bytes differ from String's %d", seed, len(out), len(want))
		}
	}
}

// TestAtOnceWideWindows: patterns of 24 bytes or more (a host's keys in their forms) are
// searched with 16-byte windows, one every shortest-pattern-less-15 bytes, and text long
// enough that most windows go through the fast loop that skips what the filter rejects
// (multi.skip). Occurrences anywhere, the text's last bytes included, are replaced as the
// patterns searched for one by one replace them, from String and from the Reader.
func TestAtOnceWideWindows(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 11))
		prefix := randString(rng, "sk-live", rng.IntN(12))
		var pairs, secrets []string
		for range 1 + rng.IntN(60) {
			s := prefix + randString(rng, "abcdef0123", 24-len(prefix)+rng.IntN(50))
			pairs, secrets = append(pairs, s, "[REDACTED]"), append(secrets, s)
		}
		var b strings.Builder
		for b.Len() < 20_000+rng.IntN(80_000) {
			switch rng.IntN(6) {
			case 0:
				b.WriteString(secrets[rng.IntN(len(secrets))])
			case 1:
				s := secrets[rng.IntN(len(secrets))]
				b.WriteString(s[:rng.IntN(len(s))]) // a prefix, which must stay
			default:
				b.WriteString(randString(rng, "abcdef0123 sk-live\n", 1+rng.IntN(200)))
			}
		}
		if rng.IntN(2) == 0 {
			b.WriteString(secrets[rng.IntN(len(secrets))]) // the text's last bytes
		}
		in := b.String()
		want := scrub.NewOneByOne(pairs...).String(in)
		r := scrub.New(pairs...)
		if got := r.String(in); got != want {
			t.Fatalf("seed %d: String at once differs from one by one", seed)
		}
		got, err := io.ReadAll(r.Reader(io.NopCloser(&randomChunks{rng: rng, data: in, check: func() {}})))
		if err != nil || string(got) != want {
			t.Fatalf("seed %d: Reader at once differs from one by one (%v)", seed, err)
		}
	}
}
