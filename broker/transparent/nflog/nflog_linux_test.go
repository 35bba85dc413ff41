package nflog

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// netns makes a network namespace of the test's own (with loopback up and the rules given
// loaded by nft), removed when the test ends.
func netns(t *testing.T, rules string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root for a network namespace and a netfilter log group; CI runs it as root")
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing (scripts/install-test-tools.sh installs iproute2 and nftables)", tool)
			}
			t.Skipf("skipped: %s is missing", tool)
		}
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "cbnflog-" + hex.EncodeToString(b)
	run := func(argv ...string) {
		t.Helper()
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
		}
	}
	run("ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	run("ip", "-n", name, "link", "set", "lo", "up")
	cmd := exec.Command("ip", "netns", "exec", name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nft: %v\n%s", err, out)
	}
	return name
}

// in runs fn on a thread switched into the namespace; sockets made there stay in it.
func in(t *testing.T, ns string, fn func()) {
	t.Helper()
	done := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		f, err := os.Open(filepath.Join("/run/netns", ns))
		if err == nil {
			err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
			f.Close()
		}
		if err == nil {
			fn()
		}
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// logRules log UDP to port 9 on loopback (IPv4 and IPv6) and ICMP echo requests to group 7.
const logRules = `table inet t {
	chain out {
		type filter hook output priority 0; policy accept;
		udp dport 9 log group 7 snaplen 128
		udp dport 10 log prefix "ten" group 7
	}
}`

func send(t *testing.T, network, src, dst string, n int) {
	t.Helper()
	la, _ := net.ResolveUDPAddr(network, src)
	ra, _ := net.ResolveUDPAddr(network, dst)
	c, err := net.DialUDP(network, la, ra)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range n {
		_, _ = c.Write([]byte("canary-payload-never-copied"))
	}
}

func TestReaderReportsLoggedPackets(t *testing.T) {
	ns := netns(t, logRules)
	var r *Reader
	var err error
	in(t, ns, func() { r, err = Open(7) })
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var busy error
	in(t, ns, func() {
		var r2 *Reader
		if r2, busy = Open(7); busy == nil {
			r2.Close()
		}
	})
	if busy == nil || !strings.Contains(busy.Error(), "bound by another process") {
		t.Fatalf("a second reader of the group: err = %v, want it bound by another process", busy)
	}
	in(t, ns, func() {
		send(t, "udp4", "127.0.0.1:40001", "127.0.0.1:9", 1)
		send(t, "udp6", "[::1]:40002", "[::1]:9", 1)
		send(t, "udp4", "127.0.0.1:40003", "127.0.0.1:10", 1)
		send(t, "udp4", "127.0.0.1:40004", "127.0.0.1:11", 1) // not logged
	})
	want := []string{
		"udp 127.0.0.1:40001 127.0.0.1:9 ",
		"udp [::1]:40002 [::1]:9 ",
		"udp 127.0.0.1:40003 127.0.0.1:10 ten",
	}
	var got []string
	for len(got) < len(want) {
		pkts, err := r.Read()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pkts {
			got = append(got, p.Proto+" "+p.Source.String()+" "+p.Dest.String()+" "+p.Prefix)
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("packets read:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestRunOncePerFlow(t *testing.T) {
	ns := netns(t, logRules)
	var r *Reader
	var err error
	in(t, ns, func() { r, err = Open(7) })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	refused := make(chan Packet, 16)
	done := make(chan error)
	go func() {
		done <- Run(ctx, r, func(p Packet) { refused <- p }, func(err error) { t.Errorf("read: %v", err) })
	}()
	in(t, ns, func() {
		send(t, "udp4", "127.0.0.1:40001", "127.0.0.1:9", 5) // one flow, five datagrams
		send(t, "udp4", "127.0.0.1:40002", "127.0.0.1:9", 1)
		send(t, "udp4", "127.0.0.1:40001", "127.0.0.1:9", 3)
		// A marker flow, logged after the others: once it is reported, every earlier
		// packet has been read.
		send(t, "udp4", "127.0.0.1:40009", "127.0.0.1:10", 1)
	})
	var got []string
	for p := range refused {
		got = append(got, p.Source.String())
		if p.Source.Port() == 40009 {
			break
		}
	}
	if strings.Join(got, " ") != "127.0.0.1:40001 127.0.0.1:40002 127.0.0.1:40009" {
		t.Fatalf("flows reported: %v, want each once", got)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return when its context ended")
	}
}
