package telemetry

import (
	"go.opentelemetry.io/otel/attribute"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/capbroker/capbroker/broker/scrub"
)

// Every string exported passes through the scrubber of every secret the broker knows
// (inject.Known.Everything), on the export goroutine: a span's name, attributes, events, links
// and status, a log record's body and attributes, a metric point's attributes. The request path
// pays nothing for it.

func scrubValue(r *scrub.Replacer, v attribute.Value) (attribute.Value, bool) {
	switch v.Type() {
	case attribute.STRING:
		s := v.AsString()
		if t := r.String(s); t != s {
			return attribute.StringValue(t), true
		}
	case attribute.STRINGSLICE:
		ss := v.AsStringSlice()
		changed := false
		for i, s := range ss {
			if t := r.String(s); t != s {
				ss[i], changed = t, true
			}
		}
		if changed {
			return attribute.StringSliceValue(ss), true
		}
	}
	return v, false
}

// scrubAttrs returns kvs scrubbed (kvs itself when nothing changed).
func scrubAttrs(r *scrub.Replacer, kvs []attribute.KeyValue) []attribute.KeyValue {
	var out []attribute.KeyValue
	for i, kv := range kvs {
		if v, changed := scrubValue(r, kv.Value); changed {
			if out == nil {
				out = append([]attribute.KeyValue(nil), kvs...)
			}
			out[i] = attribute.KeyValue{Key: kv.Key, Value: v}
		}
	}
	if out == nil {
		return kvs
	}
	return out
}

// scrubbedSpan is an ended span as exported: its strings scrubbed.
type scrubbedSpan struct {
	sdktrace.ReadOnlySpan
	r *scrub.Replacer
}

func (s scrubbedSpan) Name() string { return s.r.String(s.ReadOnlySpan.Name()) }

func (s scrubbedSpan) Attributes() []attribute.KeyValue {
	return scrubAttrs(s.r, s.ReadOnlySpan.Attributes())
}

func (s scrubbedSpan) Events() []sdktrace.Event {
	evs := s.ReadOnlySpan.Events()
	if len(evs) == 0 {
		return evs
	}
	out := make([]sdktrace.Event, len(evs))
	for i, e := range evs {
		e.Name = s.r.String(e.Name)
		e.Attributes = scrubAttrs(s.r, e.Attributes)
		out[i] = e
	}
	return out
}

func (s scrubbedSpan) Links() []sdktrace.Link {
	ls := s.ReadOnlySpan.Links()
	if len(ls) == 0 {
		return ls
	}
	out := make([]sdktrace.Link, len(ls))
	for i, l := range ls {
		l.Attributes = scrubAttrs(s.r, l.Attributes)
		out[i] = l
	}
	return out
}

func (s scrubbedSpan) Status() sdktrace.Status {
	st := s.ReadOnlySpan.Status()
	st.Description = s.r.String(st.Description)
	return st
}

// scrubSpans scrubs the spans of a batch in place (the batch is the queue's own slice): a span
// with a secret in any of its strings is replaced by its scrubbed view; one without is passed
// as it is, after one look at each string, without an allocation.
func scrubSpans(r *scrub.Replacer, spans []sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	if r.Empty() {
		return spans
	}
	for i, s := range spans {
		if holdsSecret(r, s) {
			spans[i] = scrubbedSpan{s, r}
		}
	}
	return spans
}

// holdsSecret reports whether any string of s would be scrubbed.
func holdsSecret(r *scrub.Replacer, s sdktrace.ReadOnlySpan) bool {
	if r.String(s.Name()) != s.Name() || r.String(s.Status().Description) != s.Status().Description {
		return true
	}
	if attrsHoldSecret(r, s.Attributes()) {
		return true
	}
	for _, e := range s.Events() {
		if r.String(e.Name) != e.Name || attrsHoldSecret(r, e.Attributes) {
			return true
		}
	}
	for _, l := range s.Links() {
		if attrsHoldSecret(r, l.Attributes) {
			return true
		}
	}
	return false
}

func attrsHoldSecret(r *scrub.Replacer, kvs []attribute.KeyValue) bool {
	for _, kv := range kvs {
		if _, changed := scrubValue(r, kv.Value); changed {
			return true
		}
	}
	return false
}

// scrubRecords scrubs the records in place (they are the queue's own copies).
func scrubRecords(r *scrub.Replacer, recs []sdklog.Record) {
	if r.Empty() {
		return
	}
	var kvs []attribute.KeyValue // reused from record to record
	walk := func(kv attribute.KeyValue) bool { kvs = append(kvs, kv); return true }
	for i := range recs {
		rec := &recs[i]
		if v, changed := scrubValue(r, rec.Body()); changed {
			rec.SetBody(v)
		}
		kvs = kvs[:0]
		rec.WalkAttributes(walk)
		if out := scrubAttrs(r, kvs); len(kvs) > 0 && &out[0] != &kvs[0] {
			rec.SetAttributes(out...)
		}
	}
}

// scrubMetrics scrubs the attributes of every data point in place.
func scrubMetrics(r *scrub.Replacer, rm *metricdata.ResourceMetrics) {
	if r.Empty() {
		return
	}
	set := func(s *attribute.Set) {
		kvs := s.ToSlice()
		if out := scrubAttrs(r, kvs); len(kvs) > 0 && &out[0] != &kvs[0] {
			*s = attribute.NewSet(out...)
		}
	}
	for i := range rm.ScopeMetrics {
		ms := rm.ScopeMetrics[i].Metrics
		for j := range ms {
			switch d := ms[j].Data.(type) {
			case metricdata.Sum[float64]:
				points(d.DataPoints, set)
			case metricdata.Sum[int64]:
				points(d.DataPoints, set)
			case metricdata.Gauge[float64]:
				points(d.DataPoints, set)
			case metricdata.Gauge[int64]:
				points(d.DataPoints, set)
			case metricdata.Histogram[float64]:
				for k := range d.DataPoints {
					set(&d.DataPoints[k].Attributes)
				}
			case metricdata.Histogram[int64]:
				for k := range d.DataPoints {
					set(&d.DataPoints[k].Attributes)
				}
			case metricdata.ExponentialHistogram[float64]:
				for k := range d.DataPoints {
					set(&d.DataPoints[k].Attributes)
				}
			case metricdata.Summary:
				for k := range d.DataPoints {
					set(&d.DataPoints[k].Attributes)
				}
			}
		}
	}
}

func points[N int64 | float64](dps []metricdata.DataPoint[N], set func(*attribute.Set)) {
	for k := range dps {
		set(&dps[k].Attributes)
	}
}
