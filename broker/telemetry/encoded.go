package telemetry

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/sdk/resource"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Each trace and each audit record is written as OTLP protobuf on the goroutine that ends it,
// while what it is made of is still in the processor's caches: a trace as its spans (the
// ScopeSpans' span fields), a record as one ScopeLogs' log_record field, every string
// scrubbed. What is queued is those bytes, in a pooled buffer: no audit event copied, nothing
// for the garbage collector to follow, no string made of the audit line. The export goroutine
// only joins a batch of them under the signal's resource and scope.

// encoded is one trace's spans, or one record, as protobuf fields.
type encoded struct {
	b     *[]byte // from bufs
	items int     // spans, or records: what the drop and export counts count
}

// bufs holds the buffers items are encoded in.
var bufs = sync.Pool{New: func() any { return new([]byte) }}

// maxPooled is the largest buffer kept for another item: a record of a large audit line is
// let go rather than held by the pool.
const maxPooled = 16 << 10

func getBuf() *[]byte { return bufs.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) <= maxPooled {
		*b = (*b)[:0]
		bufs.Put(b)
	}
}

// exporter sends batches of encoded items of one signal as export requests. Traces and logs
// have the same shape: the request's field 1 a resource's items (ResourceSpans,
// ResourceLogs), whose field 1 is the resource and field 2 a scope's items (ScopeSpans,
// ScopeLogs), whose field 1 is the scope and field 2 the items.
type exporter struct {
	send     func(context.Context, []byte) error
	resource []byte // the resource field, encoded
	scope    []byte // the scope field, encoded
	b        []byte // the export goroutine's buffer
}

// Field numbers shared by ExportTraceServiceRequest and ExportLogsServiceRequest.
const (
	fReqResource   = 1 // the request's ResourceSpans / ResourceLogs
	fResource      = 1 // their Resource
	fResourceScope = 2 // their ScopeSpans / ScopeLogs
	fScope         = 1 // those's InstrumentationScope
)

func newExporter(send func(context.Context, []byte) error, res *resource.Resource, scope string) (*exporter, error) {
	rb, sb, err := resourceAndScope(res, scope)
	if err != nil {
		return nil, err
	}
	return &exporter{send: send, resource: rb, scope: sb}, nil
}

// resourceAndScope are the resource and scope fields of a ResourceSpans or ResourceLogs and
// its ScopeSpans or ScopeLogs (field 1 in each), encoded once.
func resourceAndScope(res *resource.Resource, scope string) (rb, sb []byte, err error) {
	r := &resourcepb.Resource{}
	for _, kv := range res.Attributes() {
		r.Attributes = append(r.Attributes, &commonpb.KeyValue{Key: string(kv.Key), Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: kv.Value.Emit()}}})
	}
	if rb, err = proto.Marshal(r); err != nil {
		return nil, nil, err
	}
	if sb, err = proto.Marshal(&commonpb.InstrumentationScope{Name: scope}); err != nil {
		return nil, nil, err
	}
	return protowire.AppendBytes(protowire.AppendTag(nil, fResource, protowire.BytesType), rb),
		protowire.AppendBytes(protowire.AppendTag(nil, fScope, protowire.BytesType), sb), nil
}

// export joins batch under the resource and scope, gives the buffers back, and sends it.
func (e *exporter) export(ctx context.Context, batch []encoded) error {
	return e.send(ctx, e.join(batch))
}

// join writes batch as one export request into e.b, each length computed before it is
// written, and gives the items' buffers back.
func (e *exporter) join(batch []encoded) []byte {
	items := 0
	for _, it := range batch {
		items += len(*it.b)
	}
	scope := len(e.scope) + items
	res := len(e.resource) + protowire.SizeTag(fResourceScope) + protowire.SizeBytes(scope)
	b := e.b[:0]
	b = protowire.AppendTag(b, fReqResource, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(res))
	b = append(b, e.resource...)
	b = protowire.AppendTag(b, fResourceScope, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(scope))
	b = append(b, e.scope...)
	for _, it := range batch {
		b = append(b, *it.b...)
		putBuf(it.b)
	}
	e.b = b
	return b
}
