package telemetry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// rawSender sends an encoded export request to the collector, over gRPC or HTTP, retrying
// what the collector may take later (it is down, or busy) until ctx ends.
type rawSender struct {
	grpc       *grpc.ClientConn
	method     string // gRPC
	http       *http.Client
	url        string // OTLP/HTTP
	newReply   func() proto.Message
	retryFirst time.Duration
}

// sender sends one signal's exports over c: to the gRPC method, or to path over OTLP/HTTP.
func (c *conn) sender(grpcOn bool, method, path string, reply func() proto.Message) *rawSender {
	if grpcOn {
		return &rawSender{grpc: c.grpc, method: method, newReply: reply, retryFirst: 200 * time.Millisecond}
	}
	return &rawSender{http: c.http, url: c.url(path), retryFirst: 200 * time.Millisecond}
}

func (s *rawSender) send(ctx context.Context, body []byte) error {
	wait := s.retryFirst
	for {
		err := s.once(ctx, body)
		if err == nil || !retryable(err) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}

func (s *rawSender) once(ctx context.Context, body []byte) error {
	if s.grpc != nil {
		return s.grpc.Invoke(ctx, s.method, rawMessage(body), s.newReply(), grpc.ForceCodec(rawCodec{}))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode >= 300 {
		return httpStatusError(resp.StatusCode)
	}
	return nil
}

type httpStatusError int

func (e httpStatusError) Error() string {
	return fmt.Sprintf("the collector answered HTTP %d %s", int(e), http.StatusText(int(e)))
}

// retryable: the collector may take it later (OTLP's retryable answers; a network error).
func retryable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var h httpStatusError
	if errors.As(err, &h) {
		return h == http.StatusTooManyRequests || h == http.StatusBadGateway || h == http.StatusServiceUnavailable || h == http.StatusGatewayTimeout
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.Unavailable, codes.ResourceExhausted, codes.Aborted, codes.OutOfRange, codes.DataLoss, codes.Canceled, codes.DeadlineExceeded:
			return st.Code() != codes.Canceled && st.Code() != codes.DeadlineExceeded
		case codes.Unknown:
			return true // not a gRPC answer: a network error
		}
		return false
	}
	return true
}

// rawMessage is an encoded protobuf message; rawCodec sends it as it is and decodes replies
// as protobuf.
type rawMessage []byte

type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	if m, ok := v.(rawMessage); ok {
		return m, nil
	}
	return proto.Marshal(v.(proto.Message))
}

func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }
func (rawCodec) Name() string                       { return "proto" }
