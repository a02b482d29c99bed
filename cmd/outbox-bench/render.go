package main

import (
	"image"
	"image/png"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// dpi is the resolution the charts are rendered at: panelW × panelH pixels
// a panel.
const dpi = 96

// pixels is a length of n pixels at dpi.
func pixels(n int) vg.Length { return vg.Length(n) * vg.Inch / dpi }

// plot renders the chart as a gonum plot: its axes (range, scale and
// ticks as computed by linAxis/logAxis), a grid, its series (lines, with a
// dot at each point when asked), its vertical marks (dashed) and a legend
// in the chosen corner.
func (c chart) plot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = c.title
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.Title.Padding = vg.Points(4)
	setAxis(&p.X, c.x)
	setAxis(&p.Y, c.y)
	p.Add(plotter.NewGrid())
	for _, s := range c.series {
		xys := make(plotter.XYs, len(s.pts))
		for i, pt := range s.pts {
			xys[i] = plotter.XY{X: pt.x, Y: pt.y}
		}
		if len(xys) == 0 {
			continue
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, err
		}
		l.Color, l.Width = s.col, vg.Points(1.5)
		p.Add(l)
		thumbs := []plot.Thumbnailer{l}
		if s.markers {
			dots, err := plotter.NewScatter(xys)
			if err != nil {
				return nil, err
			}
			dots.Color, dots.Radius, dots.Shape = s.col, vg.Points(2.5), draw.CircleGlyph{}
			p.Add(dots)
			thumbs = append(thumbs, dots)
		}
		if s.name != "" {
			p.Legend.Add(s.name, thumbs...)
		}
	}
	for _, v := range c.vlines {
		l, err := plotter.NewLine(plotter.XYs{{X: v.x, Y: c.y.min}, {X: v.x, Y: c.y.max}})
		if err != nil {
			return nil, err
		}
		l.Color, l.Width, l.Dashes = v.col, vg.Points(1.5), []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		p.Legend.Add(v.label, l)
	}
	p.Legend.Top = c.legend != legendBottomRight
	p.Legend.Left = c.legend == legendTopLeft
	p.Legend.XOffs, p.Legend.YOffs = -vg.Points(8), -vg.Points(6)
	if p.Legend.Left {
		p.Legend.XOffs = vg.Points(8)
	}
	if !p.Legend.Top {
		p.Legend.YOffs = vg.Points(6)
	}
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	return p, nil
}

// setAxis gives a gonum axis the range, scale and ticks of a.
func setAxis(ax *plot.Axis, a axis) {
	ax.Min, ax.Max = a.min, a.max
	ax.Label.Text = a.unit
	ax.Label.TextStyle.Font.Size = vg.Points(9)
	if a.log {
		ax.Scale = plot.LogScale{}
	}
	ticks := make([]plot.Tick, len(a.ticks))
	for i, v := range a.ticks {
		ticks[i] = plot.Tick{Value: v, Label: fmtNum(v)}
	}
	ax.Tick.Marker = plot.ConstantTicks(ticks)
}

// drawCharts stacks the charts into one image, a panel each, each panel
// `rows` panel heights tall; no charts give one panel saying none.
func drawCharts(charts []chart, none string) (image.Image, error) {
	return drawChartsSized(charts, none, 1)
}

func drawChartsSized(charts []chart, none string, rows int) (image.Image, error) {
	if len(charts) == 0 {
		p := plot.New()
		p.Title.Text = none
		p.HideAxes()
		img := vgimg.NewWith(vgimg.UseWH(pixels(panelW), pixels(panelH)), vgimg.UseDPI(dpi))
		p.Draw(draw.New(img))
		return img.Image(), nil
	}
	img := vgimg.NewWith(vgimg.UseWH(pixels(panelW), pixels(panelH*rows*len(charts))), vgimg.UseDPI(dpi))
	dc := draw.New(img)
	plots := make([][]*plot.Plot, len(charts))
	for i, c := range charts {
		p, err := c.plot()
		if err != nil {
			return nil, err
		}
		plots[i] = []*plot.Plot{p}
	}
	tiles := draw.Tiles{Rows: len(charts), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6),
		PadLeft: vg.Points(6), PadRight: vg.Points(12), PadY: vg.Points(14)}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	return img.Image(), nil
}

// writePNG writes img, or the error that kept it from being drawn, to path.
func writePNG(path string, img image.Image, drawErr error) error {
	if drawErr != nil {
		return drawErr
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
