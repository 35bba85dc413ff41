//go:build !linux

package upstream

import "golang.org/x/sys/unix"

// peerClosed cannot tell here, where the kernel's TCP state is not read: a prepared connection
// with bytes waiting counts as open (see alive).
func peerClosed(uintptr) bool { return false }

// peekSocket looks at the next byte waiting on the socket fd, without taking it and without
// waiting: n is 1 when one is waiting, 0 at the peer's close, and err EAGAIN when nothing is.
func peekSocket(fd uintptr) (n int, err error) {
	var buf [1]byte
	n, _, err = unix.Recvfrom(int(fd), buf[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
	return n, err
}
