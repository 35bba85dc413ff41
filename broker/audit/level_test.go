package audit

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// levelInput is a policy input with a canary in a body, a query value and headers.
func levelInput() map[string]any {
	return map[string]any{
		"phase":       "request",
		"agent":       map[string]any{"id": "coder-1", "labels": map[string]any{"team": "platform"}},
		"source":      map[string]any{"ip": "10.0.0.1"},
		"credentials": []any{"openai"},
		"request": map[string]any{
			"method": "POST", "scheme": "https", "host": "api.openai.com", "port": 443,
			"path": "/v1/chat/completions", "raw_path": "/v1/chat/completions",
			"query": map[string]any{"trace": []any{"QUERY-CANARY"}},
			"headers": map[string]any{
				"content-type":   "application/json",
				"x-trace":        "HEADER-CANARY",
				"x-goog-api-key": "KEY-CANARY",
				"x-auth-token":   "TOKEN-CANARY",
				"x-session":      "SESSION-CANARY",
			},
			"body":      map[string]any{"model": "gpt-4.1-mini", "messages": []any{"BODY-CANARY"}},
			"body_size": 64,
		},
	}
}

// TestLevels checks each level's exact input, as written to the log.
func TestLevels(t *testing.T) {
	metadataReq := map[string]any{
		"method": "POST", "scheme": "https", "host": "api.openai.com", "port": float64(443),
		"path": "/v1/chat/completions", "raw_path": "/v1/chat/completions",
		"query": map[string]any{"trace": []any{}}, "body_size": float64(64),
	}
	headersReq := map[string]any{"headers": map[string]any{"content-type": "application/json", "x-trace": "HEADER-CANARY"}}
	fullReq := map[string]any{
		"query": map[string]any{"trace": []any{"QUERY-CANARY"}},
		"body":  map[string]any{"model": "gpt-4.1-mini", "messages": []any{"BODY-CANARY"}},
	}
	merge := func(ms ...map[string]any) map[string]any {
		out := map[string]any{}
		for _, m := range ms {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	for _, c := range []struct {
		level Level
		req   map[string]any // nil: no input
	}{
		{InputNone, nil},
		{"", nil},
		{InputMetadata, metadataReq},
		{InputHeaders, merge(metadataReq, headersReq)},
		{InputFull, merge(metadataReq, headersReq, fullReq)},
	} {
		var buf bytes.Buffer
		l := New(&buf)
		in := levelInput()
		l.Write(&Event{Start: time.Now(), Input: in, InputLevel: c.level})
		l.Close()
		if !reflect.DeepEqual(in, levelInput()) {
			t.Fatalf("%s: the event's input was changed", c.level)
		}
		line := buf.String()
		for _, secret := range []string{"KEY-CANARY", "TOKEN-CANARY", "SESSION-CANARY"} {
			if strings.Contains(line, secret) {
				t.Fatalf("%s: a credential-bearing header was written: %s", c.level, line)
			}
		}
		var ev map[string]any
		if err := json.Unmarshal(buf.Bytes(), &ev); err != nil {
			t.Fatal(err)
		}
		if c.req == nil {
			if ev["input"] != nil || ev["input_level"] != nil {
				t.Fatalf("%q: %s", c.level, line)
			}
			continue
		}
		want := map[string]any{
			"phase":       "request",
			"agent":       map[string]any{"id": "coder-1", "labels": map[string]any{"team": "platform"}},
			"source":      map[string]any{"ip": "10.0.0.1"},
			"credentials": []any{"openai"},
			"request":     c.req,
		}
		if !reflect.DeepEqual(ev["input"], want) || ev["input_level"] != string(c.level) {
			t.Errorf("%s:\n got %v\nwant %v", c.level, ev["input"], want)
		}
	}
}
