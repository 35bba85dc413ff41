//go:build !linux

package nflog

import (
	"context"
	"errors"
)

// Reader is a netfilter log group's socket: Linux only.
type Reader struct{}

// ErrOverrun: see the Linux build.
var ErrOverrun = errors.New("nflog: log messages lost (socket buffer overrun)")

// Open fails: netfilter log groups are Linux's.
func Open(group uint16) (*Reader, error) {
	return nil, errors.New("reading a netfilter log group (transparent.log_group) needs Linux")
}

// Read fails: see Open.
func (r *Reader) Read() ([]Packet, error) { return nil, errors.New("nflog needs Linux") }

// Close does nothing.
func (r *Reader) Close() error { return nil }

// Run fails: see Open.
func Run(ctx context.Context, r *Reader, refuse func(Packet), onErr func(error)) error {
	return errors.New("nflog needs Linux")
}
