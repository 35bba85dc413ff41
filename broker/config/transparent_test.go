package config

import (
	"strings"
	"testing"
)

// TestTransparentAdminReachable: in transparent mode, an admin listener without
// authentication is refused wherever an agent reaches it, loopback in a shared network
// namespace included; it stays allowed on loopback where the agent is elsewhere.
func TestTransparentAdminReachable(t *testing.T) {
	const base = "ca: {cert_file: c, key_file: k}\npolicy: {dir: p}\n"
	const refused = `admin.listen: "127.0.0.1:9090" has no authentication, and in transparent mode an agent reaches it`
	for name, c := range map[string]struct {
		src  string
		want string // "" = valid
	}{
		"pod form: listener on loopback": {
			`agents: [{id: a, addresses: ["10.0.0.2"]}]
transparent: {listen: "127.0.0.1:15001"}`, refused + `: transparent.listen "127.0.0.1:15001" is on loopback`},
		"pod form: resolver on loopback": {
			`agents: [{id: a, addresses: ["10.0.0.2"]}]
transparent: {listen: "10.0.0.1:15001", dns: {listen: "[::1]:15053"}}`, refused + `: transparent.dns.listen "[::1]:15053" is on loopback`},
		"agent known by every address": {
			`agents: [{id: a, addresses: ["10.0.0.2"]}, {id: b, addresses: ["0.0.0.0/0"]}]
transparent: {listen: "0.0.0.0:15001"}`, refused + `: agents[1] (b) is known by an address on loopback`},
		"agent on ::1": {
			`agents: [{id: a, addresses: ["::1"]}]
transparent: {listen: "[::]:15001"}`, "agents[0] (a)"},
		"localhost is loopback": {
			`admin: {listen: "localhost:9090"}
agents: [{id: a, addresses: ["10.0.0.2"]}]
transparent: {listen: "127.0.0.1:15001"}`, `admin.listen: "localhost:9090" has no authentication`},
		"pod form with a token file": {
			`admin: {listen: "127.0.0.1:9090", token_file: /run/admin/token}
agents: [{id: a, addresses: ["0.0.0.0/0", "::/0"]}]
transparent: {listen: "127.0.0.1:15001"}`, ""},
		"pod form with a token variable": {
			`admin: {listen: "127.0.0.1:9090", token_env: ADMIN_TOKEN}
agents: [{id: a, addresses: ["0.0.0.0/0"]}]
transparent: {listen: "127.0.0.1:15001", dns: {listen: "127.0.0.1:15053"}}`, ""},
		"gateway form: the agent is in another namespace": {
			`agents: [{id: a, addresses: ["10.250.0.2/32", "fd00:250::2"]}]
transparent: {listen: "0.0.0.0:15001", dns: {listen: "10.250.0.1:53"}, interfaces: [veth-sb, "br-*"]}`, ""},
		"explicit mode is not this check's": {
			`agents: [{id: a, addresses: ["0.0.0.0/0"]}]`, ""},
		"bad interfaces": {
			`agents: [{id: a, addresses: ["10.250.0.2"]}]
transparent: {listen: "0.0.0.0:15001", interfaces: [ok0, "a b", "toolonginterface0", "*"]}`,
			`transparent.interfaces[1]: interface "a b": ' ' is not allowed`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(base + c.src + "\n"))
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("got %v, want it to say %q", err, c.want)
			}
		})
	}
	_, err := Parse([]byte(base + `agents: [{id: a, addresses: ["10.250.0.2"]}]
transparent: {listen: "0.0.0.0:15001", interfaces: [ok0, "a b", "toolonginterface0", "*"]}` + "\n"))
	for _, want := range []string{"transparent.interfaces[1]", "transparent.interfaces[2]", "transparent.interfaces[3]"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want %s", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), "interfaces[0]") {
		t.Errorf("ok0 refused: %v", err)
	}
}
