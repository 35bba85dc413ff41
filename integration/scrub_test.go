package integration

// Scrubbing attacks: an upstream on a host with a credential reflects the key it was given
// wherever in a response it can, and in the encodings it likes; the agent must get no key and
// no key fragment back, in any of them, and the audit log none either.

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"
)

// keyOf is the canary key in a request the broker injected it into.
func keyOf(r *http.Request) string {
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
}

// scrubExchange sends one raw request on a fresh intercepted tunnel and returns the response,
// its body, and every byte of the response as it came (head, body framing, trailers).
func (e *env) scrubExchange(t *testing.T, raw string) (*http.Response, string, string) {
	t.Helper()
	conn := e.dialTunnel(t, e.up.Listener.Addr().String())
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(waitTimeout))
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	var wire bytes.Buffer
	resp, err := http.ReadResponse(bufio.NewReader(io.TeeReader(conn, &wire)), nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return resp, string(body), wire.String()
}

func (e *env) get(path string, headers ...string) string {
	h := ""
	for _, x := range headers {
		h += x + "\r\n"
	}
	return fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\n%s\r\n", path, e.up.Listener.Addr(), h)
}

// leaked returns the fragment of key (8 bytes or more) that can be read from out, as it is or
// decoded as percent-escapes, JSON escapes, base64 (either alphabet, at every offset) or hex
// (at both offsets), in any letter case; "" if none.
func leaked(out, key string) string {
	decoded := []string{out}
	if u, err := url.QueryUnescape(out); err == nil {
		decoded = append(decoded, u)
	}
	for _, m := range regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`).FindAllStringSubmatch(out, -1) {
		var s string
		if json.Unmarshal([]byte(`"`+m[1]+`"`), &s) == nil {
			decoded = append(decoded, s)
		}
	}
	for _, run := range regexp.MustCompile(`[A-Za-z0-9+/_-]{8,}`).FindAllString(out, -1) {
		std := strings.NewReplacer("-", "+", "_", "/").Replace(run)
		for off := range 4 {
			s := std[off:]
			if d, err := base64.StdEncoding.DecodeString(s[:len(s)/4*4]); err == nil {
				decoded = append(decoded, string(d))
			}
		}
	}
	for _, run := range regexp.MustCompile(`[0-9a-fA-F]{8,}`).FindAllString(out, -1) {
		for off := range 2 {
			s := run[off:]
			if d, err := hex.DecodeString(s[:len(s)/2*2]); err == nil {
				decoded = append(decoded, string(d))
			}
		}
	}
	// The canary's first bytes, "sk-canary-", are the same in every test: its fragments
	// are the windows that reach into its random part.
	for i := len("sk-canary-") - 7; i+8 <= len(key); i++ {
		for _, d := range decoded {
			if strings.Contains(strings.ToLower(d), strings.ToLower(key[i:i+8])) {
				return key[i : i+8]
			}
		}
	}
	return ""
}

// TestScrubHeaderNames: an upstream puts the key into the names of header and trailer
// fields. Those fields never reach the agent, under any letter case; a value holding the key
// is scrubbed and kept.
func TestScrubHeaderNames(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := keyOf(r)
		w.Header()["X-Leak-"+key] = []string{"1"} // written as it is, not canonical
		w.Header()["x-lower-"+key] = []string{"2"}
		w.Header().Set("X-Value", "k="+key)
		w.Header().Set("Trailer", "X-T-"+key)
		w.WriteHeader(200)
		io.WriteString(w, "body")
		w.(http.Flusher).Flush() // chunked, so that there are trailers
		w.Header().Set("X-T-"+key, "t")
		w.Header().Set(http.TrailerPrefix+"X-Late-"+key, "late")
		w.Header().Set(http.TrailerPrefix+"X-Late-Ok", "v="+key)
	})
	e := newEnv(t, envOpts{handler: h})
	resp, body, wire := e.scrubExchange(t, e.get("/api/custom/names"))
	if resp.StatusCode != 200 || body != "body" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	if frag := leaked(wire, e.canary); frag != "" {
		t.Fatalf("the agent got %q of the key in:\n%s", frag, wire)
	}
	if resp.Header.Get("X-Value") != "k=[REDACTED]" || resp.Trailer.Get("X-Late-Ok") != "v=[REDACTED]" {
		t.Errorf("X-Value %q, trailer X-Late-Ok %q: want them scrubbed and kept", resp.Header.Get("X-Value"), resp.Trailer.Get("X-Late-Ok"))
	}
	// Over HTTP/2 every name reaches the agent in lower case.
	out, err := e.curl("-i", "--http2", e.url("/api/custom/names"))
	if err != nil || !hasStatus(out, 200) || !strings.HasPrefix(out, "HTTP/2") {
		t.Fatalf("curl --http2: %v\n%s", err, out)
	}
	if frag := leaked(out, e.canary); frag != "" {
		t.Fatalf("the agent got %q of the key over HTTP/2:\n%s", frag, out)
	}
	if got := e.received(); len(got) != 2 || keyOf(got[0]) != e.canary || keyOf(got[1]) != e.canary {
		t.Fatalf("the upstream did not get the key: %d requests", len(got))
	}
	e.broker.waitAuditWhere(t, 2, "the two requests' events", func(ev auditEvent) bool {
		return ev["path"] == "/api/custom/names" && ev["status"] == float64(200)
	})
}

// TestScrubReasonPhrase: the reason phrase of a status line is the upstream's text; the agent
// gets the standard one, on a 101 (whose status line the broker writes itself) and on others.
func TestScrubReasonPhrase(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := keyOf(r)
		conn, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			fmt.Fprintf(rw, "HTTP/1.1 101 %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\nX-%s: 1\r\n\r\n",
				key, wsAccept(r.Header.Get("Sec-WebSocket-Key")), key)
			rw.Write(wsFrame(true, 0x1, []byte("k="+key), false))
			rw.Write(wsFrame(true, 0x8, nil, false))
		} else {
			fmt.Fprintf(rw, "HTTP/1.1 200 %s\r\nContent-Length: 2\r\n\r\nok", key)
		}
		rw.Flush() // and closes: the broker then closes the agent's upgraded connection
	})
	e := newEnv(t, envOpts{handler: h})

	_, _, wire := e.scrubExchange(t, e.get("/api/custom/status", "Connection: close"))
	if line, _, _ := strings.Cut(wire, "\r\n"); line != "HTTP/1.1 200 OK" {
		t.Errorf("status line %q, want the standard one", line)
	}
	if frag := leaked(wire, e.canary); frag != "" {
		t.Errorf("the agent got %q of the key in:\n%s", frag, wire)
	}

	conn := e.dialTunnel(t, e.up.Listener.Addr().String())
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(waitTimeout))
	io.WriteString(conn, e.get("/api/custom/ws", "Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="))
	all, _ := io.ReadAll(conn) // the upstream closes after its close frame
	head, frames, _ := strings.Cut(string(all), "\r\n\r\n")
	if line, _, _ := strings.Cut(head, "\r\n"); line != "HTTP/1.1 101 Switching Protocols" {
		t.Errorf("status line %q, want the standard one", line)
	}
	if frag := leaked(string(all), e.canary); frag != "" {
		t.Errorf("the agent got %q of the key in:\n%q", frag, all)
	}
	if !strings.Contains(frames, "k=[REDACTED]") {
		t.Errorf("the server's frame reached the agent as %q", frames)
	}
}

// TestScrubContentEncodingLines: the codings of every Content-Encoding line count. One gzip
// layer, whatever lines say it, is removed and the body scrubbed; two layers, or gzip and
// another coding, are refused with a 502 that the audit log explains.
func TestScrubContentEncodingLines(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		w.Header()["Content-Encoding"] = q["ce"]
		var body bytes.Buffer
		body.WriteString("auth=" + r.Header.Get("Authorization") + " end")
		for range len(q.Get("layers")) {
			var z bytes.Buffer
			zw := gzip.NewWriter(&z)
			zw.Write(body.Bytes())
			zw.Close()
			body = z
		}
		w.Write(body.Bytes())
	})
	e := newEnv(t, envOpts{handler: h})
	for name, c := range map[string]struct {
		query string
		want  int
	}{
		"identity, then gzip, two lines": {"ce=identity&ce=gzip&layers=1", 200},
		"identity, gzip, one line":       {"ce=identity,%20gzip&layers=1", 200},
		"gzip, then identity":            {"ce=gzip&ce=identity&layers=1", 200},
		"gzip twice, two lines":          {"ce=gzip&ce=gzip&layers=11", 502},
		"gzip twice, one line":           {"ce=gzip,gzip&layers=11", 502},
		"identity, gzip, gzip":           {"ce=identity&ce=gzip,%20gzip&layers=11", 502},
		"gzip, then br":                  {"ce=gzip&ce=br&layers=1", 502},
	} {
		t.Run(name, func(t *testing.T) {
			resp, body, wire := e.scrubExchange(t, e.get("/api/custom/gzip?"+c.query, "Connection: close"))
			if resp.StatusCode != c.want {
				t.Fatalf("status %d, want %d: %q", resp.StatusCode, c.want, body)
			}
			if c.want == 200 && (body != "auth=Bearer [REDACTED] end" || resp.Header.Get("Content-Encoding") != "") {
				t.Errorf("body %q, Content-Encoding %q: want it decoded and scrubbed", body, resp.Header.Get("Content-Encoding"))
			}
			// However many gzip layers the agent peels off what it got, no key.
			for b := []byte(body); len(b) > 0; {
				if frag := leaked(string(b)+wire, e.canary); frag != "" {
					t.Fatalf("the agent got %q of the key", frag)
				}
				zr, err := gzip.NewReader(bytes.NewReader(b))
				if err != nil {
					break
				}
				b, _ = io.ReadAll(zr)
			}
			if c.want == 502 {
				ev := e.broker.waitAudit(t, resp.Header.Get("X-Broker-Request-Id"))
				if msg, _ := ev["error"].(string); ev["status"] != float64(502) || !strings.Contains(msg, "gzip") {
					t.Errorf("audit event: %v", ev)
				}
			}
		})
	}
}

// TestScrubEncodedReflections: an upstream reflects a header-mode key, and the header's whole
// value, in the encodings upstreams use: URL query and path escaping (upper- and lower-case
// hex), base64 in both alphabets with and without padding, at every alignment in longer
// text, hex in both cases, and JSON as Go, JavaScript, PHP and Gson write it. A second
// credential whose key has the characters those encoders treat differently (/ + = < > & ')
// is reflected the same way. No fragment of either key reaches the agent.
func TestScrubEncodedReflections(t *testing.T) {
	special := "sk-canary-" + randHex(6) + "/<" + randHex(6) + "&>'" + randHex(6) + "+=="
	lower := func(s string) string {
		return regexp.MustCompile(`%[0-9A-F]{2}`).ReplaceAllStringFunc(s, strings.ToLower)
	}
	reflect := func(w io.Writer, v string) {
		texts := []string{v, "a" + v, "ab" + v, "x=" + v + "&y=1"}
		for _, s := range texts {
			b, _ := json.Marshal(map[string]string{"go": s})
			var js bytes.Buffer
			enc := json.NewEncoder(&js)
			enc.SetEscapeHTML(false)
			enc.Encode(map[string]string{"js": s})
			php := strings.ReplaceAll(js.String(), "/", `\/`)
			gson := strings.NewReplacer("<", `\u003c`, ">", `\u003e`, "&", `\u0026`, "=", `\u003d`, "'", `\u0027`).Replace(js.String())
			for _, form := range []string{
				url.QueryEscape(s), url.PathEscape(s), lower(url.QueryEscape(s)), lower(url.PathEscape(s)),
				base64.StdEncoding.EncodeToString([]byte(s)), base64.URLEncoding.EncodeToString([]byte(s)),
				base64.RawStdEncoding.EncodeToString([]byte(s)), base64.RawURLEncoding.EncodeToString([]byte(s)),
				hex.EncodeToString([]byte(s)), strings.ToUpper(hex.EncodeToString([]byte(s))),
				string(b), strings.TrimSpace(js.String()), strings.TrimSpace(php), strings.TrimSpace(gson),
			} {
				fmt.Fprintf(w, "<%s>\n", form)
			}
		}
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Base64", base64.StdEncoding.EncodeToString([]byte(r.Header.Get("Authorization"))))
		w.Header().Set("X-Special-Echo", r.Header.Get("X-Special"))
		var b bytes.Buffer
		reflect(&b, r.Header.Get("Authorization")) // "Bearer <key>", the header's whole value
		reflect(&b, keyOf(r))
		reflect(&b, r.Header.Get("X-Special"))
		if r.URL.Query().Has("whole") { // scrubbed whole, rather than as it streams
			w.Header().Set("Content-Length", fmt.Sprint(b.Len()))
		}
		w.Write(b.Bytes())
	})
	e := newEnv(t, envOpts{
		handler: h,
		policy:  strings.Replace(testPolicy, `decision := {"allow": true, "credentials": ["canary"]} if {`, `decision := {"allow": true, "credentials": ["canary", "special"]} if {`, 1),
		extraCredentials: `  - name: special
    hosts: ["127.0.0.1"]
    source: {env: SPECIAL_SECRET}
    inject: {header: X-Special, value: "{{secret}}"}
`,
		env: []string{"SPECIAL_SECRET=" + special},
	})
	for _, path := range []string{"/api/custom/reflect", "/api/custom/reflect?whole"} {
		resp, body, wire := e.scrubExchange(t, e.get(path))
		if resp.StatusCode != 200 || !strings.Contains(body, "[REDACTED]") {
			t.Fatalf("%d: %s", resp.StatusCode, body)
		}
		for _, key := range []string{e.canary, special} {
			for _, line := range strings.Split(wire, "\n") {
				if frag := leaked(line, key); frag != "" {
					t.Errorf("the agent got %q of %q in %q", frag, key, line)
				}
			}
		}
	}
	got := e.received()
	if len(got) != 2 || keyOf(got[0]) != e.canary || got[0].Header.Get("X-Special") != special {
		t.Fatal("the upstream did not get both keys")
	}
	e.broker.stop(t)
	if strings.Contains(strings.Join(e.broker.auditLog.snapshot(), "\n")+e.broker.logs.String(), special) {
		t.Error("the second key is in the broker's logs")
	}
}

// TestScrubRangeRequests: two Range requests, each for part of a reflection, would each hold a
// fragment too short to scrub. The broker asks the upstream for each range widened by the
// secret's length on both sides, masks the secret in place (same length) and cuts the range
// out: each answer is a 206 of exactly the bytes asked for, they join into the masked whole,
// and no fragment of the key is in either. An If-Range the upstream does not match gets the
// whole, scrubbed; a 206 the broker did not ask for is refused with a 502.
func TestScrubRangeRequests(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		text := "auth=" + r.Header.Get("Authorization") + " end"
		if r.URL.Query().Has("always206") { // whatever was asked
			w.Header().Set("Content-Range", fmt.Sprintf("bytes 0-19/%d", len(text)))
			w.WriteHeader(http.StatusPartialContent)
			io.WriteString(w, text[:20])
			return
		}
		http.ServeContent(w, r, "k.txt", time.Unix(1e9, 0), strings.NewReader(text))
	})
	e := newEnv(t, envOpts{handler: h})
	var joined, joinedWire string
	for _, rng := range []string{"bytes=0-19", "bytes=20-"} {
		resp, body, wire := e.scrubExchange(t, e.get("/api/custom/range", "Range: "+rng))
		if resp.StatusCode != 206 || int64(len(body)) != resp.ContentLength {
			t.Errorf("Range %s: %d %q (length %d); want a 206 of the range", rng, resp.StatusCode, body, resp.ContentLength)
		}
		joined += body
		joinedWire += wire
	}
	whole := "auth=Bearer " + e.canary + " end"
	if len(joined) != len(whole) || !strings.HasPrefix(joined, "auth=Bearer [REDACTED]") || !strings.HasSuffix(joined, " end") {
		t.Errorf("the ranges joined: %q; want the whole, %d bytes, the key masked in place", joined, len(whole))
	}
	if frag := leaked(joinedWire, e.canary); frag != "" {
		t.Errorf("the agent got %q of the key across the two responses", frag)
	}
	for _, r := range e.received() {
		if r.Header.Get("Range") == "bytes=0-19" || r.Header.Get("Range") == "bytes=20-" {
			t.Errorf("the upstream got the agent's Range %q, not widened", r.Header.Get("Range"))
		}
	}

	resp, body, _ := e.scrubExchange(t, e.get("/api/custom/range", "Range: bytes=0-19", `If-Range: "x"`))
	if resp.StatusCode != 200 || body != "auth=Bearer [REDACTED] end" {
		t.Errorf("If-Range not matched: %d %q; want the whole body, scrubbed", resp.StatusCode, body)
	}

	resp, body, _ = e.scrubExchange(t, e.get("/api/custom/range?always206", "Connection: close"))
	if resp.StatusCode != 502 || leaked(body, e.canary) != "" {
		t.Fatalf("an upstream's 206: %d %q; want a 502", resp.StatusCode, body)
	}
	ev := e.broker.waitAudit(t, resp.Header.Get("X-Broker-Request-Id"))
	if msg, _ := ev["error"].(string); ev["status"] != float64(502) || !strings.Contains(msg, "byte range") {
		t.Errorf("audit event: %v", ev)
	}
}
