package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/millrace/watermill-outbox/metrics"
)

// serveMetrics serves the outbox's metrics on addr (path /metrics): the
// events of this process, and the database figures of a.collectors (one
// per source, labelled with it). stop shuts the server down.
func (a *app) serveMetrics(addr string) (stop func(), err error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := metrics.Enable(metrics.Config{Registerer: reg})
	if err != nil {
		return nil, err
	}
	for _, cfg := range a.collectors {
		c, err := metrics.NewCollector(cfg)
		if err == nil {
			err = reg.Register(c)
		}
		if err != nil {
			m.Disable()
			return nil, fmt.Errorf("metrics of source %s: %w", cfg.Source, err)
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		m.Disable()
		return nil, usagef("--metrics-listen %s: %v", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.note("metrics server: %v", err)
		}
	}()
	a.note("metrics on http://%s/metrics", ln.Addr())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		m.Disable()
	}, nil
}
