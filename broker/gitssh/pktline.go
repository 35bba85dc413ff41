package gitssh

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// maxPkt is the largest pkt-line git writes (LARGE_PACKET_MAX).
const maxPkt = 65520

// maxCommands bounds the bytes of a push's ref updates the broker holds before deciding.
const maxCommands = 4 << 20

var errFlush = errors.New("flush")

// readPkt reads one pkt-line: its payload, or errFlush for "0000". raw is the bytes read.
func readPkt(r io.Reader) (payload, raw []byte, err error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, nil, err
	}
	n, err := strconv.ParseUint(string(hdr[:]), 16, 16)
	if err != nil {
		return nil, hdr[:], fmt.Errorf("bad pkt-line length %q", hdr[:])
	}
	if n == 0 {
		return nil, hdr[:], errFlush
	}
	if n < 4 || n > maxPkt {
		return nil, hdr[:], fmt.Errorf("bad pkt-line length %d", n)
	}
	raw = make([]byte, n)
	copy(raw, hdr[:])
	if _, err := io.ReadFull(r, raw[4:]); err != nil {
		return nil, nil, err
	}
	return raw[4:], raw, nil
}

// pkt is payload as one pkt-line.
func pkt(payload string) []byte {
	return fmt.Appendf(nil, "%04x%s", len(payload)+4, payload)
}

// Ref is one ref update of a push: input.ssh.refs[_].
type Ref struct {
	Name, Old, New string
}

// push is what a push asks for: its ref updates and the capabilities of its first line.
type push struct {
	refs []Ref
	caps map[string]bool
	raw  []byte // every byte read, the flush included, to send upstream once allowed
}

// readPush reads a push's command list (git's receive-pack read_head_info): "shallow" lines,
// then "OLD NEW REF" lines, the first with the capabilities after a NUL, up to a flush. A push
// certificate is not supported: the broker could not show its commands to the policy as
// they are signed.
func readPush(r io.Reader) (*push, error) {
	p := &push{caps: map[string]bool{}}
	for {
		line, raw, err := readPkt(r)
		p.raw = append(p.raw, raw...)
		if errors.Is(err, errFlush) {
			return p, nil
		}
		if err != nil {
			return nil, err
		}
		if len(p.raw) > maxCommands {
			return nil, errors.New("the push updates too many refs")
		}
		line = bytes.TrimSuffix(line, []byte("\n"))
		if bytes.HasPrefix(line, []byte("shallow ")) {
			continue
		}
		text, caps, hasCaps := strings.Cut(string(line), "\x00")
		if strings.HasPrefix(text, "push-cert") {
			return nil, errors.New("signed pushes (push certificates) are not supported through the broker")
		}
		if hasCaps && len(p.refs) == 0 {
			for c := range strings.FieldsSeq(caps) {
				p.caps[c] = true
			}
		}
		f := strings.Split(text, " ")
		if len(f) != 3 || !isOID(f[0]) || !isOID(f[1]) || len(f[0]) != len(f[1]) || f[2] == "" {
			return nil, fmt.Errorf("malformed ref update %q", text)
		}
		p.refs = append(p.refs, Ref{Name: f[2], Old: f[0], New: f[1]})
	}
}

func isOID(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// refusal is what git shows for a push refused before it reached the upstream: the reason
// on the side band (printed as "remote: ...") and each ref rejected in the status report,
// in whichever of these the client asked for.
func (p *push) refusal(reason string) []byte {
	var out []byte
	sideband := p.caps["side-band-64k"] || p.caps["side-band"]
	if sideband {
		out = append(out, pkt("\x02"+reason+"\n")...)
	}
	if p.caps["report-status"] || p.caps["report-status-v2"] {
		var report []byte
		report = append(report, pkt("unpack ok\n")...)
		short := strings.ReplaceAll(reason, "\n", " ")
		for _, r := range p.refs {
			report = append(report, pkt("ng "+r.Name+" "+short+"\n")...)
		}
		report = append(report, "0000"...)
		if sideband {
			max := 999 // side-band (not 64k) packets are at most 1000 bytes
			if p.caps["side-band-64k"] {
				max = maxPkt - 5
			}
			for len(report) > 0 {
				n := min(max, len(report))
				out = append(out, pkt("\x01"+string(report[:n]))...)
				report = report[n:]
			}
			out = append(out, "0000"...)
		} else {
			out = append(out, report...)
		}
	}
	return out
}
