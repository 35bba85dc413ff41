//go:build linux

// Package nflog reads the packets that transparent mode's rules refuse and log to a netfilter
// log group (nft `log group G`), over a NETLINK_NETFILTER socket, so that the broker can
// audit them: a UDP datagram (QUIC among them) or any other packet the sandbox sent that the
// broker does not carry. Only the headers are copied from the kernel, never a payload.
package nflog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Netlink constants of nfnetlink_log (linux/netfilter/nfnetlink_log.h).
const (
	nfnlSubsysULOG = 4
	msgPacket      = nfnlSubsysULOG<<8 | 0 // NFULNL_MSG_PACKET
	msgConfig      = nfnlSubsysULOG<<8 | 1 // NFULNL_MSG_CONFIG

	attrCfgCmd     = 1 // NFULA_CFG_CMD
	attrCfgMode    = 2 // NFULA_CFG_MODE
	attrCfgQThresh = 5 // NFULA_CFG_QTHRESH

	cfgCmdBind = 1 // NFULNL_CFG_CMD_BIND
	copyPacket = 2 // NFULNL_COPY_PACKET

	attrPayload = 9  // NFULA_PAYLOAD
	attrPrefix  = 10 // NFULA_PREFIX
)

// CopyRange is how many bytes of each packet the kernel copies: an IPv6 header and a UDP,
// ICMP or the start of a TCP header.
const CopyRange = 64

// Reader is a socket bound to one netfilter log group.
type Reader struct {
	f   *os.File
	buf []byte
}

// Open binds log group group (1-65535). It needs CAP_NET_ADMIN, and fails when another
// process (ulogd, another broker) has the group bound already.
func Open(group uint16) (*Reader, error) {
	if group == 0 {
		return nil, errors.New("netfilter log group 0 is not read")
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	// A bigger receive buffer rides out bursts; a flood beyond it loses log messages (the
	// packets are refused all the same), reported by Read as ENOBUFS and skipped.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	r := &Reader{f: os.NewFile(uintptr(fd), "nflog"), buf: make([]byte, 1<<16)}
	mode := make([]byte, 6)
	binary.BigEndian.PutUint32(mode, CopyRange)
	mode[4] = copyPacket
	thresh := binary.BigEndian.AppendUint32(nil, 1) // deliver each packet at once
	for i, attrs := range [][]attr{
		{{attrCfgCmd, []byte{cfgCmdBind}}},
		{{attrCfgMode, mode}, {attrCfgQThresh, thresh}},
	} {
		if err := r.config(group, uint32(i+1), attrs); err != nil {
			r.Close()
			if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EBUSY) {
				// The kernel says EPERM for both.
				return nil, fmt.Errorf("binding netfilter log group %d: the broker lacks CAP_NET_ADMIN, or the group is bound by another process (ulogd, another broker): %w", group, err)
			}
			return nil, fmt.Errorf("binding netfilter log group %d: %w", group, err)
		}
	}
	return r, nil
}

type attr struct {
	typ  uint16
	data []byte
}

// config sends one NFULNL_MSG_CONFIG request for the group and waits for its ack.
func (r *Reader) config(group uint16, seq uint32, attrs []attr) error {
	msg := make([]byte, unix.NLMSG_HDRLEN, 64)
	msg = append(msg, unix.AF_UNSPEC, 0 /* NFNETLINK_V0 */, 0, 0)
	binary.BigEndian.PutUint16(msg[unix.NLMSG_HDRLEN+2:], group)
	for _, a := range attrs {
		n := unix.SizeofNlAttr + len(a.data)
		msg = binary.NativeEndian.AppendUint16(msg, uint16(n))
		msg = binary.NativeEndian.AppendUint16(msg, a.typ)
		msg = append(msg, a.data...)
		for len(msg)%4 != 0 {
			msg = append(msg, 0)
		}
	}
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:], msgConfig)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(msg[8:], seq)
	rc, err := r.f.SyscallConn()
	if err != nil {
		return err
	}
	var sendErr error
	if err := rc.Write(func(fd uintptr) bool {
		sendErr = unix.Sendto(int(fd), msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		return sendErr != unix.EAGAIN
	}); err != nil {
		return err
	}
	if sendErr != nil {
		return sendErr
	}
	for {
		n, err := r.recv()
		if err != nil {
			return err
		}
		for b := r.buf[:n]; len(b) >= unix.NLMSG_HDRLEN; {
			l := int(binary.NativeEndian.Uint32(b))
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				break
			}
			typ, mseq := binary.NativeEndian.Uint16(b[4:]), binary.NativeEndian.Uint32(b[8:])
			if typ == unix.NLMSG_ERROR && mseq == seq && l >= unix.NLMSG_HDRLEN+4 {
				if code := int32(binary.NativeEndian.Uint32(b[unix.NLMSG_HDRLEN:])); code != 0 {
					return syscall.Errno(-code)
				}
				return nil
			}
			b = b[align(l):]
		}
	}
}

func (r *Reader) recv() (int, error) {
	rc, err := r.f.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var recvErr error
	if err := rc.Read(func(fd uintptr) bool {
		n, _, recvErr = unix.Recvfrom(int(fd), r.buf, 0)
		return recvErr != unix.EAGAIN
	}); err != nil {
		return 0, err
	}
	return n, recvErr
}

// ErrOverrun is returned by Read when the kernel dropped log messages the reader was too
// slow for; reading may go on.
var ErrOverrun = errors.New("nflog: log messages lost (socket buffer overrun)")

// Read waits for the next batch of logged packets. After Close it returns os.ErrClosed.
func (r *Reader) Read() ([]Packet, error) {
	for {
		n, err := r.recv()
		if errors.Is(err, unix.ENOBUFS) {
			return nil, ErrOverrun
		}
		if err != nil {
			return nil, err
		}
		if pkts := parseMessages(r.buf[:n]); len(pkts) > 0 {
			return pkts, nil
		}
	}
}

// Close closes the socket; a Read in progress returns.
func (r *Reader) Close() error { return r.f.Close() }

func align(n int) int { return (n + 3) &^ 3 }

// parseMessages reads the packets out of a buffer of netlink messages, skipping what is not
// a logged packet or does not parse.
func parseMessages(b []byte) []Packet {
	var out []Packet
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			break
		}
		if binary.NativeEndian.Uint16(b[4:]) == msgPacket && l >= unix.NLMSG_HDRLEN+4 {
			if p, ok := parsePacket(b[unix.NLMSG_HDRLEN+4 : l]); ok {
				out = append(out, p)
			}
		}
		b = b[min(align(l), len(b)):]
	}
	return out
}

// parsePacket reads the attributes of one NFULNL_MSG_PACKET (after its nfgenmsg).
func parsePacket(b []byte) (Packet, bool) {
	var payload []byte
	var prefix string
	for len(b) >= unix.SizeofNlAttr {
		l := int(binary.NativeEndian.Uint16(b))
		typ := binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < unix.SizeofNlAttr || l > len(b) {
			break
		}
		data := b[unix.SizeofNlAttr:l]
		switch typ {
		case attrPayload:
			payload = data
		case attrPrefix:
			prefix = string(data)
			for len(prefix) > 0 && prefix[len(prefix)-1] == 0 {
				prefix = prefix[:len(prefix)-1]
			}
		}
		b = b[min(align(l), len(b)):]
	}
	p, ok := ParseIP(payload)
	p.Prefix = prefix
	return p, ok
}
