package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/millrace/watermill-outbox/console"
	"github.com/millrace/watermill-outbox/outboxtype"
)

func (a *app) serveCommand() *cobra.Command {
	var (
		listen        string
		enableActions bool
		token         string
		allowedHosts  []string
		historyWindow time.Duration
		historyEvery  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the web console",
		Long: `serve runs the web console: topics and groups, a live partition grid, the dead-letter browser.
It listens on 127.0.0.1 by default. It is read-only unless --enable-actions, and actions then need the token
(--token or OUTBOX_CONSOLE_TOKEN), sent as "Authorization: Bearer <token>" or as the password of basic auth.
It answers only to localhost, 127.0.0.1, [::1] and its --listen address (421 Misdirected Request for other Host
headers, against DNS rebinding): name each other host it is reached under with --allowed-host.
With several sources (--config), its first page shows every source side by side with a total, and each source's
console is under /sources/NAME/. With --schema-registry (or schema_registry in --config), a dead letter's payload in
the registry's wire format is shown decoded as JSON beside its raw bytes.`,
		Example: `  outbox serve
  OUTBOX_CONSOLE_TOKEN=$(openssl rand -hex 16) outbox serve --listen 127.0.0.1:8080 --enable-actions
  outbox serve --listen 0.0.0.0:8080 --allowed-host ops.example.com
  outbox serve --history-window 1h --history-interval 30s
  outbox serve --config pipeline.yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if token == "" {
				token = a.getenv("OUTBOX_CONSOLE_TOKEN")
			}
			if enableActions && token == "" {
				return usagef("--enable-actions needs a token: --token or OUTBOX_CONSOLE_TOKEN")
			}
			cfg := console.Config{EnableActions: enableActions, Token: token,
				AllowedHosts:  append(console.ListenHosts(listen), allowedHosts...),
				HistoryWindow: historyWindow, HistoryInterval: historyEvery}
			codec, err := a.payloadDecoder(ctx)
			if err != nil {
				return err
			}
			if codec != nil { // a nil *schema.Codec is no nil PayloadDecoder
				cfg.Payloads = codec
			}
			var c http.Handler
			if a.multiSource() {
				c, err = a.sourcesConsole(ctx, cfg)
			} else {
				var pool *pgxpool.Pool
				if pool, err = a.connect(ctx); err != nil {
					return err
				}
				cfg.Pool, cfg.Schema = pool, a.schemaName()
				c, err = console.New(cfg, a.logger(false))
			}
			var bad *outboxtype.ConfigError
			switch {
			case errors.As(err, &bad) && strings.TrimPrefix(bad.Field, "Console.") == "AllowedHosts":
				return usagef("--allowed-host %s", bad.Reason)
			case errors.As(err, &bad) && strings.HasPrefix(strings.TrimPrefix(bad.Field, "Console."), "History"):
				return usagef("--history-window and --history-interval: %s %s", bad.Field, bad.Reason)
			}
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", listen, err)
			}
			srv := &http.Server{Handler: c, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
				WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
			mode := "read-only"
			if enableActions {
				mode = "actions enabled"
			}
			a.note("console on http://%s/ (%s); interrupt to stop", ln.Addr(), mode)
			errc := make(chan error, 1)
			go func() { errc <- srv.Serve(ln) }()
			select {
			case err := <-errc:
				return err
			case <-ctx.Done():
				shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
					return err
				}
				return nil
			}
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8080", "address to listen on")
	cmd.Flags().BoolVar(&enableActions, "enable-actions", false, "allow pause, resume, reset, replay and discard")
	cmd.Flags().StringVar(&token, "token", "", "token required for actions (default $OUTBOX_CONSOLE_TOKEN)")
	cmd.Flags().StringArrayVar(&allowedHosts, "allowed-host", nil, "another host the console answers to, as NAME or NAME:PORT (repeatable)")
	cmd.Flags().DurationVar(&historyWindow, "history-window", console.DefaultHistoryWindow, "how far back the group page's charts of lag and throughput go")
	cmd.Flags().DurationVar(&historyEvery, "history-interval", console.DefaultHistoryInterval, "time between two samples of those charts (taken only while a page is open)")
	a.schemaRegistryFlag(cmd, "show a dead letter's payload in the registry's wire format decoded as JSON too")
	return cmd
}

// sourcesConsole is the console of every configured source: a page of
// them side by side, and each one's console under /sources/NAME/.
func (a *app) sourcesConsole(ctx context.Context, cfg console.Config) (http.Handler, error) {
	sc := console.SourcesConfig{Console: cfg}
	for _, s := range a.sources {
		pool, err := a.openSource(ctx, s)
		if err != nil {
			return nil, err
		}
		sc.Sources = append(sc.Sources, console.Source{Name: s.Name, Pool: pool, Schema: s.Schema})
	}
	return console.NewSources(sc, a.logger(false))
}
