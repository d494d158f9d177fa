package main

import (
	"fmt"
	"io"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

func init() {
	// Sans rather than gonum's serif default: the SVG names the family and
	// viewers without Liberation fall back to their own sans.
	plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"}
}

// line is one system's aggregate tokens/s at each concurrency it has; style
// picks its colour and marker, the same for a system whichever others ran.
type line struct {
	name    string
	style   int
	ceiling bool
	xy      plotter.XYs
}

func (r *report) lines() []line {
	var out []line
	add := func(name string, style int, f func(c int) (float64, bool)) {
		l := line{name: name, style: style, ceiling: style >= 2}
		for _, c := range r.Opts.conc {
			if y, ok := f(c); ok && y > 0 {
				l.xy = append(l.xy, plotter.XY{X: float64(c), Y: y})
			}
		}
		if len(l.xy) > 0 {
			out = append(out, l)
		}
	}
	add("ours (hydra-engine + llama plugin)", 0, func(c int) (float64, bool) { st, ok := r.Ours.stat(c); return st.Agg, ok })
	add("Ollama", 1, func(c int) (float64, bool) { st, ok := r.Ollama.stat(c); return st.Agg, ok })
	for i, run := range r.Ceilings {
		add(run.Label+" (llama-batched)", 2+i, func(c int) (float64, bool) { res, ok := r.ceiling(i, c); return res.E2ETPS, ok })
	}
	return out
}

// chart writes the SVG of chartPlot.
func (r *report) chart(w io.Writer) error {
	p, err := r.chartPlot()
	if err != nil {
		return err
	}
	c := vgsvg.New(8*vg.Inch, 5*vg.Inch)
	p.Draw(draw.New(c))
	_, err = c.WriteTo(w)
	return err
}

// chartPlot is aggregate tokens/s against concurrency (log axis), one line
// per system.
func (r *report) chartPlot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Decode throughput, %d tokens a request (%s)", r.Opts.n, r.Mach.tag())
	p.Title.Padding = vg.Points(8)
	p.X.Label.Text = "concurrent requests"
	p.Y.Label.Text = "aggregate tokens/s"
	p.X.Scale = plot.LogScale{}
	var ticks []plot.Tick
	for _, c := range r.Opts.conc {
		ticks = append(ticks, plot.Tick{Value: float64(c), Label: strconv.Itoa(c)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Add(plotter.NewGrid())
	top := 0.0
	for _, l := range r.lines() {
		ln, pts, err := plotter.NewLinePoints(l.xy)
		if err != nil {
			return nil, err
		}
		ln.Color, pts.Color = plotutil.Color(l.style), plotutil.Color(l.style)
		ln.Width = vg.Points(1.5)
		pts.Shape = plotutil.Shape(l.style)
		if l.ceiling {
			ln.Dashes = []vg.Length{vg.Points(6), vg.Points(3)} // the ceilings
		}
		p.Add(ln, pts)
		p.Legend.Add(l.name, ln, pts)
		for _, xy := range l.xy {
			top = max(top, xy.Y)
		}
	}
	lo, hi := float64(r.Opts.conc[0]), float64(r.Opts.conc[0])
	for _, c := range r.Opts.conc {
		lo, hi = min(lo, float64(c)), max(hi, float64(c))
	}
	if lo == hi {
		lo, hi = lo/2, hi*2 // a log axis needs a range
	}
	p.X.Min, p.X.Max = lo/1.15, hi*1.15
	p.Y.Min, p.Y.Max = 0, max(top*1.35, 1) // headroom for the legend
	return p, nil
}
