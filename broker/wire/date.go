package wire

import (
	"net/http"
	"sync/atomic"
	"time"
)

// Date is the current time as a response's Date field has it (http.TimeFormat), formatted
// once a second for every server of the broker's (broker/http1, broker/http2srv).
func Date() string {
	now := time.Now()
	if d := lastDate.Load(); d != nil && d.sec == now.Unix() {
		return d.text
	}
	d := &date{sec: now.Unix(), text: now.UTC().Format(http.TimeFormat)}
	lastDate.Store(d)
	return d.text
}

type date struct {
	sec  int64
	text string
}

var lastDate atomic.Pointer[date]
