package http2srv

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// FuzzHeaderBlock reads the same frames with golang.org/x/net/http2's Framer decoding
// header blocks itself (ReadMetaHeaders) and with headerBlock, which must agree on every
// block: its fields, whether it was truncated, and the error (a connection error's code, a
// stream error's stream and code, or another error).
func FuzzHeaderBlock(f *testing.F) {
	for _, seed := range headerSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const maxList = 256
		theirs := http2.NewFramer(nil, bytes.NewReader(data))
		theirs.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		theirs.MaxHeaderListSize = maxList
		ours := http2.NewFramer(nil, bytes.NewReader(data))
		hdr := newHeaderBlock(maxList)
		for i := 0; ; i++ {
			want, werr := theirs.ReadFrame()
			got, gerr := ours.ReadFrame()
			if hf, ok := got.(*http2.HeadersFrame); ok && gerr == nil {
				got, gerr = hdr.read(ours, hf)
			}
			if !sameError(werr, gerr) {
				t.Fatalf("frame %d: error %v, want %v", i, gerr, werr)
			}
			if werr != nil {
				return
			}
			wm, ok := want.(*http2.MetaHeadersFrame)
			if !ok {
				continue
			}
			gm := got.(*http2.MetaHeadersFrame)
			if gm.StreamID != wm.StreamID || gm.Truncated != wm.Truncated || gm.StreamEnded() != wm.StreamEnded() ||
				(len(gm.Fields) > 0 || len(wm.Fields) > 0) && !reflect.DeepEqual(gm.Fields, wm.Fields) {
				t.Fatalf("frame %d: %v truncated %v, want %v truncated %v", i, gm.Fields, gm.Truncated, wm.Fields, wm.Truncated)
			}
		}
	})
}

func sameError(a, b error) bool {
	var ca, cb http2.ConnectionError
	var sa, sb http2.StreamError
	switch {
	case a == nil || b == nil:
		return a == nil && b == nil
	case errors.As(a, &ca):
		return errors.As(b, &cb) && ca == cb
	case errors.As(a, &sa):
		return errors.As(b, &sb) && sa.StreamID == sb.StreamID && sa.Code == sb.Code
	}
	return !errors.As(b, &cb) && !errors.As(b, &sb)
}

// headerSeeds are valid blocks, blocks split across CONTINUATION frames, and blocks with each
// thing the Framer refuses or truncates.
func headerSeeds() [][]byte {
	block := func(fields ...string) []byte {
		var b bytes.Buffer
		enc := hpack.NewEncoder(&b)
		for i := 0; i < len(fields); i += 2 {
			enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		return b.Bytes()
	}
	frames := func(write func(fr *http2.Framer)) []byte {
		var b bytes.Buffer
		write(http2.NewFramer(&b, nil))
		return b.Bytes()
	}
	headers := func(id uint32, blk []byte) []byte {
		return frames(func(fr *http2.Framer) {
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: blk, EndStream: true, EndHeaders: true})
		})
	}
	req := block(":method", "GET", ":scheme", "https", ":authority", "x.test", ":path", "/", "accept", "*/*")
	split := func(blk []byte, cut int) []byte {
		return frames(func(fr *http2.Framer) {
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: blk[:cut]})
			fr.WriteContinuation(1, true, blk[cut:])
		})
	}
	big := string(bytes.Repeat([]byte("v"), 150))
	return [][]byte{
		append(headers(1, req), headers(3, req)...), // the second from the dynamic table
		split(req, 3),
		headers(1, block(":method", "GET", "x-a", big, "x-b", big)),           // truncated
		headers(1, block(":method", "GET", "trailer", "a, b, c, d, e, f, g")), // trailers' own budget
		headers(1, block("accept", "x", ":method", "GET")),                    // pseudo after regular
		headers(1, block(":method", "GET", "Upper", "x")),                     // invalid name
		headers(1, block(":method", "GET", "x", "a\x00b")),                    // invalid value
		headers(1, block(":method", "GET", ":method", "GET")),                 // repeated pseudo
		headers(1, block(":status", "200", ":method", "GET")),                 // mixed
		headers(1, block(":bogus", "x")),                                      // unknown pseudo
		headers(1, []byte{0xff, 0xff, 0xff}),                                  // bad hpack
		frames(func(fr *http2.Framer) { // CONTINUATION for another stream
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: req[:2]})
			fr.WriteContinuation(3, true, req[2:])
		}),
		frames(func(fr *http2.Framer) { // CONTINUATION after an invalid field
			blk := block("accept", "x", ":method", "GET")
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: blk})
			fr.WriteContinuation(1, true, req)
		}),
		frames(func(fr *http2.Framer) { // a fragment far beyond the limit
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: bytes.Repeat([]byte{0x82}, 600), EndHeaders: true})
		}),
	}
}
