package rpc

import (
	"errors"
	"reflect"
	"testing"

	"github.com/capbroker/capbroker/broker/wire/strictjson"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		body string
		want []Message
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, []Message{{Method: "tools/list", ID: []byte(`1`)}}},
		{` {"jsonrpc":"2.0","method":"notifications/initialized","params":null}`, []Message{{Method: "notifications/initialized"}}},
		{`[{"jsonrpc":"2.0","id":"a","method":"eth_call","params":[1]},{"jsonrpc":"2.0","id":2,"result":{}}]`,
			[]Message{{Method: "eth_call", ID: []byte(`"a"`), Params: []byte(`[1]`)}, {ID: []byte(`2`), Response: true}}},
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
		{"jsonrpc":"2.0","id":9,"error":{"code":-1,"message":"no"}}]`))
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
	}
	if got, err := MCP(msgs); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("MCP =\n%v, %v\nwant\n%v", got, err, want)
	}
	if got, _ := JSONRPC(msgs[:2]); !reflect.DeepEqual(got, []any{map[string]any{"method": "initialize"}, map[string]any{"method": "tools/call"}}) {
		t.Errorf("JSONRPC = %v", got)
	}
}

// TestAmbiguousMessagesRefused: a message whose members a server may read otherwise than the
// broker (case, Unicode folding, escapes, duplicates, in the envelope, the params or the
// arguments, alone or in a batch) is an error wrapping strictjson.ErrAmbiguous, never a
// message read one way.
func TestAmbiguousMessagesRefused(t *testing.T) {
	call := func(params string) string {
		return `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":` + params + `}`
	}
	for name, body := range map[string]string{
		"name/Name":           call(`{"name":"delete_repository","Name":"echo","arguments":{}}`),
		"Name alone":          call(`{"Name":"delete_repository","arguments":{}}`),
		"name twice":          call(`{"name":"delete_repository","name":"echo"}`),
		"escaped name twice":  call(`{"name":"delete_repository","\u006eame":"echo"}`),
		"arguments/ARGUMENTS": call(`{"name":"echo","arguments":{"message":"hello"},"ARGUMENTS":{"message":"x"}}`),
		"ARGUMENTS alone":     call(`{"name":"echo","ARGUMENTS":{"repository":"acme/secret"}}`),
		"long s":              call("{\"name\":\"echo\",\"argument\u017f\":{}}"),
		"long s escaped":      call(`{"name":"echo","argument\u017f":{}}`),
		"kelvin in arguments": call("{\"name\":\"echo\",\"arguments\":{\"kind\":\"a\",\"\u212aind\":\"b\"}}"),
		"argument twice":      call(`{"name":"echo","arguments":{"message":"hello","message":"rm -rf"}}`),
		"uri/URI":             `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"test://static/1","URI":"file:///etc/passwd"}}`,
		"method/Method":       `{"jsonrpc":"2.0","id":1,"method":"tools/list","Method":"tools/call","params":{"name":"x"}}`,
		"Method alone":        `{"jsonrpc":"2.0","id":1,"Method":"tools/call","params":{"name":"x"}}`,
		"params/Params":       `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"},"Params":{"name":"x"}}`,
		"jsonrpc dash":        `{"jsonrpc":"2.0","json-rpc":"1.0","id":1,"method":"ping"}`,
		"id twice":            `{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}`,
		"in a batch":          `[{"jsonrpc":"2.0","id":0,"method":"ping"},` + call(`{"name":"delete_repository","Name":"echo"}`) + `]`,
		"clientInfo NAME":     `{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"x","clientInfo":{"name":"a","NAME":"b"}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			msgs, err := Parse([]byte(body))
			if err == nil {
				_, err = MCP(msgs)
			}
			if !errors.Is(err, strictjson.ErrAmbiguous) {
				t.Errorf("%s: %v, want an ErrAmbiguous", body, err)
			}
		})
	}
}

// TestMCPParamsOfAnotherShape: params of a method read that are not of MCP's shape are an
// error, not members left empty for the policy.
func TestMCPParamsOfAnotherShape(t *testing.T) {
	for _, params := range []string{`{"name":"x","arguments":"not an object"}`, `{"name":5}`, `["x"]`} {
		msgs, err := Parse([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":` + params + `}`))
		if err != nil {
			t.Fatal(err)
		}
		if l, err := MCP(msgs); err == nil {
			t.Errorf("params %s: %v, want an error", params, l)
		}
	}
}
