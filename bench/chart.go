package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	_ "gonum.org/v1/plot/vg/vgimg" // PNG, for a look at a chart without an SVG viewer
)

// chartsDir is where the charts are drawn, as SVG: one per curve (and one more per extra
// figure its points carry), and headline.svg, the peer comparison.
const chartsDir = "docs/benchmarks"

// Colours: the broker's paths in blues and greens, the peers in warm colours, direct in grey.
var seriesColors = []color.Color{
	color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, color.RGBA{0xd6, 0x27, 0x28, 0xff},
	color.RGBA{0x94, 0x67, 0xbd, 0xff}, color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0x8c, 0x56, 0x4b, 0xff},
}

// stamp is the line every chart carries: where, when and from which commit it was measured.
func stamp(machine, date, commit string) string {
	return fmt.Sprintf("%s · %s · commit %s", orUnknown(machine), orUnknown(date), orUnknown(commit))
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// gitCommit is the commit the bench runs at, short, with "-dirty" when tracked files other
// than the bench's own results and charts (which a run rewrites) have changes.
func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return ""
	}
	commit := strings.TrimSpace(string(out))
	st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no", "--", ".",
		":(exclude)"+filepath.Dir(curvesDir), ":(exclude)"+chartsDir).Output()
	if err == nil && len(bytes.TrimSpace(st)) > 0 {
		commit += "-dirty"
	}
	return commit
}

// drawCharts draws a chart for every curve stored in curves and the peer comparison from
// the summary in results (when it exists), as SVG files under out; it returns their paths.
func drawCharts(results, curves, out string) ([]string, error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	var drawn []string
	files, _ := filepath.Glob(filepath.Join(curves, "*.json"))
	slices.Sort(files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return drawn, err
		}
		var c Curve
		if err := json.Unmarshal(b, &c); err != nil {
			return drawn, fmt.Errorf("%s: %w", f, err)
		}
		if c.Name == "" {
			c.Name = strings.TrimSuffix(filepath.Base(f), ".json")
		}
		names, err := curveCharts(c, out)
		drawn = append(drawn, names...)
		if err != nil {
			return drawn, fmt.Errorf("%s: %w", f, err)
		}
	}
	if b, err := os.ReadFile(results); err == nil {
		var s summary
		if err := json.Unmarshal(b, &s); err != nil {
			return drawn, fmt.Errorf("%s: %w", results, err)
		}
		name := filepath.Join(out, "headline.svg")
		if err := headlineChart(&s, name); err != nil {
			return drawn, err
		}
		drawn = append(drawn, name)
		name = filepath.Join(out, "targets.svg")
		if err := targetsChart(&s, name); err != nil {
			return drawn, err
		}
		drawn = append(drawn, name)
	}
	return drawn, nil
}

// curveCharts draws c as out/<name>.svg: Y by X for each series, solid, and each series'
// baseline, dashed, in the same colour. Every figure its points carry in Extra is drawn
// the same way as out/<name>-<figure>.svg, with "baseline_<figure>" as its baseline and
// "<figure>_min" and "<figure>_max", when present, as its range. Figures named "info_..."
// are recorded in the JSON only.
func curveCharts(c Curve, out string) ([]string, error) {
	var drawn []string
	name := filepath.Join(out, c.Name+".svg")
	get := func(p Point) (float64, float64, float64, float64) { return p.Y, p.Baseline, math.NaN(), math.NaN() }
	if err := curveChart(c, c.Title, c.YLabel, get, name); err != nil {
		return nil, err
	}
	drawn = append(drawn, name)
	for _, key := range extraKeys(c) {
		get := func(p Point) (float64, float64, float64, float64) {
			v, ok := p.Extra[key]
			if !ok {
				v = math.NaN()
			}
			base, ok := p.Extra["baseline_"+key]
			if !ok {
				base = 0
			}
			lo, okLo := p.Extra[key+"_min"]
			hi, okHi := p.Extra[key+"_max"]
			if !okLo || !okHi {
				lo, hi = math.NaN(), math.NaN()
			}
			return v, base, lo, hi
		}
		name := filepath.Join(out, c.Name+"-"+strings.ReplaceAll(key, "_", "-")+".svg")
		label := strings.ReplaceAll(key, "_", " ")
		if err := curveChart(c, c.Title+": "+label, label, get, name); err != nil {
			return drawn, err
		}
		drawn = append(drawn, name)
	}
	return drawn, nil
}

// extraKeys are the figures of c's points drawn as charts of their own, sorted.
func extraKeys(c Curve) []string {
	seen := map[string]bool{}
	for _, s := range c.Series {
		for _, p := range s.Points {
			for k := range p.Extra {
				if strings.HasPrefix(k, "baseline_") || strings.HasPrefix(k, "info_") || strings.HasSuffix(k, "_min") || strings.HasSuffix(k, "_max") {
					continue
				}
				seen[k] = true
			}
		}
	}
	return slices.Sorted(func(yield func(string) bool) {
		for k := range seen {
			if !yield(k) {
				return
			}
		}
	})
}

// curveChart draws one figure of c's points, read by get (value, baseline, range low and
// high; NaN leaves a value out, a zero baseline draws none), to file.
func curveChart(c Curve, title, ylabel string, get func(Point) (y, base, lo, hi float64), file string) error {
	p := plot.New()
	p.Title.Text = title + "\n" + stamp(c.Machine, c.Date, c.Commit)
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.X.Label.Text = c.XLabel
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Add(plotter.NewGrid())
	var xmin, ymin, ytop = math.Inf(1), math.Inf(1), math.Inf(-1)
	logY := c.LogY
	var drawnBase []plotter.XYs
	for i, s := range c.Series {
		col := seriesColors[i%len(seriesColors)]
		var pts, base plotter.XYs
		var errs plotter.YErrors
		var errPts plotter.XYs
		for _, pt := range s.Points {
			y, b, lo, hi := get(pt)
			if math.IsNaN(y) || (c.LogX && pt.X <= 0) || (logY && y <= 0) {
				continue
			}
			pts = append(pts, plotter.XY{X: pt.X, Y: y})
			xmin, ymin, ytop = min(xmin, pt.X), min(ymin, y), max(ytop, y)
			if b != 0 && !math.IsNaN(b) && (!logY || b > 0) {
				base = append(base, plotter.XY{X: pt.X, Y: b})
				ymin = min(ymin, b)
			}
			if !math.IsNaN(lo) && !math.IsNaN(hi) && (!logY || lo > 0) { // a log axis has no zero
				errPts = append(errPts, plotter.XY{X: pt.X, Y: y})
				errs = append(errs, struct{ Low, High float64 }{y - lo, hi - y})
			}
		}
		if len(pts) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		l.Color, sc.Color = col, col
		l.Width = vg.Points(1.5)
		sc.Shape = draw.CircleGlyph{}
		p.Add(l, sc)
		p.Legend.Add(s.Name, l, sc)
		// Series measured beside the same baseline (the same points) draw it once.
		shared := slices.IndexFunc(drawnBase, func(b plotter.XYs) bool { return slices.Equal(b, base) }) >= 0
		if len(base) > 0 && shared {
			base = nil
		}
		if len(base) > 0 {
			drawnBase = append(drawnBase, base)
			bl, err := plotter.NewLine(base)
			if err != nil {
				return err
			}
			bl.Color = col
			bl.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			p.Add(bl)
			p.Legend.Add(s.Name+": baseline", bl)
		}
		if len(errPts) > 0 {
			eb, err := plotter.NewYErrorBars(struct {
				plotter.XYs
				plotter.YErrors
			}{errPts, errs})
			if err != nil {
				return err
			}
			eb.Color = col
			p.Add(eb)
		}
	}
	if c.LogX && !math.IsInf(xmin, 1) {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	// A log axis over one value would be padded below zero: such a figure is drawn linear.
	if logY && !math.IsInf(ymin, 1) && ytop > ymin {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	} else {
		p.Y.Tick.Marker = plainTicks{}
		if !math.IsInf(ymin, 1) && ymin >= 0 {
			p.Y.Min = 0 // a linear axis starts at zero, so that ratios read true
		}
	}
	if !c.LogX {
		p.X.Tick.Marker = plainTicks{}
	}
	var ymax float64
	for _, s := range c.Series {
		for _, pt := range s.Points {
			y, b, _, hi := get(pt)
			for _, v := range []float64{y, b, hi} {
				if !math.IsNaN(v) {
					ymax = max(ymax, v)
				}
			}
		}
	}
	if !logY && ymax > 0 {
		p.Y.Max = ymax * 1.2 // room for the legend
	}
	return save(p, c.Note, file)
}

// save writes p to file (its format from the name: svg or png) with note, if any, in small
// type under it.
func save(p *plot.Plot, note string, file string) error {
	const w, h = 7 * vg.Inch, 4.5 * vg.Inch
	sty := draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, vg.Points(8)), Handler: plot.DefaultTextHandler}
	var lines []string
	if note != "" {
		lines = strings.Split(wrap(note, 130), "\n")
	}
	lead := vg.Points(10)
	extra := lead*vg.Length(len(lines)) + vg.Points(6)*vg.Length(min(len(lines), 1))
	img, err := draw.NewFormattedCanvas(w, h+extra, strings.TrimPrefix(filepath.Ext(file), "."))
	if err != nil {
		return err
	}
	dc := draw.New(img)
	for i, l := range lines {
		dc.FillText(sty, vg.Point{X: vg.Points(6), Y: extra - lead*vg.Length(i+1)}, l)
	}
	p.Draw(draw.Crop(dc, 0, 0, extra, 0))
	return writeCanvas(img, file)
}

// plainTicks are plot's default ticks labelled without trailing zeros (25000, not 25000.00).
type plainTicks struct{}

func (plainTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i, t := range ticks {
		if t.Label != "" {
			ticks[i].Label = strconv.FormatFloat(t.Value, 'g', 6, 64)
		}
	}
	return ticks
}

// wrap breaks s into lines of at most n bytes at spaces.
func wrap(s string, n int) string {
	var b strings.Builder
	line := 0
	for i, w := range strings.Fields(s) {
		if i > 0 && line+1+len(w) > n {
			b.WriteByte('\n')
			line = 0
		} else if i > 0 {
			b.WriteByte(' ')
			line++
		}
		b.WriteString(w)
		line += len(w)
	}
	return b.String()
}

// headlineRows are the paths of the peer comparison, in the order drawn (top to bottom), with
// their labels and colours: direct in grey, the broker's paths in blue, the relay (the floor)
// in green, the other proxies in orange.
var headlineRows = []struct{ path, label, group string }{
	{"direct", "direct HTTPS (no proxy)", "direct"},
	{"tunnel", "broker, CONNECT tunnel", "broker"},
	{"smokescreen", "smokescreen (tunnel)", "peer"},
	{"relay", "relay (bare Go interceptor: the floor)", "relay"},
	{"intercept", "broker, intercepted", "broker"},
	{"full", "broker, full pipeline", "broker"},
	{"squid", "squid ssl-bump", "peer"},
	{"mitmproxy", "mitmproxy", "peer"},
}

var groupColors = map[string]color.Color{
	"direct": color.RGBA{0x99, 0x99, 0x99, 0xff}, "broker": seriesColors[0],
	"relay": seriesColors[1], "peer": seriesColors[4],
}

// headlineChart draws the peer comparison of s to file: the throughput of each path at 32
// connections, and the latency each proxy adds at the median, side by side.
func headlineChart(s *summary, file string) error {
	var rows []int
	for i, r := range headlineRows {
		if s.Throughput[r.path][32] > 0 {
			rows = append(rows, i)
		}
	}
	if len(rows) == 0 {
		return fmt.Errorf("%s: no throughput at 32 connections to draw", file)
	}
	// Horizontal bars are drawn bottom up: the first row goes on top.
	slices.Reverse(rows)
	labels := make([]string, len(rows))
	for j, i := range rows {
		labels[j] = headlineRows[i].label
	}
	thr, err := barPlot(rows, labels, "requests per second, 32 connections, keep-alive", func(path string) (float64, bool) {
		v := s.Throughput[path][32]
		return v, v > 0
	}, func(v float64) string { return fmt.Sprintf("%.0f", v) }, 0)
	if err != nil {
		return err
	}
	thr.Title.Text = "Throughput (higher is better)"
	lat, err := barPlot(rows, make([]string, len(rows)), fmt.Sprintf("added p50 latency, ms, at %d req/s open loop", s.LatencyRate), func(path string) (float64, bool) {
		v, ok := s.AddedP50MS[path]
		return v, ok && path != "direct"
	}, func(v float64) string { return fmt.Sprintf("%.2f ms", v) }, 2)
	if err != nil {
		return err
	}
	lat.Title.Text = "Added latency (lower is better)"

	const w, h = 11 * vg.Inch, 4.6 * vg.Inch
	img, err := draw.NewFormattedCanvas(w, h, strings.TrimPrefix(filepath.Ext(file), "."))
	if err != nil {
		return err
	}
	dc := draw.New(img)
	title := draw.TextStyle{Color: color.Black, Font: font.From(plot.DefaultFont, vg.Points(13)), Handler: plot.DefaultTextHandler, XAlign: draw.XCenter}
	caption := title
	caption.Font = font.From(plot.DefaultFont, vg.Points(9))
	dc.FillText(title, vg.Point{X: w / 2, Y: h - vg.Points(16)}, "capbroker beside direct HTTPS and other proxies, same upstream, same machine")
	date := s.Started
	if len(date) >= 10 {
		date = date[:10]
	}
	dc.FillText(caption, vg.Point{X: w / 2, Y: h - vg.Points(30)}, stamp(s.Machine, date, s.Commit))
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadTop: vg.Points(40), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(14), PadX: vg.Points(10)}
	canvases := plot.Align([][]*plot.Plot{{thr, lat}}, tiles, dc)
	thr.Draw(canvases[0][0])
	lat.Draw(canvases[0][1])
	return writeCanvas(img, file)
}

// barPlot is one horizontal bar per row with its value written beside it. With clip above
// zero, a bar longer than clip times the longest of the others is cut there (mitmproxy's
// queue at a rate over its capacity) and keeps its true value in its label.
func barPlot(rows []int, labels []string, xlabel string, value func(path string) (float64, bool), format func(float64) string, clip float64) (*plot.Plot, error) {
	p := plot.New()
	p.X.Label.Text = xlabel
	p.X.Min = 0
	p.X.Tick.Marker = plainTicks{}
	vals := make([]float64, len(rows))
	has := make([]bool, len(rows))
	for j, i := range rows {
		vals[j], has[j] = value(headlineRows[i].path)
	}
	limit := math.Inf(1)
	if clip > 0 {
		sorted := []float64{}
		for j, v := range vals {
			if has[j] {
				sorted = append(sorted, v)
			}
		}
		slices.Sort(sorted)
		if len(sorted) > 1 && sorted[len(sorted)-1] > clip*sorted[len(sorted)-2] && sorted[len(sorted)-2] > 0 {
			limit = clip * sorted[len(sorted)-2]
		}
	}
	var lxy plotter.XYs
	var ltext []string
	top := 0.0
	for j, i := range rows {
		if !has[j] {
			continue
		}
		v := vals[j]
		drawn := min(max(v, 0), limit)
		bc, err := plotter.NewBarChart(plotter.Values{drawn}, vg.Points(14))
		if err != nil {
			return nil, err
		}
		bc.Horizontal = true
		bc.XMin = float64(j)
		bc.Color = groupColors[headlineRows[i].group]
		bc.LineStyle.Width = 0
		p.Add(bc)
		label := format(v)
		if v > limit {
			label += " (over capacity: queued)"
		}
		lxy = append(lxy, plotter.XY{X: drawn, Y: float64(j)})
		ltext = append(ltext, " "+label)
		top = max(top, drawn)
	}
	ls, err := plotter.NewLabels(plotter.XYLabels{XYs: lxy, Labels: ltext})
	if err != nil {
		return nil, err
	}
	for i := range ls.TextStyle {
		ls.TextStyle[i].Font.Size = vg.Points(8)
		ls.TextStyle[i].YAlign = draw.YCenter
	}
	p.Add(ls)
	p.X.Max = top * 1.45 // room for the labels
	p.NominalY(labels...)
	// Every row keeps its place, with a bar or without, so that the two plots' rows align.
	p.Y.Min, p.Y.Max = -0.5, float64(len(rows))-0.5
	return p, nil
}

// writeCanvas writes a drawn canvas to file.
func writeCanvas(img io.WriterTo, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := img.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
