package rpc

import (
	"errors"
	"reflect"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		body string
		want []Message
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, []Message{{Method: "tools/list", HasID: true}}},
		{` {"jsonrpc":"2.0","method":"notifications/initialized","params":null}`, []Message{{Method: "notifications/initialized"}}},
		{`[{"jsonrpc":"2.0","id":"a","method":"eth_call","params":[1]},{"jsonrpc":"2.0","id":2,"result":{}}]`,
			[]Message{{Method: "eth_call", HasID: true, Params: []byte(`[1]`)}, {HasID: true, Response: true}}},
	} {
		got, err := Parse([]byte(tc.body))
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Parse(%s) = %+v, %v; want %+v", tc.body, got, err, tc.want)
		}
	}
}

func TestParseRefusesWhatIsNotJSONRPC(t *testing.T) {
	for _, body := range []string{
		``, `   `, `null`, `{}`, `[]`, `"tools/call"`, `{"method":"tools/call"}`,
		`{"jsonrpc":"1.0","method":"x"}`, `{"jsonrpc":"2.0","id":1}`, `{"jsonrpc":"2.0","method":1}`,
		`[{"jsonrpc":"2.0","method":"x"},3]`, `{"jsonrpc":"2.0","method":"x"`, `query { viewer { login } }`,
	} {
		if got, err := Parse([]byte(body)); !errors.Is(err, ErrNotJSONRPC) {
			t.Errorf("Parse(%q) = %+v, %v; want ErrNotJSONRPC", body, got, err)
		}
	}
}

func TestMCP(t *testing.T) {
	msgs, err := Parse([]byte(`[
		{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1.2"}}},
		{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"message":"hi","n":2}}},
		{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"test://static/resource/1"}},
		{"jsonrpc":"2.0","id":3,"method":"prompts/get","params":{"name":"simple_prompt"}},
		{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}},
		{"jsonrpc":"2.0","id":9,"error":{"code":-1,"message":"no"}},
		{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"x","arguments":"not an object"}}]`))
	if err != nil {
		t.Fatal(err)
	}
	none := map[string]any{}
	want := []any{
		map[string]any{"method": "initialize", "tool": "", "arguments": none, "uri": "", "protocol_version": "2025-06-18",
			"client": map[string]any{"name": "c", "version": "1.2"}},
		map[string]any{"method": "tools/call", "tool": "echo", "arguments": map[string]any{"message": "hi", "n": 2.0}, "uri": ""},
		map[string]any{"method": "resources/read", "tool": "", "arguments": none, "uri": "test://static/resource/1"},
		map[string]any{"method": "prompts/get", "tool": "", "arguments": none, "uri": "", "prompt": "simple_prompt"},
		map[string]any{"method": "notifications/cancelled", "tool": "", "arguments": none, "uri": ""},
		map[string]any{"method": "response", "tool": "", "arguments": none, "uri": ""},
		map[string]any{"method": "tools/call", "tool": "x", "arguments": none, "uri": ""},
	}
	if got := MCP(msgs); !reflect.DeepEqual(got, want) {
		t.Errorf("MCP =\n%v\nwant\n%v", got, want)
	}
	if got, want := JSONRPC(msgs[:2]), []any{map[string]any{"method": "initialize"}, map[string]any{"method": "tools/call"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("JSONRPC = %v, want %v", got, want)
	}
}
