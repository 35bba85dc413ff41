package main

import (
	"fmt"
	"image/color"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// targetsChart draws the targets of bulk transfers, many keys, a connection per request and
// HTTP/2 clients (those named for issue 40, and the CONNECT's, our bar), and of OTLP export
// (issue 36), from the run's summary, one row each: the
// measured median and the range of its pairs as a margin over the limit, the limit itself the
// line at 1, so that targets of any unit (a ratio, µs) share one axis. A row right of the line
// is met. A target not measured in the run keeps its row, without a point.
func targetsChart(s *summary, file string) error {
	var rows []target
	for _, t := range s.Targets {
		if strings.Contains(t.Name, "issue 40") || strings.Contains(t.Name, "issue 36") || strings.Contains(t.Name, "(our bar)") {
			rows = append(rows, t)
		}
	}
	if len(rows) == 0 {
		return nil
	}
	slices.Reverse(rows) // drawn bottom up: the first target goes on top
	p := plot.New()
	p.Title.Text = "Bulk, many keys, a connection per request, OTLP export: targets (right of the line: met)"
	p.X.Label.Text = "measured / limit (for a most: limit / measured); bars: the pairs' range"
	p.X.Tick.Marker = plainTicks{}
	margin := func(t target, v float64) float64 {
		if t.Op == "<=" {
			if v <= 0 {
				return 2
			}
			return t.Limit / v
		}
		return v / t.Limit
	}
	var pts, errs plotter.XYs
	var lo, hi []float64
	var lxy plotter.XYs
	var ltext []string
	labels := make([]string, len(rows))
	top := 1.2
	for j, t := range rows {
		labels[j] = strings.TrimSuffix(strings.TrimSuffix(t.Name, " (issue 40)"), " (issue 36)")
		if t.Skipped != "" {
			lxy = append(lxy, plotter.XY{X: 0, Y: float64(j)})
			ltext = append(ltext, " "+t.Skipped)
			continue
		}
		m := margin(t, t.Value)
		pts = append(pts, plotter.XY{X: m, Y: float64(j)})
		a, b := m, m
		if t.Pairs > 0 {
			a, b = margin(t, t.Min), margin(t, t.Max)
			if a > b {
				a, b = b, a
			}
		}
		errs = append(errs, plotter.XY{X: m, Y: float64(j)})
		lo, hi = append(lo, m-a), append(hi, b-m)
		top = max(top, b)
		label := fmt.Sprintf(" %.3g %s %s %g", t.Value, t.Unit, t.Op, t.Limit)
		if t.Pairs > 0 {
			label = fmt.Sprintf(" %.3g %s (%.3g to %.3g) %s %g", t.Value, t.Unit, t.Min, t.Max, t.Op, t.Limit)
		}
		lxy = append(lxy, plotter.XY{X: b, Y: float64(j)})
		ltext = append(ltext, label)
	}
	if len(pts) > 0 {
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return err
		}
		sc.GlyphStyle.Color = seriesColors[0]
		sc.GlyphStyle.Radius = vg.Points(3.5)
		sc.GlyphStyle.Shape = draw.CircleGlyph{}
		bars, err := plotter.NewXErrorBars(xErrors{errs, lo, hi})
		if err != nil {
			return err
		}
		bars.Color = seriesColors[0]
		p.Add(bars, sc)
	}
	limit, err := plotter.NewLine(plotter.XYs{{X: 1, Y: -0.5}, {X: 1, Y: float64(len(rows)) - 0.5}})
	if err != nil {
		return err
	}
	limit.Color = color.RGBA{0xd6, 0x27, 0x28, 0xff}
	limit.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(limit)
	ls, err := plotter.NewLabels(plotter.XYLabels{XYs: lxy, Labels: ltext})
	if err != nil {
		return err
	}
	for i := range ls.TextStyle {
		ls.TextStyle[i].Font.Size = vg.Points(7)
		ls.TextStyle[i].YAlign = draw.YCenter
	}
	p.Add(ls)
	p.X.Min, p.X.Max = 0, top*1.6 // room for the labels
	p.NominalY(labels...)
	p.Y.Min, p.Y.Max = -0.5, float64(len(rows))-0.5
	date := s.Started
	if len(date) >= 10 {
		date = date[:10]
	}
	return save(p, stamp(s.Machine, date, s.Commit)+". Each value is the median of paired rounds in one run.", file)
}

// xErrors are the error bars of points: lo to the left and hi to the right of each.
type xErrors struct {
	plotter.XYs
	lo, hi []float64
}

func (e xErrors) XError(i int) (float64, float64) { return e.lo[i], e.hi[i] }
