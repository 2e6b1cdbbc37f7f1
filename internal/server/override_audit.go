package server

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/override"
	"github.com/weir-dev/weir/policy"
)

// The audit log of override changes, read through GET
// /v1/overrides/audit and shown on the dashboard.

// defaultAuditLimit is how many changes GET /v1/overrides/audit returns
// without ?limit=.
const defaultAuditLimit = 100

// changeJSON is one change of the audit log as the API shows it.
type changeJSON struct {
	ID   string `json:"id"`
	Time string `json:"time"`
	Op   string `json:"op"`
	// Rule is "" for an override of a rule no longer in force; Key is
	// then the store key.
	Rule  string `json:"rule"`
	Key   string `json:"key"`
	Limit string `json:"limit"`
	Until string `json:"until,omitempty"`
	Note  string `json:"note,omitempty"`
}

// changeOut renders c, finding its rule among p's.
func changeOut(p *policy.Policy, c override.Change) changeJSON {
	o := overrideOut("", c.Override.Key, c.Override)
	out := changeJSON{ID: c.ID, Time: c.Time.UTC().Format(time.RFC3339Nano), Op: c.Op, Key: o.Key, Limit: o.Limit, Until: o.Until, Note: o.Note}
	for _, r := range p.Rules() {
		if rest, ok := strings.CutPrefix(c.Override.Key, weir.Key(r.Name)+":"); ok {
			out.Rule, out.Key = r.Name, rest
			break
		}
	}
	return out
}

// changeID splits a change's ID ("<ms>-<seq>", a Redis stream ID or
// memstore's) into its two numbers.
func changeID(id string) (ms, seq int64, ok bool) {
	a, b, found := strings.Cut(id, "-")
	if !found {
		return 0, 0, false
	}
	ms, err1 := strconv.ParseInt(a, 10, 64)
	seq, err2 := strconv.ParseInt(b, 10, 64)
	return ms, seq, err1 == nil && err2 == nil && ms >= 0 && seq >= 0
}

// auditAfter returns the changes of log after since: an RFC 3339 time
// (the changes at or after it) or a change's ID (the changes after it);
// "" is every change.
func auditAfter(log []override.Change, since string) ([]override.Change, bool) {
	if since == "" {
		return log, true
	}
	if t, err := time.Parse(time.RFC3339Nano, since); err == nil {
		for i, c := range log {
			if !c.Time.Before(t) {
				return log[i:], true
			}
		}
		return nil, true
	}
	ms, seq, ok := changeID(since)
	if !ok {
		return nil, false
	}
	for i, c := range log {
		cms, cseq, _ := changeID(c.ID)
		if cms > ms || cms == ms && cseq > seq {
			return log[i:], true
		}
	}
	return nil, true
}

// overrideChanges returns the audit log's changes, oldest first: without
// since, the latest n; with since, the first n after it, so that a
// reader goes on from the last ID it read.
func (s *Server) overrideChanges(ctx context.Context, p *policy.Policy, since string, n int) ([]changeJSON, bool, error) {
	out := []changeJSON{}
	os := s.overrideStore()
	if os == nil {
		_, ok := auditAfter(nil, since)
		return out, ok, nil
	}
	log, err := os.OverrideLog(ctx, override.MaxLog)
	if err != nil {
		return nil, true, err
	}
	log, ok := auditAfter(log, since)
	if !ok {
		return nil, false, nil
	}
	if since == "" && len(log) > n {
		log = log[len(log)-n:]
	}
	if len(log) > n {
		log = log[:n]
	}
	for _, c := range log {
		out = append(out, changeOut(p, c))
	}
	return out, true, nil
}

// handleOverrideAudit serves GET /v1/overrides/audit?since=&limit=.
func (s *Server) handleOverrideAudit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	n := defaultAuditLimit
	if v := q.Get("limit"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > override.MaxLog {
			writeError(w, http.StatusBadRequest, codeBadRequest, "query parameter limit: %q is not a number from 1 to %d", v, override.MaxLog)
			return
		}
	}
	p := s.holder.Load()
	since := q.Get("since")
	out, ok, err := s.overrideChanges(r.Context(), p, since, n)
	if !ok {
		writeError(w, http.StatusBadRequest, codeBadRequest, "query parameter since: %q is neither an RFC 3339 time such as 2030-01-31T00:00:00Z nor a change's id", since)
		return
	}
	if err != nil {
		s.writeRuleError(w, p, "", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"changes": out})
}
