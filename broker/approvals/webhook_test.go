package approvals

import (
	"context"
	"encoding/json"
	"github.com/capbroker/capbroker/internal/svcdial/svcdialtest"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A receiver that fails twice, then accepts: the message arrives once it recovers, signed,
// with a link to the console; the failures are counted.
func TestWebhookRetriesUntilDelivered(t *testing.T) {
	var mu sync.Mutex
	var bodies []string
	var sigs []string
	got := make(chan struct{}, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		bodies = append(bodies, string(b))
		sigs = append(sigs, r.Header.Get("X-Capbroker-Signature"))
		if len(bodies) <= 2 {
			http.Error(w, "down", http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusOK)
		got <- struct{}{}
	}))
	defer srv.Close()
	m := NewMetrics(prometheus.NewRegistry())
	var rec svcdialtest.Recorder
	hook := &Webhook{Dial: rec.Dial, URL: srv.URL, Secret: []byte("hmac-key"), ConsoleURL: "http://127.0.0.1:9090/console/", Metrics: m, Backoff: time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hook.Start(ctx)
	r := req("a1", "DELETE", "/v1/things/7")
	r.ID, r.Expires = "ap-123", time.Now()
	hook.Notify(r)
	select {
	case <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("never delivered")
	}
	if rec.Count() == 0 {
		t.Fatal("the webhook did not dial through its injected Dial")
	}
	// Messages are sent one after the other: once the next one arrives, the first one's
	// delivery has been counted.
	hook.Notify(r)
	<-got
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 4 {
		t.Fatalf("%d attempts", len(bodies))
	}
	var msg map[string]any
	if err := json.Unmarshal([]byte(bodies[2]), &msg); err != nil {
		t.Fatal(err)
	}
	text, _ := msg["text"].(string)
	if !strings.Contains(text, "http://127.0.0.1:9090/console/#approval-ap-123") || !strings.Contains(text, "DELETE https://api.example.com/v1/things/7") || !strings.Contains(text, "a1") {
		t.Fatalf("text: %q", text)
	}
	if sigs[2] != Sign([]byte("hmac-key"), []byte(bodies[2])) || !strings.HasPrefix(sigs[2], "sha256=") {
		t.Fatalf("signature %q", sigs[2])
	}
	for outcome, want := range map[string]float64{"retry": 2, "failed": 0} {
		if got := value(m.webhooks.WithLabelValues(outcome)); got != want {
			t.Errorf("%s: %v", outcome, got)
		}
	}
	if got := value(m.webhooks.WithLabelValues("ok")); got < 1 { // the second message's may be counted too
		t.Errorf("ok: %v", got)
	}
}

func TestWebhookGivesUp(t *testing.T) {
	attempts := make(chan struct{}, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts <- struct{}{}
		http.Error(w, "down", http.StatusInternalServerError)
	}))
	defer srv.Close()
	m := NewMetrics(prometheus.NewRegistry())
	var rec svcdialtest.Recorder
	hook := &Webhook{Dial: rec.Dial, URL: srv.URL, Metrics: m, Attempts: 3, Backoff: time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hook.Start(ctx)
	hook.Notify(req("a1", "GET", "/"))
	hook.Notify(req("a1", "GET", "/2"))
	for i := 0; i < 6; i++ {
		<-attempts
	}
	// The second message's last attempt is counted once the third attempt returns; a third
	// message is sent after it, in order.
	hook.Notify(req("a1", "GET", "/3"))
	<-attempts
	if got := value(m.webhooks.WithLabelValues("failed")); got != 2 {
		t.Fatalf("failed %v", got)
	}
	if got := value(m.webhooks.WithLabelValues("retry")); got < 4 { // the third message's may be counted too
		t.Fatalf("retries %v", got)
	}
}

// TestWebhookMessageEscapesAndShowsWhatIsApproved: agent-chosen text (path, reason) cannot
// become a link or a mention in the chat; the port, query values and credentials are shown.
func TestWebhookMessageEscapesAndShowsWhatIsApproved(t *testing.T) {
	hook := &Webhook{ConsoleURL: "https://broker.test/console/"}
	r := req("a1", "DELETE", "/v1/<http://evil.test|click>")
	r.ID, r.Port = "ap-1", 8443
	r.Reason = "DELETE <!channel> & <https://evil.test|approve here> [Approve](https://evil.test) `break out https://evil.test"
	r.Query = map[string][]string{"force": {"true"}, "cascade": {"yes"}}
	r.Credentials = []string{"prod_api"}
	r.BodySize, r.BodyTruncated = 5000, true
	var msg struct {
		Text      string         `json:"text"`
		Capbroker map[string]any `json:"capbroker"`
	}
	if err := json.Unmarshal(hook.Message(r), &msg); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(msg.Text, "<>") || strings.Contains(msg.Text, "& ") {
		t.Fatalf("unescaped: %q", msg.Text)
	}
	for _, want := range []string{
		"`DELETE https://api.example.com:8443/v1/&lt;http://evil.test|click&gt;?cascade=yes&amp;force=true`",
		"Reason: `DELETE &lt;!channel&gt; &amp; &lt;https://evil.test|approve here&gt; [Approve](https://evil.test) 'break out https://evil.test`.",
		"attaches the credentials prod_api", "5000 bytes", "first 2048",
		"https://broker.test/console/#approval-ap-1",
	} {
		if !strings.Contains(msg.Text, want) {
			t.Errorf("text lacks %q: %q", want, msg.Text)
		}
	}
	if msg.Capbroker["port"] != float64(8443) || msg.Capbroker["body_truncated"] != true {
		t.Errorf("summary: %v", msg.Capbroker)
	}
}

// TestWebhookMessageNamesThePort: the chat message names the port of every target that is not
// its scheme's own, for a CONNECT, plain HTTP and an IPv6 address alike.
func TestWebhookMessageNamesThePort(t *testing.T) {
	hook := &Webhook{ConsoleURL: "https://broker.test/console/"}
	for _, c := range []struct {
		phase, scheme, host string
		port                int
		want                string
	}{
		{"connect", "https", "api.example.com", 8443, "`a connection to api.example.com:8443`"},
		{"connect", "https", "api.example.com", 443, "`a connection to api.example.com:443`"},
		{"request", "http", "api.example.com", 8080, "`GET http://api.example.com:8080/x`"},
		{"request", "http", "api.example.com", 80, "`GET http://api.example.com/x`"},
		{"request", "https", "::1", 8443, "`GET https://[::1]:8443/x`"},
		{"request", "https", "::1", 443, "`GET https://[::1]/x`"},
	} {
		r := req("a1", "GET", "/x")
		r.Phase, r.Scheme, r.Host, r.Port = c.phase, c.scheme, c.host, c.port
		var msg struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal(hook.Message(r), &msg); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(msg.Text, c.want) {
			t.Errorf("%s %s://%s:%d: %q lacks %q", c.phase, c.scheme, c.host, c.port, msg.Text, c.want)
		}
	}
}
