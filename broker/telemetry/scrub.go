package telemetry

import (
	"go.opentelemetry.io/otel/attribute"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/capbroker/capbroker/broker/scrub"
)

// Every string exported passes through the scrubber of every secret the broker knows
// (inject.Known.Everything), on the export goroutine: a span's name, attributes, events and
// status, a log record's body and attributes, a metric point's attributes. The request path
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

func (s scrubbedSpan) Status() sdktrace.Status {
	st := s.ReadOnlySpan.Status()
	st.Description = s.r.String(st.Description)
	return st
}

func scrubSpans(r *scrub.Replacer, spans []sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	if r.Empty() {
		return spans
	}
	out := make([]sdktrace.ReadOnlySpan, len(spans))
	for i, s := range spans {
		out[i] = scrubbedSpan{s, r}
	}
	return out
}

// scrubRecords scrubs the records in place (they are the queue's own copies).
func scrubRecords(r *scrub.Replacer, recs []sdklog.Record) {
	if r.Empty() {
		return
	}
	for i := range recs {
		rec := &recs[i]
		if v, changed := scrubValue(r, rec.Body()); changed {
			rec.SetBody(v)
		}
		var kvs []attribute.KeyValue
		rec.WalkAttributes(func(kv attribute.KeyValue) bool { kvs = append(kvs, kv); return true })
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
