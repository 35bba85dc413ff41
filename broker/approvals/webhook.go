package approvals

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"github.com/capbroker/capbroker/internal/svcdial"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// Webhook posts a chat message for each held request: {"text": ...} as Slack's and
// Mattermost's incoming webhooks take it, with a link to the request in the console, and the
// request's summary under "capbroker". Deliveries are retried with exponential backoff, a
// bounded number of times; failures are counted in capbroker_webhook_deliveries_total.
type Webhook struct {
	URL        string
	Secret     []byte // HMAC-SHA256 key of X-Capbroker-Signature; nil for none
	ConsoleURL string
	Metrics    *Metrics
	Log        zerolog.Logger
	// Attempts (default 5) and Backoff, the first wait between them (default 1s, doubling).
	Attempts int
	Backoff  time.Duration
	Client   *http.Client
	// Dial makes the connections of the default Client (cmd/broker: upstream.Dialer's
	// DialService, which follows upstream.proxy). Without Client and Dial nothing is sent.
	Dial svcdial.Func

	queue chan Request
}

// webhookQueue bounds the messages waiting to be sent; beyond, a message is dropped (counted).
const webhookQueue = 256

// Start sends messages until ctx ends.
func (w *Webhook) Start(ctx context.Context) {
	if w.Attempts <= 0 {
		w.Attempts = 5
	}
	if w.Backoff <= 0 {
		w.Backoff = time.Second
	}
	if w.Client == nil {
		// No proxy from the environment: the broker's own traffic does not go through itself.
		w.Client = &http.Client{Timeout: 10 * time.Second, Transport: svcdial.Transport(w.Dial, nil, 0)}
	}
	w.queue = make(chan Request, webhookQueue)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case r := <-w.queue:
				w.deliver(ctx, r)
			}
		}
	}()
}

// Notify queues the message for a new held request; it never blocks.
func (w *Webhook) Notify(r Request) {
	select {
	case w.queue <- r:
	default:
		w.Metrics.webhooks.WithLabelValues("dropped").Inc()
		w.Log.Warn().Str("approval", r.ID).Msg("webhook queue full; message dropped")
	}
}

// Message is the JSON body of a webhook post. Its text is escaped as Slack's and Mattermost's
// message formatting asks (&, < and > as entities): a path or a reason carrying an agent's
// words cannot become a link, a mention or markup in the approver's chat.
func (w *Webhook) Message(r Request) []byte {
	link := strings.TrimRight(w.ConsoleURL, "/") + "/#approval-" + r.ID
	target := "a connection to " + net.JoinHostPort(r.Host, strconv.Itoa(r.Port))
	if r.Phase != "connect" {
		target = r.Method + " " + r.URL()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "capbroker: agent %s asks for %s.", r.Agent, code(target))
	if reason := strings.TrimSpace(r.Reason); reason != "" {
		fmt.Fprintf(&b, " Reason: %s.", code(reason))
	}
	if len(r.Credentials) > 0 {
		fmt.Fprintf(&b, " Approving attaches the credentials %s.", strings.Join(r.Credentials, ", "))
	}
	if r.BodySize > 0 {
		fmt.Fprintf(&b, " Body: %d bytes", r.BodySize)
		if r.BodyTruncated {
			fmt.Fprintf(&b, ", of which the console shows the first %d", BodyPreviewMax)
		}
		b.WriteString(".")
	}
	fmt.Fprintf(&b, " Approve or deny before %s: %s", r.Expires.Format(time.RFC3339), link)
	msg, _ := json.Marshal(map[string]any{
		"text":     slackEscape(strings.Join(strings.Fields(b.String()), " ")),
		"username": "capbroker",
		"capbroker": map[string]any{
			"id": r.ID, "agent": r.Agent, "phase": r.Phase, "method": r.Method, "scheme": r.Scheme, "host": r.Host, "port": r.Port,
			"path": r.Path, "query": r.Query, "credentials": r.Credentials, "body_size": r.BodySize, "body_truncated": r.BodyTruncated,
			"reason": r.Reason, "expires": r.Expires, "scopes": r.Scopes, "url": link,
		},
	})
	return msg
}

// code puts text that may carry an agent's words (the URL, the policy's reason) in a code
// span, where neither Slack nor Mattermost makes links (bare URLs included), mentions or
// markup; a backquote in it, which would end the span, becomes "'".
func code(s string) string {
	return "`" + strings.ReplaceAll(strings.Join(strings.Fields(s), " "), "`", "'") + "`"
}

// slackEscape escapes the three characters Slack's (and Mattermost's) message text gives a
// meaning: "<" opens a link or mention, "&" an entity.
var slackEscape = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace

func (w *Webhook) deliver(ctx context.Context, r Request) {
	body := w.Message(r)
	wait := w.Backoff
	for attempt := 1; ; attempt++ {
		err := w.post(ctx, body)
		if err == nil {
			w.Metrics.webhooks.WithLabelValues("ok").Inc()
			return
		}
		if attempt >= w.Attempts || ctx.Err() != nil {
			w.Metrics.webhooks.WithLabelValues("failed").Inc()
			w.Log.Error().Err(err).Str("approval", r.ID).Int("attempts", attempt).Msg("webhook delivery failed")
			return
		}
		w.Metrics.webhooks.WithLabelValues("retry").Inc()
		w.Log.Warn().Err(err).Str("approval", r.ID).Int("attempt", attempt).Dur("retry_in", wait).Msg("webhook delivery failed; retrying")
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		wait = min(2*wait, time.Minute)
	}
}

func (w *Webhook) post(ctx context.Context, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "capbroker-webhook")
	if len(w.Secret) > 0 {
		req.Header.Set("X-Capbroker-Signature", Sign(w.Secret, body))
	}
	resp, err := w.Client.Do(req)
	if err != nil {
		return fmt.Errorf("posting to the webhook: %w", stripURL(err))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("the webhook answered %s", resp.Status)
	}
	return nil
}

// Sign is the X-Capbroker-Signature of a body: "sha256=" and the hex HMAC-SHA256 under key.
func Sign(key, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// stripURL keeps a webhook URL (which holds its own secret, for Slack) out of the log.
func stripURL(err error) error {
	if ue, ok := err.(interface{ Unwrap() error }); ok {
		if inner := ue.Unwrap(); inner != nil {
			return inner
		}
	}
	return err
}
