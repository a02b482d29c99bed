package console

import (
	"crypto/hmac"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/ThreeDotsLabs/watermill"
	outbox "github.com/millrace/watermill-outbox"
	"github.com/millrace/watermill-outbox/admin"
	"github.com/millrace/watermill-outbox/deadletter"
)

// The console's write side: every action (replay and discard a dead
// letter, pause, resume, reset, retry or dead-letter a held key) is shown
// first on a confirmation page, then run by a POST that must pass the
// checks of action (actions on, the caller authorized, the CSRF token and
// the origin right).

// confirmation is what a confirmation page shows and posts on.
type confirmation struct {
	Action, Question string
	Fields           map[string]string
	Back             string // where Cancel leads: a page of the console (localTarget)
}

// confirm shows what an action will do and asks to confirm it: every
// action goes through it (the buttons of the pages lead here, and the
// action itself requires confirm=yes).
func (c *Console) confirm(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	action := r.PathValue("action")
	fields := map[string]string{}
	for _, k := range []string{"group", "topic", "partition", "to_seq", "id", "key", "seq"} {
		if v := q.Get(k); v != "" {
			fields[k] = v
		}
	}
	back := localTarget(q.Get("back"))
	fields["back"] = back
	// What the question names comes from the link: quoted and cut, so that
	// a crafted link cannot word the question.
	name := func(k string, n int) string { return quoted(n, q.Get(k)) }
	scope := "every partition"
	if q.Get("partition") != "" {
		scope = "partition " + name("partition", 20)
	}
	var question string
	switch action {
	case "pause":
		question = fmt.Sprintf("Pause %s of consumer group %s on topic %s? Its members give the leases back after the message in flight.", scope, name("group", 200), name("topic", 250))
	case "resume":
		question = fmt.Sprintf("Resume %s of consumer group %s on topic %s?", scope, name("group", 200), name("topic", 250))
	case "reset":
		question = fmt.Sprintf("Move the cursor of %s of consumer group %s on topic %s to seq %s? Messages after it are delivered (again), messages before it are skipped.", scope, name("group", 200), name("topic", 250), name("to_seq", 20))
	case "retry-held", "dead-letter-held":
		held := "key " + name("key", 200)
		if q.Get("key") == "" {
			held = "keyless message " + name("seq", 20)
		}
		what := "Retry the held %s of consumer group %s on topic %s, partition %s, now, with a fresh count of attempts?"
		if action == "dead-letter-held" {
			what = "Take every message the held %s of consumer group %s on topic %s, partition %s holds out as dead letters, in order? Its newer messages then flow."
		}
		question = fmt.Sprintf(what, held, name("group", 200), name("topic", 250), name("partition", 20))
	case "replay":
		question = fmt.Sprintf("Publish dead letter %s again, as a new message, and mark it replayed?", name("id", 20))
	case "discard":
		question = fmt.Sprintf("Mark dead letter %s discarded?", name("id", 20))
	default:
		c.fail(w, r, http.StatusNotFound, fmt.Errorf("no action %s", quoted(50, action)))
		return
	}
	c.render(w, r, "confirm", http.StatusOK, view{Title: "Confirm", Data: confirmation{Action: action, Question: question, Fields: fields, Back: back}})
}

// maxActionForm bounds the form of an action, read only once the caller is
// authorized: room for a held key of the Publisher's default metadata limit
// (64 KiB) percent-encoded.
const maxActionForm = 1 << 20

// action runs a POSTed action after checking that actions are on, the
// caller is authorized and the CSRF token and origin are right.
func (c *Console) action(w http.ResponseWriter, r *http.Request) {
	switch {
	case !c.cfg.EnableActions:
		c.fail(w, r, http.StatusForbidden, errors.New("actions are disabled: this console is read-only (console.Config.EnableActions, outbox serve --enable-actions)"))
		return
	case !c.authorized(r):
		c.fail(w, r, http.StatusUnauthorized, errors.New("actions need the console token: Authorization: Bearer <token>, or basic auth with the token as password"))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxActionForm)
	if err := r.ParseForm(); err != nil {
		if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
			c.fail(w, r, http.StatusRequestEntityTooLarge, fmt.Errorf("the form is larger than %s: act on a key that long with the CLI (outbox held retry|dead-letter)", humanBytes(maxActionForm)))
			return
		}
		c.fail(w, r, http.StatusBadRequest, err)
		return
	}
	if !c.sameOrigin(r) || !hmac.Equal([]byte(r.PostForm.Get("csrf")), []byte(c.csrfToken())) {
		c.fail(w, r, http.StatusForbidden, errors.New("the request did not come from this console (CSRF check failed): reload the page and try again"))
		return
	}
	if r.PostForm.Get("confirm") != "yes" {
		c.fail(w, r, http.StatusBadRequest, errors.New("an action needs confirm=yes: use the confirmation page"))
		return
	}
	ctx, cancel := c.ctx(r)
	defer cancel()
	f := r.PostForm
	back := localTarget(f.Get("back"))
	var flash string
	var err error
	switch r.PathValue("action") {
	case "pause", "resume":
		s := admin.Scope{Group: f.Get("group"), Topic: f.Get("topic")}
		if p := f.Get("partition"); p != "" {
			n, perr := strconv.Atoi(p)
			if perr != nil {
				c.fail(w, r, http.StatusBadRequest, errors.New("partition must be a number"))
				return
			}
			s.Partitions = []int{n}
		}
		op := c.admin.Pause
		if r.PathValue("action") == "resume" {
			op = c.admin.Resume
		}
		var n int
		n, err = op(ctx, s)
		flash = fmt.Sprintf("%sd %d partition(s)", r.PathValue("action"), n)
	case "reset":
		s := admin.Scope{Group: f.Get("group"), Topic: f.Get("topic")}
		if p := f.Get("partition"); p != "" {
			n, perr := strconv.Atoi(p)
			if perr != nil {
				c.fail(w, r, http.StatusBadRequest, errors.New("partition must be a number"))
				return
			}
			s.Partitions = []int{n}
		}
		seq, perr := strconv.ParseInt(f.Get("to_seq"), 10, 64)
		if perr != nil {
			c.fail(w, r, http.StatusBadRequest, errors.New("to_seq must be a number"))
			return
		}
		var resets []admin.CursorReset
		resets, err = c.admin.ResetCursor(ctx, s, admin.ToSeq(seq))
		flash = fmt.Sprintf("reset %d cursor(s) to %d", len(resets), seq)
	case "retry-held", "dead-letter-held":
		ref := admin.HeldRef{Group: f.Get("group"), Topic: f.Get("topic"), Key: f.Get("key")}
		var perr error
		if ref.Partition, perr = strconv.Atoi(f.Get("partition")); perr != nil {
			c.fail(w, r, http.StatusBadRequest, errors.New("partition must be a number"))
			return
		}
		if ref.Key == "" {
			if ref.Seq, perr = strconv.ParseInt(f.Get("seq"), 10, 64); perr != nil {
				c.fail(w, r, http.StatusBadRequest, errors.New("a keyless held message is named by its seq, a number"))
				return
			}
		}
		op, verb := c.admin.RetryHeldNow, "retrying"
		if r.PathValue("action") == "dead-letter-held" {
			op, verb = c.admin.DeadLetterHeld, "dead-lettering"
		}
		var n int
		n, err = op(ctx, ref)
		flash = fmt.Sprintf("%s %d held message(s)", verb, n)
	case "replay", "discard":
		id, perr := strconv.ParseInt(f.Get("id"), 10, 64)
		if perr != nil {
			c.fail(w, r, http.StatusBadRequest, errors.New("id must be a number"))
			return
		}
		if r.PathValue("action") == "replay" {
			var e deadletter.Entry
			e, err = c.store.Replay(ctx, id, deadletter.ReplayOptions{})
			flash = fmt.Sprintf("replayed %d as %s", id, e.ReplayUUID)
		} else {
			_, err = c.store.Discard(ctx, id)
			flash = fmt.Sprintf("discarded %d", id)
		}
	default:
		c.fail(w, r, http.StatusNotFound, fmt.Errorf("no action %s", quoted(50, r.PathValue("action"))))
		return
	}
	if err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, outbox.ErrNotFound) {
			status = http.StatusNotFound
		} else if errors.Is(err, outbox.ErrInvalidArgument) || errors.Is(err, deadletter.ErrInvalidState) || errors.Is(err, admin.ErrSeqOutOfRange) {
			status = http.StatusConflict
		}
		c.fail(w, r, status, err)
		return
	}
	c.logger.Info("Console action", watermill.LogFields{"action": r.PathValue("action"), "remote": r.RemoteAddr, "result": flash})
	// The Location is set as checked: http.Redirect would rewrite it.
	w.Header().Set("Location", c.cfg.Prefix+withFlash(back, flash, c.mac("flash", flash)))
	w.WriteHeader(http.StatusSeeOther)
}
