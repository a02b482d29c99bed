package main

import (
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"strconv"
)

// The plot: one panel per messages-per-transaction value, throughput at the
// broker over time (rate over a sliding window of about one second) for (b)
// in red and (c) in blue; the lighter lines of the same colours are the
// publish rates. Axis labels are drawn with a tiny built-in bitmap font:
// the y axis is labelled with its top value in msg/s, the x axis with its
// end in seconds.
const (
	panelW, panelH = 900, 300
	marginL        = 70
	marginR        = 20
	marginT        = 30
	marginB        = 30
)

var (
	colPeer      = color.RGBA{200, 30, 30, 255}
	colPeerPub   = color.RGBA{240, 160, 160, 255}
	colOutbox    = color.RGBA{30, 60, 200, 255}
	colOutboxPub = color.RGBA{150, 170, 240, 255}
	colAxis      = color.RGBA{0, 0, 0, 255}
	colGrid      = color.RGBA{225, 225, 225, 255}
)

type series struct {
	pts []point
	col color.RGBA
}

type point struct{ x, y float64 }

func rates(samples []sample, published bool) []point {
	var out []point
	j := 0
	for i := range samples {
		for j < i && samples[i].T-samples[j].T > 1.0 {
			j++
		}
		if j == i {
			if i == 0 {
				continue
			}
			j = i - 1
		}
		dt := samples[i].T - samples[j].T
		if dt <= 0 {
			continue
		}
		dn := samples[i].AtBroker - samples[j].AtBroker
		if published {
			dn = samples[i].Published - samples[j].Published
		}
		out = append(out, point{samples[i].T, float64(dn) / dt})
	}
	return out
}

func writePlot(path string, runs []*runResult) error {
	var perTxs []int
	seen := map[int]bool{}
	for _, r := range runs {
		if r.System != sysCeiling && !seen[r.PerTx] {
			seen[r.PerTx] = true
			perTxs = append(perTxs, r.PerTx)
		}
	}
	n := max(1, len(perTxs))
	img := image.NewRGBA(image.Rect(0, 0, panelW, panelH*n))
	draw.Draw(img, img.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	for i, perTx := range perTxs {
		var ss []series
		for _, r := range runs {
			if r.PerTx != perTx || r.System == sysCeiling {
				continue
			}
			c, cp := colOutbox, colOutboxPub
			if r.System == sysPeer {
				c, cp = colPeer, colPeerPub
			}
			ss = append(ss, series{rates(r.Samples, true), cp}, series{rates(r.Samples, false), c})
		}
		drawPanel(img, image.Rect(0, i*panelH, panelW, (i+1)*panelH), perTx, ss)
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

func drawPanel(img *image.RGBA, r image.Rectangle, perTx int, ss []series) {
	maxX, maxY := 1.0, 1.0
	for _, s := range ss {
		for _, p := range s.pts {
			maxX, maxY = math.Max(maxX, p.x), math.Max(maxY, p.y)
		}
	}
	maxX, maxY = math.Ceil(maxX), niceCeil(maxY)
	x0, y0 := r.Min.X+marginL, r.Max.Y-marginB
	x1, y1 := r.Max.X-marginR, r.Min.Y+marginT
	tx := func(x float64) int { return x0 + int(x/maxX*float64(x1-x0)) }
	ty := func(y float64) int { return y0 - int(y/maxY*float64(y0-y1)) }
	for k := 1; k <= 4; k++ {
		y := ty(maxY * float64(k) / 4)
		line(img, x0, y, x1, y, colGrid, 1)
		text(img, x0-8-textWidth(strconv.Itoa(int(maxY*float64(k)/4))), y-3, strconv.Itoa(int(maxY*float64(k)/4)), colAxis)
	}
	line(img, x0, y0, x1, y0, colAxis, 1)
	line(img, x0, y0, x0, y1, colAxis, 1)
	text(img, x0-8-textWidth("0"), y0-3, "0", colAxis)
	xl := strconv.Itoa(int(maxX)) + "s"
	text(img, x1-textWidth(xl), y0+8, xl, colAxis)
	// Panel title: messages per transaction, then a legend of colour boxes.
	title := strconv.Itoa(perTx) + "/tx"
	text(img, x0, r.Min.Y+10, title, colAxis)
	lx := x0 + textWidth(title) + 20
	for _, c := range []color.RGBA{colPeer, colPeerPub, colOutbox, colOutboxPub} {
		draw.Draw(img, image.Rect(lx, r.Min.Y+9, lx+14, r.Min.Y+19), image.NewUniform(c), image.Point{}, draw.Src)
		lx += 22
	}
	for _, s := range ss {
		for i := 1; i < len(s.pts); i++ {
			line(img, tx(s.pts[i-1].x), ty(s.pts[i-1].y), tx(s.pts[i].x), ty(s.pts[i].y), s.col, 2)
		}
	}
}

func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 4, 5, 8, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

// line draws a line of width w (Bresenham).
func line(img *image.RGBA, xa, ya, xb, yb int, c color.RGBA, w int) {
	dx, dy := abs(xb-xa), -abs(yb-ya)
	sx, sy := sign(xb-xa), sign(yb-ya)
	e := dx + dy
	for {
		for i := 0; i < w; i++ {
			for j := 0; j < w; j++ {
				img.SetRGBA(xa+i, ya+j, c)
			}
		}
		if xa == xb && ya == yb {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			xa += sx
		}
		if e2 <= dx {
			e += dx
			ya += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

// glyphs is a 3×5 bitmap font for what the labels need.
var glyphs = map[rune][5]string{
	'0': {"###", "#.#", "#.#", "#.#", "###"},
	'1': {".#.", "##.", ".#.", ".#.", "###"},
	'2': {"###", "..#", "###", "#..", "###"},
	'3': {"###", "..#", "###", "..#", "###"},
	'4': {"#.#", "#.#", "###", "..#", "..#"},
	'5': {"###", "#..", "###", "..#", "###"},
	'6': {"###", "#..", "###", "#.#", "###"},
	'7': {"###", "..#", "..#", "..#", "..#"},
	'8': {"###", "#.#", "###", "#.#", "###"},
	'9': {"###", "#.#", "###", "..#", "###"},
	's': {"...", ".##", ".#.", "..#", "##."},
	't': {".#.", "###", ".#.", ".#.", ".##"},
	'x': {"...", "#.#", ".#.", "#.#", "#.#"},
	'/': {"..#", "..#", ".#.", "#..", "#.."},
}

const glyphScale = 2

func textWidth(s string) int { return len([]rune(s)) * 4 * glyphScale }

func text(img *image.RGBA, x, y int, s string, c color.RGBA) {
	for _, ch := range s {
		g, ok := glyphs[ch]
		if ok {
			for row := range 5 {
				for col := range 3 {
					if g[row][col] == '#' {
						draw.Draw(img, image.Rect(x+col*glyphScale, y+row*glyphScale, x+(col+1)*glyphScale, y+(row+1)*glyphScale),
							image.NewUniform(c), image.Point{}, draw.Src)
					}
				}
			}
		}
		x += 4 * glyphScale
	}
}
