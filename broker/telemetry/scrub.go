package telemetry

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/capbroker/capbroker/broker/scrub"
)

// Every string exported passes through the scrubber of every secret the broker knows
// (inject.Known.Everything): a span's name, attributes and status and a log record's body and
// attributes as they are encoded, on the goroutine that ends the request (spanwire.go,
// logwire.go; encoded.go says why there), and a metric point's attributes here, on the
// export goroutine.

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
