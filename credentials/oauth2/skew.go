package oauth2

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"time"
)

// maxSkew is how far the token endpoint's clock may be from ours before it is reported. Our
// clock dates the JWT assertions (private_key_jwt, Google's JWT bearer grant), which an
// endpoint refuses when they look issued in the future or already expired.
const maxSkew = 30 * time.Second

// skewWatch is the token endpoint client's transport: it compares the Date header of each
// answer with our clock, so that a refused grant can say why.
type skewWatch struct {
	next http.RoundTripper
	now  func() time.Time
	skew atomic.Int64 // the endpoint's clock minus ours (ns), from its last dated answer
}

func (w *skewWatch) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := w.next.RoundTrip(r)
	if err == nil {
		if d, perr := http.ParseTime(resp.Header.Get("Date")); perr == nil {
			// Date has a resolution of one second: half of one is the expected error.
			w.skew.Store(int64(d.Sub(w.now().Truncate(time.Second))))
		}
	}
	return resp, err
}

// problem describes the skew when it is over maxSkew, else "".
func (w *skewWatch) problem() string {
	if w == nil {
		return ""
	}
	s := time.Duration(w.skew.Load())
	switch {
	case s > maxSkew:
		return fmt.Sprintf("clock skew: the token endpoint's clock is %s ahead of ours", s.Round(time.Second))
	case s < -maxSkew:
		return fmt.Sprintf("clock skew: the token endpoint's clock is %s behind ours", (-s).Round(time.Second))
	}
	return ""
}

// joinProblems joins the non-empty descriptions with "; ".
func joinProblems(ps ...string) string {
	out := ""
	for _, p := range ps {
		switch {
		case p == "":
		case out == "":
			out = p
		default:
			out += "; " + p
		}
	}
	return out
}
