package main

import (
	"bytes"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

// syntheticResults has a little of everything the plots draw.
func syntheticResults() *results {
	var samples []sample
	for i := range 50 {
		samples = append(samples, sample{T: float64(i) / 5, Published: int64(i * 1000), AtBroker: int64(i * 900)})
	}
	var cdf []cdfPoint
	for i := 1; i <= 100; i++ {
		cdf = append(cdf, cdfPoint{Ms: float64(i) * 0.5, Frac: float64(i) / 100})
	}
	hist := &historyResult{growthRun: growthRun{Partitions: 16, Messages: 1000, PerTx: 10}}
	for i := range 10 {
		hist.Points = append(hist.Points, historyPoint{Delivered: int64(i * 100), WindowRate: 5000 + float64(i*10), WindowP50Ms: 3, WindowP99Ms: 9})
	}
	return &results{
		Runs: []*runResult{
			{System: sysPeer, Mode: modeSteady, PerTx: 10, Samples: samples},
			{System: sysOutbox, Mode: modeSteady, PerTx: 10, Samples: samples},
			{System: sysOutbox, Mode: modeBacklog, PerTx: 10, Samples: samples, RelayStartSeconds: 2},
		},
		Latency: []*latencyResult{{System: sysOutbox, OfferedRate: 1000, CDF: cdf, Latency: latencyStats{P50Ms: 4, P99Ms: 30}}},
		Growth: &growthResult{History: hist, Partitions: []*growthRun{
			{Partitions: 4, Messages: 1000, PerTx: 10, EndToEndRate: 9000},
			{Partitions: 64, Messages: 1000, PerTx: 10, EndToEndRate: 20000},
		}},
	}
}

// Every plot renders with gonum/plot into a PNG of the expected size that
// draws something (lines in several colours, text), and an empty result
// still gives a readable "none" panel.
func TestPlotsRender(t *testing.T) {
	res := syntheticResults()
	for _, c := range []struct {
		name  string
		draw  func() (image.Image, error)
		width int
		minH  int
	}{
		{"throughput", func() (image.Image, error) { return throughputImage(res.Runs) }, panelW, 2 * panelH},
		{"latency", func() (image.Image, error) { return latencyImage(res.Latency) }, panelW, 2 * panelH},
		{"growth", func() (image.Image, error) { return growthImage(res.Growth) }, panelW, 4 * panelH},
		{"growth, none", func() (image.Image, error) { return growthImage(nil) }, panelW, panelH},
	} {
		img, err := c.draw()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		path := filepath.Join(t.TempDir(), "plot.png")
		if err := writePNG(path, img, nil); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		decoded, err := png.Decode(bytes.NewReader(data))
		if err != nil {
			t.Fatalf("%s: not a PNG: %v", c.name, err)
		}
		b := decoded.Bounds()
		if b.Dx() != c.width || b.Dy() < c.minH {
			t.Errorf("%s: %dx%d, want %d wide and at least %d high", c.name, b.Dx(), b.Dy(), c.width, c.minH)
		}
		colours := map[[4]uint32]bool{}
		for y := b.Min.Y; y < b.Max.Y; y += 2 {
			for x := b.Min.X; x < b.Max.X; x += 2 {
				r, g, bl, a := decoded.At(x, y).RGBA()
				colours[[4]uint32{r >> 8, g >> 8, bl >> 8, a >> 8}] = true
			}
		}
		if len(colours) < 8 {
			t.Errorf("%s: %d distinct colours: nothing drawn", c.name, len(colours))
		}
	}
}
