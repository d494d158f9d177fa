package main

import (
	"fmt"
	"image/color"
	"io"
	"slices"

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

// series is one kind of bar in every panel of the chart.
type series struct {
	name  string
	match func(engineConfig) bool
}

// chartSeries are the bars of a panel.
var chartSeries = []series{
	{"shm ring", func(c engineConfig) bool { return c.Plane == "shm" }},
	{"gRPC stream", func(c engineConfig) bool { return c.Plane == "grpc" }},
}

// svg writes state-transfer.svg: one panel per transport × direction, bars
// of median GB/s grouped by chunk size, the raw socket's median as a dashed
// line.
func (r *report) svg(w io.Writer) error {
	const cols = 2
	rows := (len(r.Panels) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
	}
	for i, pn := range r.Panels {
		p, err := panelPlot(pn)
		if err != nil {
			return err
		}
		grid[i/cols][i%cols] = p
	}
	width, height := 6*vg.Inch*cols, 4*vg.Inch*vg.Length(rows)
	c := vgsvg.New(width, height)
	dc := draw.New(c)
	tiles := draw.Tiles{
		Rows: rows, Cols: cols,
		PadX: vg.Points(24), PadY: vg.Points(24),
		PadTop: vg.Points(8), PadBottom: vg.Points(8), PadLeft: vg.Points(8), PadRight: vg.Points(8),
	}
	canvases := plot.Align(grid, tiles, dc)
	for i := range grid {
		for j, p := range grid[i] {
			if p != nil {
				p.Draw(canvases[i][j])
			}
		}
	}
	_, err := c.WriteTo(w)
	return err
}

func panelPlot(pn *panel) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s — %s", transportName(pn.Transport), pn.Op)
	p.Y.Label.Text = "GB/s (median)"
	p.X.Label.Text = "state_chunk_size"
	labels := make([]string, len(pipelinedChunks))
	for i, c := range pipelinedChunks {
		labels[i] = chunkName(c)
	}
	p.NominalX(labels...)
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)

	p.Add(plotter.NewGrid()) // first, so the bars cover it

	barWidth := vg.Points(18)
	top := median(pn.Raw.GBps)
	all := chartSeries
	for si, s := range all {
		vals := make([]float64, len(pipelinedChunks))
		have := make([]bool, len(pipelinedChunks))
		for _, row := range pn.Rows {
			k := slices.Index(pipelinedChunks, row.Config.Chunk)
			if k >= 0 && s.match(row.Config) {
				vals[k], have[k] = median(row.GBps), true
				top = max(top, vals[k])
			}
		}
		// One bar chart per run of chunk sizes the series has (a
		// --targets-only run has only 256 KiB and 2 MiB), so absent sizes
		// get no bar at all.
		legend := true
		for k := 0; k < len(vals); {
			if !have[k] {
				k++
				continue
			}
			end := k
			for end < len(vals) && have[end] {
				end++
			}
			bc, err := plotter.NewBarChart(plotter.Values(vals[k:end]), barWidth)
			if err != nil {
				return nil, err
			}
			bc.XMin = float64(k)
			bc.Offset = barWidth * vg.Length(float64(si)-float64(len(all)-1)/2) // centred on the chunk size
			bc.Color = plotutil.Color(si)
			bc.LineStyle.Width = 0
			p.Add(bc)
			if legend {
				p.Legend.Add(s.name, bc)
				legend = false
			}
			k = end
		}
	}
	if raw := median(pn.Raw.GBps); raw > 0 {
		line, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: raw}, {X: float64(len(pipelinedChunks)) - 0.5, Y: raw}})
		if err != nil {
			return nil, err
		}
		line.Color = color.Black
		line.Width = vg.Points(1.5)
		line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		p.Add(line)
		p.Legend.Add(fmt.Sprintf("%s (%.2f GB/s)", rawLabel(len(pn.RawAlso) > 0, pn.Raw.RawKind), raw), line)
	}
	p.Y.Min = 0
	p.Y.Max = top * 1.45 // headroom for the legend above the bars
	return p, nil
}
