package upstream

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// tcpEstablished is TCP_ESTABLISHED, the state tcp_info reports (include/net/tcp_states.h).
const tcpEstablished = 1

// peerClosed reports whether the peer of the TCP socket fd has closed its side (the socket
// is no longer ESTABLISHED: a FIN or a reset arrived), whatever data is still unread.
func peerClosed(fd uintptr) bool {
	info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	return err != nil || info.State != tcpEstablished
}

// peekSocket looks at the next byte waiting on the socket fd, without taking it and without
// waiting (MSG_PEEK|MSG_DONTWAIT): n is 1 when one is waiting, 0 at the peer's close, and err
// EAGAIN when nothing is. It makes the system call itself: unix.Recvfrom allocates the sender's
// address, which a connected socket does not report, on every call.
func peekSocket(fd uintptr) (n int, err error) {
	var buf [1]byte
	r, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), 1,
		unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}
