package upstream

import "golang.org/x/sys/unix"

// tcpEstablished is TCP_ESTABLISHED, the state tcp_info reports (include/net/tcp_states.h).
const tcpEstablished = 1

// peerClosed reports whether the peer of the TCP socket fd has closed its side (the socket
// is no longer ESTABLISHED: a FIN or a reset arrived), whatever data is still unread.
func peerClosed(fd uintptr) bool {
	info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	return err != nil || info.State != tcpEstablished
}
