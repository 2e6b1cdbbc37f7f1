package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/httplimit"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/store/guard"
)

// ReservationTTL is how long an open reservation of POST /v1/reserve can
// be settled. One never settled stays charged at its estimate.
const ReservationTTL = 15 * time.Minute

// reserveRequest is the body of POST /v1/reserve.
type reserveRequest struct {
	Rule     string `json:"rule"`
	Key      string `json:"key"`
	Tier     string `json:"tier"`
	Estimate *int64 `json:"estimate"`
}

// settleRequest is the body of POST /v1/settle.
type settleRequest struct {
	Reservation string `json:"reservation"`
	Actual      *int64 `json:"actual"`
}

// reservationRecord is what the store keeps under a reservation's id: the
// reservation is bound to its rule, tier and store key, and only weir
// writes it. It keeps only what the settlement needs, bounded whatever
// the request held: the rule's name, the tier applied (a configured name,
// not the request's), and the store key (policy.RuleResult.Key, in which
// an identity over weir.MaxIdentityLen bytes is a hash), never the
// identity itself. At and Remaining date the take (weir.Stamp, by the
// store's clock) so that the settlement refunds only what the limit
// cannot have recovered since; a record without them (written by an older
// weir, or by a store that dates nothing) settles as before, into the
// state as it is. Key, the identity, is only read: an older weir wrote it
// instead of StoreKey.
type reservationRecord struct {
	Rule      string `json:"rule"`
	Tier      string `json:"tier,omitempty"`
	StoreKey  string `json:"sk,omitempty"`
	Key       string `json:"key,omitempty"`
	Estimate  int64  `json:"estimate"`
	At        int64  `json:"at,omitempty"`
	Remaining int64  `json:"remaining,omitempty"`
}

// stamp returns the record's take as a weir.Stamp: its estimate, and its
// time when the record dates it.
func (rec *reservationRecord) stamp() weir.Stamp {
	if rec.At <= 0 || rec.Remaining < 0 {
		return weir.Stamp{Estimate: rec.Estimate}
	}
	return weir.Stamp{At: rec.At, Estimate: rec.Estimate, Remaining: rec.Remaining}
}

// storeKey returns the store key the record settles: StoreKey, or for an
// older weir's record the key of its identity under the rule.
func (rec *reservationRecord) storeKey(p *policy.Policy) (string, error) {
	if rec.StoreKey != "" {
		return rec.StoreKey, nil
	}
	if rec.Key == "" {
		return "", fmt.Errorf("policy: rule %q: the reservation names no key", rec.Rule)
	}
	id, err := p.CanonicalKey(rec.Rule, rec.Key)
	if err != nil {
		return "", err
	}
	return weir.Key(rec.Rule, id), nil
}

// reserveDecision is the answer of POST /v1/reserve: the decision and,
// when admitted, the reservation's id (empty when rejected).
type reserveDecision struct {
	CheckAnswer
	Reservation string `json:"reservation"`
	// ExpiresInMS is how long the reservation can be settled.
	ExpiresInMS int64 `json:"expires_in_ms,omitempty"`
}

// codeUnknownReservation answers a settle of an unknown, expired or
// already settled reservation.
const codeUnknownReservation = "unknown_reservation"

// readJSON reads a JSON body for the reservation endpoints as /v1/check
// does, answering the error itself.
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	for _, check := range []func(*http.Request) *bodyError{checkCrossSite, checkJSONContentType} {
		if be := check(r); be != nil {
			be.write(w)
			return false
		}
	}
	body, be := readBody(w, r)
	if be == nil {
		be = decodeStrict(body, v)
	}
	if be != nil {
		be.write(w)
		return false
	}
	return true
}

// reservationStore keeps the reservations of POST /v1/reserve and
// /v1/settle: small records under random ids, each with a TTL, each read
// at most once. openStore sets it from the store it opens or is given:
// memstore.Store keeps them in a bounded map, redisstore.Store under
// <prefix>:r:<id> with SET PX and GETDEL; another store keeps none.
type reservationStore interface {
	// PutReservation stores rec under id for ttl. It fails with
	// weir.ErrTooManyReservations when the store holds its maximum.
	PutReservation(ctx context.Context, id string, rec []byte, ttl time.Duration) error
	// TakeReservation returns id's record and deletes it, atomically; ok
	// is false for an unknown, expired or already taken id.
	TakeReservation(ctx context.Context, id string) (rec []byte, ok bool, err error)
}

// reservations returns the store of weir serve's reservations, if it
// keeps any.
func (s *Server) reservations() (reservationStore, bool) {
	return s.resv, s.resv != nil
}

// handleReserve serves POST /v1/reserve: it takes the estimate as
// /v1/check does and, when admitted, keeps a reservation to settle.
func (s *Server) handleReserve(w http.ResponseWriter, r *http.Request) {
	var req reserveRequest
	if !readJSON(w, r, &req) {
		return
	}
	switch {
	case req.Rule == "":
		writeError(w, http.StatusBadRequest, codeBadRequest, `field "rule" is required: the name of a rule (GET /v1/rules lists them)`)
		return
	case req.Key == "":
		writeError(w, http.StatusBadRequest, codeBadRequest, `field "key" is required: the identity to decide for`)
		return
	case req.Estimate == nil:
		writeError(w, http.StatusBadRequest, codeBadRequest, `field "estimate" is required: the cost to reserve, a whole number`)
		return
	case *req.Estimate < 1:
		// A reservation of 0 would cost nothing and still be kept for its
		// TTL: free to make, it could fill the store's reservations.
		writeError(w, http.StatusBadRequest, codeBadRequest, `field "estimate" is %d; it must be 1 or more (to settle a cost with nothing reserved, use /v1/check with "mode": "debit")`, *req.Estimate)
		return
	}
	p := s.holder.Load()
	rs, ok := s.reservations()
	if !ok {
		writeError(w, http.StatusNotImplemented, codeBadRequest, "this store keeps no reservations")
		return
	}
	if err := p.SupportsDebt(req.Rule, req.Tier); err != nil {
		s.writeRuleError(w, p, req.Rule, err)
		return
	}
	rr, st, err := p.CheckKeyStamped(r.Context(), req.Rule, req.Tier, req.Key, *req.Estimate)
	if err != nil {
		s.writeRuleError(w, p, req.Rule, err)
		return
	}
	out := reserveDecision{CheckAnswer: decisionOf(rr.Rule, rr.Result, rr.Shadow)}
	out.Tier, out.Fallback = rr.Tier, rr.Fallback
	// Only what the store took can be settled: a rejection, a shadow
	// rule's rejection or a fallback's answer keeps no reservation.
	if rr.Err == nil && rr.Result.Allowed {
		id := weir.NewReservationID()
		rec, _ := json.Marshal(reservationRecord{Rule: rr.Rule, Tier: rr.Tier, StoreKey: rr.Key, Estimate: *req.Estimate, At: st.At, Remaining: st.Remaining})
		if err := rs.PutReservation(r.Context(), id, rec, ReservationTTL); err != nil {
			s.undoReserve(p, req, rr)
			if errors.Is(err, weir.ErrTooManyReservations) {
				writeError(w, http.StatusServiceUnavailable, codeStore, "%v; settle some first", err)
				return
			}
			writeError(w, http.StatusServiceUnavailable, codeStore, "the store failed: %v", err)
			return
		}
		out.Reservation, out.ExpiresInMS = id, ReservationTTL.Milliseconds()
	}
	httplimit.WriteHeaders(w.Header(), []httplimit.Status{{Rule: rr.Rule, Limit: rr.Limit, Result: rr.Result, Shadow: rr.Shadow}}, 0, formatter(p))
	writeJSON(w, decisionStatus(&out.CheckAnswer), out)
}

// undoReserve refunds an estimate taken for a reservation that could not
// be kept, so a failure to store it charges nothing.
func (s *Server) undoReserve(p *policy.Policy, req reserveRequest, rr policy.RuleResult) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = p.CheckKeyMode(ctx, req.Rule, req.Tier, rr.Identity, *req.Estimate, weir.ModeRefund)
}

// handleSettle serves POST /v1/settle: it charges the difference between
// a reservation's estimate and the actual cost, once.
func (s *Server) handleSettle(w http.ResponseWriter, r *http.Request) {
	var req settleRequest
	if !readJSON(w, r, &req) {
		return
	}
	switch {
	case req.Reservation == "" || len(req.Reservation) > 64:
		writeError(w, http.StatusBadRequest, codeBadRequest, `field "reservation" is required: the id POST /v1/reserve answered`)
		return
	case req.Actual == nil:
		writeError(w, http.StatusBadRequest, codeBadRequest, `field "actual" is required: the real cost, a whole number`)
		return
	case *req.Actual < 0 || *req.Actual > algorithm.MaxDebt:
		writeError(w, http.StatusBadRequest, codeBadRequest, `field "actual" is %d; it must be 0 to %d`, *req.Actual, int64(algorithm.MaxDebt))
		return
	}
	p := s.holder.Load()
	rs, ok := s.reservations()
	if !ok {
		writeError(w, http.StatusNotImplemented, codeBadRequest, "this store keeps no reservations")
		return
	}
	rec, found, err := rs.TakeReservation(r.Context(), req.Reservation)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, codeStore, "the store failed: %v", err)
		return
	}
	var res reservationRecord
	if !found || json.Unmarshal(rec, &res) != nil {
		writeError(w, http.StatusNotFound, codeUnknownReservation, "reservation %q is unknown, expired or already settled", req.Reservation)
		return
	}
	n := *req.Actual - res.Estimate // what the settlement debits, or refunds
	if n < 0 {
		n = -n
	}
	var rr policy.RuleResult
	sk, err := res.storeKey(p)
	if err == nil {
		rr, err = p.SettleKey(r.Context(), res.Rule, res.Tier, sk, res.stamp(), *req.Actual)
	}
	if err != nil {
		// The rule changed under the reservation (a reload): keep it, so
		// that nothing changed.
		_ = rs.PutReservation(r.Context(), req.Reservation, rec, ReservationTTL)
		s.writeRuleError(w, p, res.Rule, err)
		return
	}
	if n > 0 && rr.Err != nil && (errors.Is(rr.Err, weir.ErrNotSent) || errors.Is(rr.Err, guard.ErrCircuitOpen)) {
		// The store never saw the settlement: keep the reservation so
		// that a retry settles it there. (One that may have reached the
		// store is not kept: a retry could charge it twice.)
		if perr := rs.PutReservation(context.WithoutCancel(r.Context()), req.Reservation, rec, ReservationTTL); perr == nil {
			writeError(w, http.StatusServiceUnavailable, codeStore, "the store failed before the settlement was made; the reservation is kept, retry: %v", rr.Err)
			return
		}
	}
	d := decisionOf(rr.Rule, rr.Result, rr.Shadow)
	d.Tier, d.Fallback = rr.Tier, rr.Fallback
	httplimit.WriteHeaders(w.Header(), []httplimit.Status{{Rule: rr.Rule, Limit: rr.Limit, Result: rr.Result, Shadow: rr.Shadow}}, 0, formatter(p))
	writeJSON(w, http.StatusOK, d)
}
