package broker

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capbroker/capbroker/broker/http1"
	"github.com/capbroker/capbroker/broker/upstream"
)

// failingUpstream answers with a body of unknown length that fails after its first bytes, as
// an upstream connection reset mid-response does.
type failingUpstream struct{ memoryUpstream }

func (failingUpstream) RoundTrip(r *http.Request, _ upstream.Pool) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, r.Body)
	body := io.MultiReader(strings.NewReader(strings.Repeat("x", 8<<10)), resetReader{})
	return &http.Response{StatusCode: 200, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"text/plain"}}, Body: io.NopCloser(body), ContentLength: -1, Request: r}, nil
}

type resetReader struct{}

func (resetReader) Read([]byte) (int, error) { return 0, errors.New("connection reset by upstream") }

// TestCutShortResponseNotWhole: a response whose upstream body fails half way does not reach
// the agent as a whole one (a chunked body properly ended): the tunnel ends without its end.
func TestCutShortResponseNotWhole(t *testing.T) {
	b, tun := testBroker(t, testConfig(t), Deps{Policy: allowAll{}, Secrets: benchSecrets{}}, failingUpstream{}, "api.example.com")
	agent, srv := net.Pipe()
	defer agent.Close()
	s := &http1.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { b.serveTunnel(w, r, tun) }),
		ReadHeaderTimeout: time.Second, IdleTimeout: time.Second, MaxHeaderBytes: 1 << 16, Linger: time.Hour}
	ended := make(chan struct{})
	go s.NewConn(srv, func() { close(ended) }).Serve()
	go io.WriteString(agent, "GET /stream HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(agent), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("%d bytes, %v: want the body cut short", len(body), err)
	}
	<-ended
}
