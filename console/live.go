package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/internal/sentinel"
)

// groupPage is what the group page shows: the group's status, the charts
// of its history and the legend of its partition grid.
type groupPage struct {
	admin.GroupStatus
	Charts []chart
	Legend []legendEntry
	// Window is how far back the charts go, Every how often (ms) the page
	// asks for the history.
	Window string
	Every  int
}

func (c *Console) groupPage(topic string, g admin.GroupStatus) groupPage {
	samples, _ := c.history.samples(seriesKey{topic, g.Group})
	return groupPage{
		GroupStatus: g,
		Charts:      charts(topic, g.Group, samples, c.history.window, c.history.gap),
		Legend:      legend(g.Partitions),
		Window:      windowText(c.history.window),
		Every:       int(max(c.cfg.RefreshInterval, c.history.interval/2) / time.Millisecond),
	}
}

// windowText writes a window as the charts' axis does: "10 min", "90 s".
func windowText(d time.Duration) string {
	if d >= time.Minute && d%time.Minute == 0 {
		return fmt.Sprintf("%d min", d/time.Minute)
	}
	return trim(d.Seconds()) + " s"
}

// historyReply is the history API's answer.
type historyReply struct {
	Topic string `json:"topic"`
	Group string `json:"group"`
	// WindowSeconds is how far back the samples go, IntervalSeconds the
	// time between two.
	WindowSeconds   float64  `json:"window_seconds"`
	IntervalSeconds float64  `json:"interval_seconds"`
	Samples         []sample `json:"samples"`
	// Charts are the group page's charts drawn from Samples.
	Charts []chart `json:"charts"`
}

// apiHistory serves a group's recent lag and throughput as JSON (GET
// /api/history?topic=T&group=G): the samples of the last HistoryWindow,
// oldest first, and the group page's charts drawn from them, for their
// live updates. It reads the status first when a sample is due.
func (c *Console) apiHistory(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	k := seriesKey{topic: r.URL.Query().Get("topic"), group: r.URL.Query().Get("group")}
	if k.topic == "" || k.group == "" {
		jsonError(w, http.StatusBadRequest, errors.New("the history is of one consumer group on one topic: ?topic=T&group=G"))
		return
	}
	if c.history.due(k, time.Now()) {
		ctx, cancel := c.ctx(r)
		defer cancel()
		rep, err := c.admin.Status(ctx, admin.Filter{Group: k.group, Topic: k.topic})
		if err != nil {
			status := http.StatusInternalServerError
			switch {
			case errors.Is(err, sentinel.ErrNotFound):
				status = http.StatusNotFound
			case errors.Is(err, outbox.ErrInvalidArgument):
				status = http.StatusBadRequest
			}
			jsonError(w, unavailable(status, err), err)
			return
		}
		c.history.record(rep, time.Now())
	}
	samples, ok := c.history.samples(k)
	if !ok {
		jsonError(w, http.StatusNotFound, fmt.Errorf("no consumer group %s on topic %s", quoted(200, k.group), quoted(250, k.topic)))
		return
	}
	_ = json.NewEncoder(w).Encode(historyReply{
		Topic: k.topic, Group: k.group,
		WindowSeconds: c.history.window.Seconds(), IntervalSeconds: c.history.interval.Seconds(),
		Samples: samples, Charts: charts(k.topic, k.group, samples, c.history.window, c.history.gap),
	})
}

func jsonError(w http.ResponseWriter, status int, err error) {
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
}
