package scrub_test

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"

	"github.com/capbroker/capbroker/broker/scrub"
)

type replaceCase struct {
	pairs   []string
	in, out string
}

var replaceCases = map[string]replaceCase{
	"no patterns":                        {nil, "secret", "secret"},
	"empty input":                        {[]string{"secret", "R"}, "", ""},
	"single":                             {[]string{"secret", "[R]"}, "a secret b", "a [R] b"},
	"at start and end":                   {[]string{"secret", "[R]"}, "secretxsecret", "[R]x[R]"},
	"adjacent":                           {[]string{"secret", "[R]"}, "secretsecret", "[R][R]"},
	"partial at end":                     {[]string{"secret", "[R]"}, "xsecre", "xsecre"},
	"input shorter than pattern":         {[]string{"secret", "[R]"}, "sec", "sec"},
	"partial then full":                  {[]string{"secret", "[R]"}, "secrsecret", "secr[R]"},
	"self-overlapping pattern":           {[]string{"aab", "[R]"}, "aaab", "a[R]"},
	"repeated prefix":                    {[]string{"abab", "[R]"}, "abababx", "[R]abx"},
	"overlap: leftmost wins":             {[]string{"bcd", "2", "abc", "1"}, "abcd", "1d"},
	"prefix: longest wins":               {[]string{"ab", "1", "abc", "2"}, "abcd", "2d"},
	"prefix: longest wins, listed first": {[]string{"abc", "2", "ab", "1"}, "abcd", "2d"},
	"prefix: shorter when longer fails":  {[]string{"ab", "1", "abc", "2"}, "abx", "1x"},
	"longer pattern cut by EOF":          {[]string{"ab", "1", "abcd", "2"}, "abc", "1c"},
	"inner pattern after failed outer":   {[]string{"bc", "1", "abcd", "2"}, "abcx", "a1x"},
	"outer pattern beats inner":          {[]string{"bc", "1", "abcd", "2"}, "abcd", "2"},
	"match covers a longer partial":      {[]string{"abcd", "1", "cdxcZ", "2"}, "abcdxc", "1xc"},
	"duplicates keep first":              {[]string{"k", "1", "k", "2"}, "akb", "a1b"},
	"empty old dropped":                  {[]string{"", "X", "k", "1"}, "ak", "a1"},
	"replacement not rescanned":          {[]string{"a", "aa"}, "aa", "aaaa"},
	"replacement holds other pattern":    {[]string{"a", "b", "b", "c"}, "ab", "bc"},
	"replace with empty":                 {[]string{"secret", ""}, "xsecrety", "xy"},
	"single byte pattern":                {[]string{"\n", `\n`}, "a\nb\n", `a\nb\n`},
	"utf-8":                              {[]string{"ключ", "[R]"}, "мой ключ!", "мой [R]!"},
	"placeholder to secret": {
		[]string{"{{API_KEY}}", "sk-live-123"},
		"Authorization: Bearer {{API_KEY}}",
		"Authorization: Bearer sk-live-123",
	},
	"two secrets": {
		[]string{"sk-live-123", "[REDACTED]", "ghp_abc", "[REDACTED]"},
		`{"key":"sk-live-123","gh":"ghp_abc","x":"sk-live-12"}`,
		`{"key":"[REDACTED]","gh":"[REDACTED]","x":"sk-live-12"}`,
	},
}

func TestString(t *testing.T) {
	for name, tc := range replaceCases {
		t.Run(name, func(t *testing.T) {
			r := scrub.New(tc.pairs...)
			if got := r.String(tc.in); got != tc.out {
				t.Errorf("String(%q) = %q, want %q", tc.in, got, tc.out)
			}
			in := []byte(tc.in)
			got := r.Bytes(in)
			if string(got) != tc.out {
				t.Errorf("Bytes(%q) = %q, want %q", tc.in, got, tc.out)
			}
			if string(in) != tc.in {
				t.Errorf("Bytes changed its argument to %q", in)
			}
			if tc.in == tc.out && len(in) > 0 && &got[0] != &in[0] {
				t.Error("Bytes copied an input that holds no pattern")
			}
			if got := naive(tc.pairs, tc.in); got != tc.out {
				t.Errorf("test oracle disagrees: %q", got)
			}
		})
	}
}

func TestReader(t *testing.T) {
	// Each source splits the input differently.
	sources := map[string]func(string) io.Reader{
		"whole":           func(s string) io.Reader { return strings.NewReader(s) },
		"one byte":        func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) },
		"half":            func(s string) io.Reader { return iotest.HalfReader(strings.NewReader(s)) },
		"data with EOF":   func(s string) io.Reader { return iotest.DataErrReader(strings.NewReader(s)) },
		"one byte w/ EOF": func(s string) io.Reader { return iotest.DataErrReader(iotest.OneByteReader(strings.NewReader(s))) },
	}
	for name, tc := range replaceCases {
		t.Run(name, func(t *testing.T) {
			r := scrub.New(tc.pairs...)
			for sname, src := range sources {
				got, err := io.ReadAll(r.Reader(io.NopCloser(src(tc.in))))
				if err != nil || string(got) != tc.out {
					t.Errorf("%s: got %q, %v; want %q", sname, got, err, tc.out)
				}
			}
			for i := range len(tc.in) + 1 { // every split into two reads
				got, err := io.ReadAll(r.Reader(io.NopCloser(&chunks{list: []string{tc.in[:i], tc.in[i:]}})))
				if err != nil || string(got) != tc.out {
					t.Errorf("split at %d: got %q, %v; want %q", i, got, err, tc.out)
				}
			}
			if err := iotest.TestReader(r.Reader(io.NopCloser(strings.NewReader(tc.in))), []byte(tc.out)); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestReaderRandom checks the Reader against a naive implementation on random
// inputs and random chunking. Each time the Reader asks its source for more
// input, the output so far must be the replaced form of all input read so far
// except for a held-back suffix that is a proper prefix of some pattern.
func TestReaderRandom(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 1))
		redact := seed%2 == 0
		var pairs, secrets []string
		for range 1 + rng.IntN(4) {
			// A small alphabet makes overlaps, shared prefixes and partial
			// matches common.
			secret := randString(rng, "abc", 1+rng.IntN(8))
			repl := "[REDACTED]"
			if !redact {
				repl = randString(rng, "abcx", rng.IntN(5))
			}
			pairs = append(pairs, secret, repl)
			secrets = append(secrets, secret)
		}
		var b strings.Builder
		for b.Len() < rng.IntN(3000) {
			switch s := secrets[rng.IntN(len(secrets))]; rng.IntN(3) {
			case 0:
				b.WriteString(s)
			case 1:
				b.WriteString(s[:rng.IntN(len(s))])
			default:
				b.WriteString(randString(rng, "abcxy\n", 1+rng.IntN(10)))
			}
		}
		in := b.String()
		want := naive(pairs, in)
		r := scrub.New(pairs...)
		if got := r.String(in); got != want {
			t.Fatalf("seed %d: String mismatch\n in: %q\ngot: %q\nwant %q", seed, in, got, want)
		}
		if got := r.Bytes([]byte(in)); string(got) != want {
			t.Fatalf("seed %d: Bytes mismatch\n in: %q\ngot: %q\nwant %q", seed, in, got, want)
		}
		if got := streamInPieces(r, in, rng); got != want {
			t.Fatalf("seed %d: Stream mismatch\n in: %q\ngot: %q\nwant %q", seed, in, got, want)
		}

		var out []byte
		src := &randomChunks{rng: rng, data: in}
		src.check = func() {
			read := in[:len(in)-len(src.data)]
			if !heldBackOnly(pairs, read, string(out)) {
				t.Fatalf("seed %d: after reading %q the Reader returned only %q", seed, read, out)
			}
		}
		rd := r.Reader(io.NopCloser(src))
		p := make([]byte, 64)
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
			t.Fatalf("seed %d: Reader mismatch\n in: %q\ngot: %q\nwant %q", seed, in, out, want)
		}
		if redact {
			for _, s := range secrets {
				if strings.Contains(string(out), s) {
					t.Fatalf("seed %d: output %q contains secret %q", seed, out, s)
				}
			}
		}
	}
}

// heldBackOnly reports whether out is the replaced form of read minus a
// suffix no longer than the longest suffix of read that is a proper prefix
// of some pattern.
func heldBackOnly(pairs []string, read, out string) bool {
	limit, longest := 0, 0
	for j := 0; j < len(pairs); j += 2 {
		longest = max(longest, len(pairs[j]))
	}
	for i := max(0, len(read)-longest); i < len(read); i++ {
		for j := 0; j < len(pairs); j += 2 {
			if len(pairs[j]) > len(read)-i && strings.HasPrefix(pairs[j], read[i:]) {
				limit = max(limit, len(read)-i)
			}
		}
	}
	for h := range limit + 1 {
		if naive(pairs, read[:len(read)-h]) == out {
			return true
		}
	}
	return false
}

// TestReaderPrompt proves that the Reader returns output as soon as the
// upstream has produced it: the upstream writer blocks on an io.Pipe until its
// write is consumed, and the Reader may read from upstream once per write.
// A Reader that waited for more input would fail instead of hanging.
func TestReaderPrompt(t *testing.T) {
	type step struct{ write, want string }
	tests := map[string]struct {
		pairs []string
		steps []step
	}{
		"SSE events": {
			pairs: []string{"sk-secret-token", "[REDACTED]"},
			steps: []step{
				{"data: hello\n\n", "data: hello\n\n"},
				{"data: sk-secret-token\n\n", "data: [REDACTED]\n\n"},
				{"data: sk-sec", "data: "}, // "sk-sec" may begin the secret: held back
				{"ret-token\n\n", "[REDACTED]\n\n"},
				{"data: sk-\n\n", "data: sk-\n\n"},
			},
		},
		"hold only the partial after a match": {
			pairs: []string{"abcd", "1", "cdxcZ", "2"},
			steps: []step{{"abcdxc", "1x"}, {"dxcZ", "2"}},
		},
		"prefix of a longer pattern is held": {
			pairs: []string{"ab", "1", "abcd", "2"},
			steps: []step{{"xab", "x"}, {"cyabc", "1cy"}, {"e", "1ce"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pr, pw := io.Pipe()
			reads := 0 // upstream reads the Reader may still make
			src := readerFunc(func(p []byte) (int, error) {
				if reads == 0 {
					t.Error("Reader read from upstream again instead of returning what it had")
					return 0, errors.New("unexpected read")
				}
				reads--
				return pr.Read(p)
			})
			rd := scrub.New(tc.pairs...).Reader(io.NopCloser(src))
			p := make([]byte, 1024)
			for _, st := range tc.steps {
				written := make(chan error)
				go func() {
					_, err := pw.Write([]byte(st.write)) // returns once fully consumed
					written <- err
				}()
				reads = 1
				n, err := rd.Read(p)
				if err != nil || string(p[:n]) != st.want {
					t.Fatalf("after upstream wrote %q: Read = %q, %v; want %q", st.write, p[:n], err, st.want)
				}
				if err := <-written; err != nil {
					t.Fatal(err)
				}
			}
			pw.Close()
			reads = 1
			if n, err := rd.Read(p); n != 0 || err != io.EOF {
				t.Fatalf("at end: Read = %q, %v; want io.EOF", p[:n], err)
			}
		})
	}
}

func TestReaderError(t *testing.T) {
	boom := errors.New("boom")
	src := io.MultiReader(strings.NewReader("abc sec"), iotest.ErrReader(boom))
	closed := false
	rc := struct {
		io.Reader
		io.Closer
	}{src, closerFunc(func() error { closed = true; return nil })}
	rd := scrub.New("secret", "[R]").Reader(rc)

	got, err := io.ReadAll(rd)
	if string(got) != "abc sec" || err != boom {
		t.Errorf("got %q, %v; want held-back bytes flushed, then %v", got, err, boom)
	}
	if _, err := rd.Read(make([]byte, 1)); err != boom {
		t.Errorf("second Read: %v; want sticky %v", err, boom)
	}
	if err := rd.Close(); err != nil || !closed {
		t.Errorf("Close = %v, closed source: %v", err, closed)
	}
}

func TestReaderNoProgress(t *testing.T) {
	src := readerFunc(func([]byte) (int, error) { return 0, nil })
	if _, err := scrub.New("x", "y").Reader(io.NopCloser(src)).Read(make([]byte, 1)); err != io.ErrNoProgress {
		t.Errorf("Read = %v, want io.ErrNoProgress", err)
	}
}

func TestReaderEmptyReplacer(t *testing.T) {
	src := io.NopCloser(strings.NewReader("x"))
	r := scrub.New("", "ignored")
	if !r.Empty() || r.Reader(src) != src {
		t.Error("an empty Replacer must return its source unchanged")
	}
	if scrub.New("a", "b").Empty() {
		t.Error("Empty() = true with a pattern")
	}
}

func TestReaderAllocs(t *testing.T) {
	r := scrub.New("secret-one", "[REDACTED]", "secret-two", "[REDACTED]")
	// Chunks end inside a pattern so every Read also holds bytes back.
	chunk := strings.Repeat("data: secret-one and secret-tw", 1000)
	rd := r.Reader(io.NopCloser(readerFunc(func(p []byte) (int, error) {
		return copy(p, chunk), nil
	})))
	p := make([]byte, 32<<10)
	read := func() {
		if _, err := rd.Read(p); err != nil {
			t.Fatal(err)
		}
	}
	read()
	if n := testing.AllocsPerRun(100, read); n != 0 {
		t.Errorf("%v allocations per Read, want 0", n)
	}
}

func TestHeader(t *testing.T) {
	tests := map[string]struct {
		in, want http.Header
	}{
		"values replaced": {
			in: http.Header{
				"Authorization": {"Bearer sk-1"},
				"X-Plain":       {"plain", "sk-1sk-1"},
				"Set-Cookie":    {"t=sk-1; Path=/"},
			},
			want: http.Header{
				"Authorization": {"Bearer [R]"},
				"X-Plain":       {"plain", "[R][R]"},
				"Set-Cookie":    {"t=[R]; Path=/"},
			},
		},
		// A name cannot take the replacement (not a token), and net/http has changed its
		// case already: a name holding a pattern in any case goes.
		"names holding the pattern, in any case": {
			in:   http.Header{"sk-1": {"sk-1"}, "X-Sk-1": {"a"}, "x-a-SK-1-b": {"b"}, "Sk-": {"sk-1"}, "X-Sk1": {"c"}},
			want: http.Header{"Sk-": {"[R]"}, "X-Sk1": {"c"}},
		},
		"empty": {in: http.Header{}, want: http.Header{}},
		"nil":   {in: nil, want: nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			scrub.New("sk-1", "[R]").Header(tc.in)
			if !reflect.DeepEqual(tc.in, tc.want) {
				t.Errorf("got %v, want %v", tc.in, tc.want)
			}
		})
	}
}

func BenchmarkReader(b *testing.B) {
	r := scrub.New("sk-live-0123456789abcdef", "[REDACTED]", "ghp_0123456789abcdef", "[REDACTED]")
	var body []byte
	for i := 0; len(body) < 1<<20; i++ {
		body = append(body, `{"id":"chatcmpl-123","object":"chat.completion.chunk","choices":[{"delta":{"content":"some text "}}]}`+"\n"...)
		if i%40 == 0 {
			body = append(body, "sk-live-0123456789abcdef ghp_0123456789abcdef\n"...)
		}
	}
	benchmarkReader(b, r, body[:1<<20])
}

func BenchmarkString(b *testing.B) {
	r := scrub.New("sk-live-0123456789abcdef", "[REDACTED]", "ghp_0123456789abcdef", "[REDACTED]")
	s := `{"error":{"message":"Incorrect API key provided: sk-live-0123456789abcdef. You can find your API key at https://example.com/account/api-keys.","type":"invalid_request_error"}}`
	b.SetBytes(int64(len(s)))
	b.ReportAllocs()
	for b.Loop() {
		r.String(s)
	}
}

// naive is an obviously correct leftmost-longest replacer used as the oracle.
func naive(pairs []string, s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		best := -1
		for j := 0; j < len(pairs); j += 2 {
			if pairs[j] != "" && strings.HasPrefix(s[i:], pairs[j]) && (best < 0 || len(pairs[j]) > len(pairs[best])) {
				best = j
			}
		}
		if best < 0 {
			b.WriteByte(s[i])
			i++
			continue
		}
		b.WriteString(pairs[best+1])
		i += len(pairs[best])
	}
	return b.String()
}

func randString(rng *rand.Rand, alphabet string, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return string(b)
}

// randomChunks returns data in random chunks of 0 to 16 bytes, sometimes
// with io.EOF on the last one. It calls check before each read.
type randomChunks struct {
	rng   *rand.Rand
	data  string
	check func()
}

func (c *randomChunks) Read(p []byte) (int, error) {
	c.check()
	if c.data == "" {
		return 0, io.EOF
	}
	n := copy(p, c.data[:min(len(c.data), c.rng.IntN(17))])
	c.data = c.data[n:]
	if c.data == "" && c.rng.IntN(2) == 0 {
		return n, io.EOF
	}
	return n, nil
}

// chunks returns each string of list from its own Read call.
type chunks struct{ list []string }

func (c *chunks) Read(p []byte) (int, error) {
	if len(c.list) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.list[0])
	if c.list[0] = c.list[0][n:]; c.list[0] == "" {
		c.list = c.list[1:]
	}
	return n, nil
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

func BenchmarkStringNoMatch(b *testing.B) {
	r := scrub.New("sk-live-0123456789abcdef", "[REDACTED]", "ghp_0123456789abcdef", "[REDACTED]")
	s := "application/json; charset=utf-8"
	b.SetBytes(int64(len(s)))
	b.ReportAllocs()
	for b.Loop() {
		r.String(s)
	}
}

// BenchmarkHeader scrubs a typical response header set, one value of which holds a secret.
func BenchmarkHeader(b *testing.B) {
	r := scrub.New("sk-live-0123456789abcdef", "[REDACTED]", "ghp_0123456789abcdef", "[REDACTED]")
	h := http.Header{
		"Content-Type":          {"application/json"},
		"Date":                  {"Wed, 02 Dec 2026 12:00:00 GMT"},
		"Server":                {"upstream"},
		"X-Request-Id":          {"req_0123456789"},
		"Www-Authenticate":      {`Bearer realm="api", error="invalid_token", token="sk-live-0123456789abcdef"`},
		"Cache-Control":         {"no-store"},
		"X-Ratelimit-Remaining": {"4999"},
	}
	b.ReportAllocs()
	for b.Loop() {
		c := h.Clone()
		r.Header(c)
	}
}

// BenchmarkReaderSmall scrubs a response the size of a short API answer, as most are.
func BenchmarkReaderSmall(b *testing.B) {
	r := scrub.New("sk-live-0123456789abcdef", "[REDACTED]", "ghp_0123456789abcdef", "[REDACTED]")
	benchmarkReader(b, r, []byte(`{"id":"chatcmpl-bench","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}`))
}

// benchmarkReader scrubs body with r as the tunnel does: reads of up to 32 KiB to the end,
// then Close, which gives the reader's buffers back to the pool.
func benchmarkReader(b *testing.B, r *scrub.Replacer, body []byte) {
	p := make([]byte, 32<<10)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		rd := r.Reader(io.NopCloser(bytes.NewReader(body)))
		for {
			if _, err := rd.Read(p); err == io.EOF {
				break
			} else if err != nil {
				b.Fatal(err)
			}
		}
		rd.Close()
	}
}

// TestReaderGrowsBuffer checks the reader across its growth from the first small buffer to the
// full one, with secrets straddling the buffer boundaries.
func TestReaderGrowsBuffer(t *testing.T) {
	const secret = "sk-live-0123456789abcdef"
	r := scrub.New(secret, "[REDACTED]")
	var body strings.Builder
	for body.Len() < 200<<10 {
		body.WriteString(strings.Repeat("x", 4096-body.Len()%4096-7))
		body.WriteString(secret)
		body.WriteString(" some text\n")
	}
	want := strings.ReplaceAll(body.String(), secret, "[REDACTED]")
	for _, chunk := range []int{1, 100, 4096, 5000, 64 << 10} {
		got, err := io.ReadAll(r.Reader(io.NopCloser(&chunked{s: body.String(), n: chunk})))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("chunk %d: scrubbed body differs from strings.ReplaceAll", chunk)
		}
	}
}

// chunked returns at most n bytes of s per Read.
type chunked struct {
	s string
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if c.s == "" {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.n)], c.s)
	c.s = c.s[n:]
	return n, nil
}

// TestReaderReturnsTheEndWithTheLastBytes: a body that ends in the read that delivers its
// last bytes is passed on as one read, so the tunnel writes the end of a small response and
// its bytes together (one TLS record, one write) instead of flushing twice.
func TestReaderReturnsTheEndWithTheLastBytes(t *testing.T) {
	r := scrub.New("s3cret", "[REDACTED]").Reader(io.NopCloser(iotest.DataErrReader(strings.NewReader(`{"token":"s3cret"}`))))
	buf := make([]byte, 1024)
	n, err := r.Read(buf)
	if err != io.EOF || string(buf[:n]) != `{"token":"[REDACTED]"}` {
		t.Fatalf("Read = %q, %v; want the whole body with io.EOF", buf[:n], err)
	}
}

// TestClosedReaderGivesNothing: Close gives the reader's buffers to the next response, so a
// read after Close must not return bytes from them.
func TestClosedReaderGivesNothing(t *testing.T) {
	r := scrub.New("s3cret", "[REDACTED]")
	first := r.Reader(io.NopCloser(strings.NewReader("first body s3cret, long enough to stay buffered")))
	buf := make([]byte, 4)
	if _, err := first.Read(buf); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second := r.Reader(io.NopCloser(strings.NewReader("second body")))
	got, err := io.ReadAll(second)
	if err != nil || string(got) != "second body" {
		t.Fatalf("second reader: %q, %v", got, err)
	}
	if n, err := first.Read(buf); n != 0 || err == nil {
		t.Fatalf("read after Close = %d, %v", n, err)
	}
	if err := first.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// streamInPieces passes in through r.Stream in random pieces, each after what the last one
// left, as a caller framing its own output does.
func streamInPieces(r *scrub.Replacer, in string, rng *rand.Rand) string {
	var out, held []byte
	for rest := in; ; {
		n := min(len(rest), rng.IntN(40))
		final := n == len(rest)
		held = append(held, rest[:n]...)
		rest = rest[n:]
		var taken int
		out, taken = r.Stream(out, held, final)
		held = append(held[:0], held[taken:]...)
		if final {
			return string(out)
		}
	}
}

// TestMasking: a masking Replacer keeps every length, and replaces what the Replacer does.
func TestMasking(t *testing.T) {
	r := scrub.New("sk-0123456789abcdef", "[REDACTED]", "short123", "[REDACTED]")
	m := r.Masking()
	in := "a sk-0123456789abcdef b short123 c"
	got := m.String(in)
	if got != "a [REDACTED]********* b ******** c" || len(got) != len(in) || m.MaxLen() != r.MaxLen() || r.MaxLen() != 19 {
		t.Fatalf("masked %q (%d bytes, in %d); MaxLen %d", got, len(got), len(in), m.MaxLen())
	}
	if !scrub.New().Masking().Empty() {
		t.Fatal("masking nothing masks something")
	}
}

// TestFollowing: a Following Replacer's reader, String and Stream use the patterns in force
// when the bytes were read, so that a secret added while a stream is open is replaced in what
// is read after, across reads, with a longer pattern than any before.
func TestFollowing(t *testing.T) {
	var cur atomic.Pointer[scrub.Replacer]
	cur.Store(scrub.New())
	f := scrub.Following(func() *scrub.Replacer { return cur.Load() })
	if f.Empty() {
		t.Fatal("a Following Replacer is Empty")
	}
	pr, pw := io.Pipe()
	r := f.Reader(pr)
	read := func(n int) string {
		b := make([]byte, n)
		m, _ := io.ReadFull(r, b)
		return string(b[:m])
	}
	go func() { _, _ = pw.Write([]byte("open\n")) }()
	if got := read(5); got != "open\n" {
		t.Fatalf("first read: %q", got)
	}
	secret := strings.Repeat("s3cr3t-", 300) // longer than the first buffer
	cur.Store(scrub.New(secret, "[REDACTED]"))
	go func() {
		for i := 0; i < len(secret); i += 7 {
			_, _ = pw.Write([]byte(secret[i:min(i+7, len(secret))]))
		}
		_, _ = pw.Write([]byte("\nend"))
		pw.Close()
	}()
	rest, _ := io.ReadAll(r)
	if string(rest) != "[REDACTED]\nend" {
		t.Errorf("after the secret was added: %q", rest)
	}
	if got := f.String("a " + secret); got != "a [REDACTED]" {
		t.Errorf("String: %q", got)
	}
	if got, _ := f.Stream(nil, []byte(secret), true); string(got) != "[REDACTED]" {
		t.Errorf("Stream: %q", got)
	}
}
