package gitssh

import (
	"bytes"
	"strings"
	"testing"
)

const (
	oidA = "1111111111111111111111111111111111111111"
	oidB = "2222222222222222222222222222222222222222"
	zero = "0000000000000000000000000000000000000000"
)

func TestReadPush(t *testing.T) {
	in := string(pkt(zero+" "+oidA+" refs/heads/agent/x\x00report-status side-band-64k agent=git/2\n")) +
		string(pkt("shallow "+oidB+"\n")) +
		string(pkt(oidB+" "+zero+" refs/tags/v1\n")) + "0000PACKdata"
	r := strings.NewReader(in)
	p, err := readPush(r)
	if err != nil {
		t.Fatal(err)
	}
	want := []Ref{{"refs/heads/agent/x", zero, oidA}, {"refs/tags/v1", oidB, zero}}
	if len(p.refs) != 2 || p.refs[0] != want[0] || p.refs[1] != want[1] {
		t.Fatalf("refs = %+v", p.refs)
	}
	if !p.caps["report-status"] || !p.caps["side-band-64k"] {
		t.Errorf("caps = %v", p.caps)
	}
	if string(p.raw) != strings.TrimSuffix(in, "PACKdata") {
		t.Errorf("raw is not every byte up to the flush")
	}
	rest := new(bytes.Buffer)
	rest.ReadFrom(r)
	if rest.String() != "PACKdata" {
		t.Errorf("read past the flush: rest %q", rest)
	}
}

func TestReadPushRefuses(t *testing.T) {
	for name, in := range map[string]string{
		"push cert":      string(pkt("push-cert\x00report-status\n")) + "0000",
		"bad oid":        string(pkt("xyz "+oidA+" refs/heads/a\n")) + "0000",
		"mixed lengths":  string(pkt(oidA+" "+oidA+oidA[:24]+" refs/heads/a\n")) + "0000",
		"no ref":         string(pkt(oidA+" "+oidB+" \n")) + "0000",
		"extra field":    string(pkt(oidA+" "+oidB+" refs/heads/a b\n")) + "0000",
		"bad length":     "zzzz",
		"short":          "0003",
		"truncated":      "00ffabc",
		"eof before end": string(pkt(oidA + " " + oidB + " refs/heads/a\n")),
	} {
		if _, err := readPush(strings.NewReader(in)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestRefusal(t *testing.T) {
	p := &push{refs: []Ref{{"refs/heads/main", oidA, oidB}}, caps: map[string]bool{"report-status": true, "side-band-64k": true}}
	out := p.refusal("pushing to main is not allowed")
	r := bytes.NewReader(out)
	msg, _, err := readPkt(r)
	if err != nil || string(msg) != "\x02pushing to main is not allowed\n" {
		t.Fatalf("first packet %q, %v", msg, err)
	}
	band, _, err := readPkt(r)
	if err != nil || band[0] != 1 {
		t.Fatalf("second packet %q, %v", band, err)
	}
	inner := bytes.NewReader(band[1:])
	for _, want := range []string{"unpack ok\n", "ng refs/heads/main pushing to main is not allowed\n"} {
		got, _, err := readPkt(inner)
		if err != nil || string(got) != want {
			t.Errorf("report line %q, %v; want %q", got, err, want)
		}
	}
	if _, _, err := readPkt(inner); err != errFlush {
		t.Errorf("report does not end with a flush: %v", err)
	}
	if _, _, err := readPkt(r); err != errFlush {
		t.Errorf("no final flush: %v", err)
	}
}
