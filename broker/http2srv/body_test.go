package http2srv

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strconv"
	"testing"
)

// TestBodyBufKeepsOrder writes frames of every size and reads them back in reads of other
// sizes: what is read is what was written, in order, and nothing is held after.
func TestBodyBufKeepsOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var b bodyBuf
	var in, out bytes.Buffer
	p := make([]byte, 40<<10)
	for i := range 2000 {
		frame := make([]byte, rng.IntN(maxFrame+1))
		for j := range frame {
			frame[j] = byte(i + j)
		}
		b.write(frame)
		in.Write(frame)
		if b.len() != in.Len()-out.Len() {
			t.Fatalf("after write %d: len %d, want %d", i, b.len(), in.Len()-out.Len())
		}
		if rng.IntN(3) > 0 {
			n := b.read(p[:rng.IntN(len(p))+1])
			out.Write(p[:n])
		}
	}
	for b.len() > 0 {
		n := b.read(p[:rng.IntN(len(p))+1])
		if n == 0 {
			t.Fatal("read 0 bytes of a body that holds some")
		}
		out.Write(p[:n])
	}
	if !bytes.Equal(in.Bytes(), out.Bytes()) {
		t.Fatal("the bytes read are not the bytes written")
	}
	if !b.empty() || len(b.chunks) != 0 {
		t.Fatalf("an empty body holds %d chunks", len(b.chunks)-b.h)
	}
}

// TestBodyBufHoldsWhatIsUnread: a body read as fast as frames come holds one chunk at most,
// and reset gives back what was held.
func TestBodyBufHoldsWhatIsUnread(t *testing.T) {
	var b bodyBuf
	frame := bytes.Repeat([]byte("x"), maxFrame)
	p := make([]byte, maxFrame)
	for range 100 {
		b.write(frame)
		if n := b.read(p); n != maxFrame {
			t.Fatalf("read %d of a frame of %d", n, maxFrame)
		}
		if len(b.chunks) > 1 {
			t.Fatalf("a body read as it comes holds %d chunks", len(b.chunks)-b.h)
		}
	}
	// A reader a frame behind: the list holds what is unread, whatever the body's length.
	b.write(frame)
	for range 1000 {
		b.write(frame)
		if n := b.read(p); n != maxFrame {
			t.Fatalf("read %d of a frame of %d", n, maxFrame)
		}
	}
	if cap(b.chunks) > 4 {
		t.Fatalf("a body a frame behind grew its list to %d", cap(b.chunks))
	}
	b.read(p)
	b.write(frame[:100])
	if len(b.chunks)-b.h != 1 || len(*b.chunks[b.h]) != chunkSizes[0] {
		t.Fatal("a small body did not take a small chunk")
	}
	b.write(frame)
	if n := b.reset(); n != 100+maxFrame {
		t.Fatalf("reset dropped %d bytes, want %d", n, 100+maxFrame)
	}
	if b.len() != 0 || len(b.chunks) != 0 {
		t.Fatal("reset left bytes or chunks")
	}
}

// TestSlowReaderHoldsAWindow: a handler that reads its body a frame behind the agent (an
// upstream slower than the agent) holds about the stream's window, however long the body.
// The body was one slice emptied only when read to its end, so such a reader made the broker
// hold the whole upload.
func TestSlowReaderHoldsAWindow(t *testing.T) {
	const size = 64 << 20
	most := make(chan uint64, 1)
	c, _ := serveTCP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st := r.Body.(*requestBody).st
		p := make([]byte, maxFrame)
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		base, grew := ms.HeapInuse, uint64(0)
		total := 0
		for i := 0; ; i++ {
			st.c.mu.Lock()
			for st.body.len() < 2*maxFrame && !st.remoteDone {
				st.bodyCond.Wait()
			}
			st.c.mu.Unlock()
			n, err := r.Body.Read(p)
			total += n
			if err != nil {
				break
			}
			if i%256 == 0 {
				runtime.ReadMemStats(&ms)
				grew = max(grew, ms.HeapInuse-min(ms.HeapInuse, base))
			}
		}
		most <- grew
		fmt.Fprint(w, total)
	}))
	resp, err := c.Post("http://x.test/a", "application/octet-stream", io.LimitReader(zeros{}, size))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(got) != strconv.Itoa(size) {
		t.Fatalf("the handler read %s bytes, want %d", got, size)
	}
	if grew := <-most; grew > 16<<20 {
		t.Fatalf("the heap grew by %d MiB while a %d MiB body was read a frame behind", grew>>20, size>>20)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
