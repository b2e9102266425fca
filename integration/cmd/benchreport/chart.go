package main

import (
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// drawChart draws idemq's msgs/s beside its roofline's for each workload, as
// grouped bars (gonum.org/v1/plot), to path (.svg or .png by extension).
func drawChart(r *report, path string) error {
	p := plot.New()
	p.Title.Text = "idemq beside its roofline (msgs/s, median of " + groupThousands(int64(r.Setup.Runs)) + " runs)"
	p.Y.Label.Text = "thousand msgs/s"
	names := make([]string, len(r.Rows))
	idemq := make(plotter.Values, len(r.Rows))
	roof := make(plotter.Values, len(r.Rows))
	for i, x := range r.Rows {
		names[i] = chartLabel(x)
		idemq[i] = zeroNaN(x.Rate) / 1000
		roof[i] = zeroNaN(x.RooflineRate) / 1000
	}
	w := vg.Points(12)
	bi, err := plotter.NewBarChart(idemq, w)
	if err != nil {
		return err
	}
	bi.Color = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	bi.LineStyle.Width = 0
	bi.Offset = -w / 2
	br, err := plotter.NewBarChart(roof, w)
	if err != nil {
		return err
	}
	br.Color = color.RGBA{R: 0xbb, G: 0xbb, B: 0xbb, A: 0xff}
	br.LineStyle.Width = 0
	br.Offset = w / 2
	p.Add(bi, br, plotter.NewGrid())
	p.Legend.Add("idemq", bi)
	p.Legend.Add("roofline (same run)", br)
	p.Legend.Top = true
	p.NominalX(names...)
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
