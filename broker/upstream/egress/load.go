package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
)

// MaxPACSize bounds a PAC script LoadPAC accepts.
const MaxPACSize = 1 << 20

// LoadPAC reads a PAC script from a file path (or file:// URL) or an
// https:// URL fetched with client, which the caller builds on the broker's
// one dialer. Plain http:// is refused: whoever can rewrite the script
// chooses the way out. The script is at most MaxPACSize bytes.
func LoadPAC(ctx context.Context, source string, client *http.Client) ([]byte, error) {
	lower := strings.ToLower(source)
	switch {
	case strings.HasPrefix(lower, "https://"):
		if client == nil {
			return nil, errors.New("pac: no HTTP client to fetch " + source)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, source, nil)
		if err != nil {
			return nil, fmt.Errorf("pac: %w", err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("pac: fetch: %w", err)
		}
		defer resp.Body.Close()
		if resp.Request != nil && resp.Request.URL.Scheme != "https" {
			// The client followed a redirect off https.
			return nil, fmt.Errorf("pac: fetch %s: redirected to %s, not https", source, resp.Request.URL.Scheme)
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("pac: fetch %s: status %d", source, resp.StatusCode)
		}
		return readBounded(resp.Body, source)
	case strings.Contains(lower, "://") && !strings.HasPrefix(lower, "file://"):
		return nil, fmt.Errorf("pac: %q: only https:// URLs and files are accepted", source)
	}
	path := source
	if strings.HasPrefix(lower, "file://") {
		path = source[len("file://"):]
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("pac: %w", err)
	}
	defer f.Close()
	return readBounded(f, path)
}

func readBounded(r io.Reader, name string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxPACSize+1))
	if err != nil {
		return nil, fmt.Errorf("pac: read %s: %w", name, err)
	}
	if len(b) > MaxPACSize {
		return nil, fmt.Errorf("pac: %s is larger than %d bytes", name, MaxPACSize)
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("pac: %s is empty", name)
	}
	return b, nil
}
