package main

import (
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// chartFloor is the bottom of the chart's logarithmic axis, msgs/s.
const chartFloor = 100

// drawChart draws idemq's msgs/s beside its roofline's for each workload, as
// grouped bars on a logarithmic axis (gonum.org/v1/plot), to path (.svg or
// .png by extension).
func drawChart(r *report, path string) error {
	p := plot.New()
	p.Title.Text = "idemq beside its roofline, same run (median of " + groupThousands(int64(r.Setup.Runs)) + " runs)"
	p.Y.Label.Text = "msgs/s (log scale)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	names := make([]string, len(r.Rows))
	floor := make(plotter.Values, len(r.Rows))
	idemq := make(plotter.Values, len(r.Rows))
	roof := make(plotter.Values, len(r.Rows))
	top := float64(chartFloor * 10)
	for i, x := range r.Rows {
		names[i] = chartLabel(x)
		floor[i] = chartFloor
		// Bars stand on the floor (a log axis has no 0): their heights
		// above it.
		idemq[i] = max(zeroNaN(x.Rate), chartFloor) - chartFloor
		roof[i] = max(zeroNaN(x.RooflineRate), chartFloor) - chartFloor
		top = max(top, zeroNaN(x.Rate), zeroNaN(x.RooflineRate))
	}
	w := vg.Points(12)
	bars := func(v plotter.Values, c color.Color, offset vg.Length) (*plotter.BarChart, error) {
		base, err := plotter.NewBarChart(floor, w)
		if err != nil {
			return nil, err
		}
		b, err := plotter.NewBarChart(v, w)
		if err != nil {
			return nil, err
		}
		b.StackOn(base)
		b.Color = c
		b.LineStyle.Width = 0
		b.Offset = offset
		return b, nil
	}
	bi, err := bars(idemq, color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, -w/2)
	if err != nil {
		return err
	}
	br, err := bars(roof, color.RGBA{R: 0xbb, G: 0xbb, B: 0xbb, A: 0xff}, w/2)
	if err != nil {
		return err
	}
	p.Add(plotter.NewGrid(), bi, br)
	p.Legend.Add("idemq", bi)
	p.Legend.Add("roofline (pgbench / kafka-go)", br)
	p.Legend.Top = true
	p.NominalX(names...)
	p.Y.Min, p.Y.Max = chartFloor, top*4 // headroom for the legend
	p.X.Min, p.X.Max = -0.6, float64(len(r.Rows))-0.4
	p.X.Tick.Label.Rotation = math.Pi / 6
	p.X.Tick.Label.XAlign = draw.XRight
	p.X.Tick.Label.YAlign = draw.YCenter
	return p.Save(10*vg.Inch, 5*vg.Inch, path)
}

func zeroNaN(v float64) float64 {
	if math.IsNaN(v) {
		return 0
	}
	return v
}
