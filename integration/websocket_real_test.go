package integration

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"testing"

	"golang.org/x/net/websocket"
)

// TestWebSocketRealServer upgrades through the broker to a WebSocket server from a library
// (golang.org/x/net/websocket), not one that computes its accept value with the test's own
// constant: the broker must accept the 101 a real server sends, and pass the RFC 6455
// sample key's accept value on to the agent unchanged.
func TestWebSocketRealServer(t *testing.T) {
	echo := websocket.Handler(func(c *websocket.Conn) { _, _ = io.Copy(c, c) })
	e := newEnv(t, envOpts{handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { echo.ServeHTTP(w, r) })})
	conn := e.dialTunnel(t, e.up.Listener.Addr().String())
	defer conn.Close()
	fmt.Fprintf(conn, "GET /api/custom/ws HTTP/1.1\r\nHost: %s\r\nOrigin: https://%[1]s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", e.up.Listener.Addr())
	rd := bufio.NewReader(conn)
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("upgrade to a real WebSocket server: %s %s", resp.Status, body)
	}
	if got, want := resp.Header.Get("Sec-WebSocket-Accept"), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="; got != want {
		t.Fatalf("Sec-WebSocket-Accept %q, want RFC 6455's %q", got, want)
	}
	if _, err := conn.Write(wsFrame(true, 0x1, []byte("hello"), true)); err != nil {
		t.Fatal(err)
	}
	if op, got, err := readWSFrame(rd); err != nil || op != 0x81 || string(got) != "hello" {
		t.Fatalf("echo: %#x %q %v", op, got, err)
	}
}
