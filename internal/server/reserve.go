package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/redis/rueidis"

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
// an identity over keys.MaxIdentityLen bytes is a hash), never the
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
	rr, id, err := s.reserve(r.Context(), p, req.Rule, req.Tier, req.Key, *req.Estimate)
	switch {
	case errors.Is(err, errTooManyReservations):
		writeError(w, http.StatusServiceUnavailable, codeStore, "%v; settle some first", err)
		return
	case err != nil:
		s.writeRuleError(w, p, req.Rule, err)
		return
	}
	out := reserveDecision{CheckAnswer: decisionOf(rr.Rule, rr.Result, rr.Shadow)}
	out.Tier, out.Fallback = rr.Tier, rr.Fallback
	if id != "" {
		out.Reservation, out.ExpiresInMS = id, ReservationTTL.Milliseconds()
	}
	httplimit.WriteHeaders(w.Header(), []httplimit.Status{{Rule: rr.Rule, Limit: rr.Limit, Result: rr.Result, Shadow: rr.Shadow}}, 0, formatter(p))
	writeJSON(w, decisionStatus(&out.CheckAnswer), out)
}

// reserve takes estimate (1 or more) for key under p's rule and tier, as
// /v1/check does, and when the store admits it keeps a reservation of
// ReservationTTL: its id is returned, "" when nothing was taken (a
// rejection, a shadow rule's rejection, a fallback's answer). A rule
// error (unknown rule, a rule without debt, a bad cost) is returned as
// policy gives it; a reservation that cannot be kept is refunded and
// its error returned: errTooManyReservations, or one wrapping
// weir.ErrStore. POST /v1/reserve and WEIR.RESERVE call it.
func (s *Server) reserve(ctx context.Context, p *policy.Policy, rule, tier, key string, estimate int64) (policy.RuleResult, string, error) {
	if estimate < 1 {
		// Free to make, yet kept for its TTL: it could fill the map.
		return policy.RuleResult{}, "", fmt.Errorf("%w: a reservation's estimate is %d; it must be 1 or more", weir.ErrInvalidCost, estimate)
	}
	if err := p.SupportsDebt(rule, tier); err != nil {
		return policy.RuleResult{}, "", err
	}
	rr, err := p.CheckKey(ctx, policy.KeyRequest{Rule: rule, Tier: tier, Key: key, N: estimate, Reserve: true})
	st := rr.Stamp
	if err != nil {
		return policy.RuleResult{}, "", err
	}
	// Only what the store took can be settled: a rejection, a shadow
	// rule's rejection or a fallback's answer keeps no reservation.
	if rr.Err != nil || !rr.Result.Allowed {
		return rr, "", nil
	}
	id := newReservationID()
	rec, _ := json.Marshal(reservationRecord{Rule: rr.Rule, Tier: rr.Tier, StoreKey: rr.Key, Estimate: estimate, At: st.At, Remaining: st.Remaining})
	if err := s.resv.put(ctx, id, rec, ReservationTTL); err != nil {
		s.undoReserve(p, rule, tier, rr.Identity, estimate)
		return rr, "", err
	}
	return rr, id, nil
}

// undoReserve refunds an estimate taken for a reservation that could not
// be kept, so a failure to store it charges nothing.
func (s *Server) undoReserve(p *policy.Policy, rule, tier, identity string, estimate int64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = p.CheckKey(ctx, policy.KeyRequest{Rule: rule, Tier: tier, Key: identity, N: estimate, Mode: weir.ModeRefund})
}

// handleSettle serves POST /v1/settle: it charges the difference between
// a reservation's estimate and the actual cost, once.
func (s *Server) handleSettle(w http.ResponseWriter, r *http.Request) {
	var req settleRequest
	if !readJSON(w, r, &req) {
		return
	}
	switch {
	case req.Reservation == "" || len(req.Reservation) > maxReservationID:
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
	rule, rr, err := s.settle(r.Context(), p, req.Reservation, *req.Actual)
	var kept *keptError
	switch {
	case errors.Is(err, errUnknownReservation):
		writeError(w, http.StatusNotFound, codeUnknownReservation, "reservation %q is unknown, expired or already settled", req.Reservation)
		return
	case errors.As(err, &kept):
		writeError(w, http.StatusServiceUnavailable, codeStore, "%v", kept)
		return
	case err != nil:
		s.writeRuleError(w, p, rule, err)
		return
	}
	d := decisionOf(rr.Rule, rr.Result, rr.Shadow)
	d.Tier, d.Fallback = rr.Tier, rr.Fallback
	httplimit.WriteHeaders(w.Header(), []httplimit.Status{{Rule: rr.Rule, Limit: rr.Limit, Result: rr.Result, Shadow: rr.Shadow}}, 0, formatter(p))
	writeJSON(w, http.StatusOK, d)
}

// errUnknownReservation: settle was given an unknown, expired or already
// settled reservation.
var errUnknownReservation = errors.New("unknown, expired or already settled reservation")

// keptError: the store never saw the settlement, so the reservation is
// kept for a retry.
type keptError struct{ err error }

func (e *keptError) Error() string {
	return "the store failed before the settlement was made; the reservation is kept, retry: " + e.err.Error()
}

func (e *keptError) Unwrap() error { return e.err }

// settle charges the difference between reservation id's estimate and
// actual (0..algorithm.MaxDebt), once, under p, and returns the
// reservation's rule and the settlement's result. Its errors: one
// wrapping weir.ErrInvalidCost for an actual outside that range;
// errUnknownReservation; a *keptError when the store never saw the
// settlement (the reservation is kept, so a retry settles it); one
// wrapping weir.ErrStore when the reservation could not be read; a rule
// error (the rule changed under the reservation: it is kept). POST
// /v1/settle and WEIR.SETTLE call it.
func (s *Server) settle(ctx context.Context, p *policy.Policy, id string, actual int64) (string, policy.RuleResult, error) {
	if actual < 0 || actual > algorithm.MaxDebt {
		return "", policy.RuleResult{}, fmt.Errorf("%w: a settlement's actual cost is %d; it must be 0 to %d", weir.ErrInvalidCost, actual, int64(algorithm.MaxDebt))
	}
	if id == "" || len(id) > maxReservationID {
		return "", policy.RuleResult{}, fmt.Errorf("reservation %.80q: %w", id, errUnknownReservation)
	}
	rec, found, err := s.resv.take(ctx, id)
	if err != nil {
		return "", policy.RuleResult{}, err
	}
	var res reservationRecord
	if !found || json.Unmarshal(rec, &res) != nil {
		return "", policy.RuleResult{}, fmt.Errorf("reservation %q: %w", id, errUnknownReservation)
	}
	n := actual - res.Estimate // what the settlement debits, or refunds
	if n < 0 {
		n = -n
	}
	var rr policy.RuleResult
	sk, err := res.storeKey(p)
	if err == nil {
		rr, err = p.CheckKey(ctx, policy.KeyRequest{Rule: res.Rule, Tier: res.Tier, Key: sk, Stamp: res.stamp(), N: actual, Settle: true})
	}
	if err != nil {
		// The rule changed under the reservation (a reload): keep it, so
		// that nothing changed.
		_ = s.resv.put(ctx, id, rec, ReservationTTL)
		return res.Rule, policy.RuleResult{}, err
	}
	if n > 0 && rr.Err != nil && (errors.Is(rr.Err, weir.ErrNotSent) || errors.Is(rr.Err, guard.ErrCircuitOpen)) {
		// The store never saw the settlement: keep the reservation so
		// that a retry settles it there. (One that may have reached the
		// store is not kept: a retry could charge it twice.)
		if perr := s.resv.put(context.WithoutCancel(ctx), id, rec, ReservationTTL); perr == nil {
			return res.Rule, rr, &keptError{rr.Err}
		}
	}
	if rr.Err == nil {
		id := res.Key
		if id == "" {
			id = rr.Identity
		}
		if per, err := s.spendPeriod(p, res.Rule); err == nil {
			s.spend.add(res.Rule, id, per, actual, 0)
		}
	}
	return res.Rule, rr, nil
}

// errTooManyReservations: the in-memory reservations hold
// maxReservations open ones, none of them expired.
var errTooManyReservations = fmt.Errorf("too many open reservations (%d)", maxReservations)

// maxReservations bounds the open reservations kept in memory (a store in
// memory, or a store of the caller's). A reservation the map cannot hold
// is refused, never made room for by forgetting an open one.
const maxReservations = 1 << 16

// maxReservationID bounds the reservation ids settle looks up (its own
// are 32 hex digits).
const maxReservationID = 64

// newReservationID returns a random reservation id: 128 bits, hex.
func newReservationID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// reservations keeps the open reservations of POST /v1/reserve: small
// records under random ids, each with a TTL, each taken at most once.
// openStore picks where: in Redis beside the limiter state when the store
// is Redis, so that any instance settles what another reserved; in a
// bounded map otherwise.
type reservations interface {
	// put keeps rec under id for ttl. The map fails with
	// errTooManyReservations when it is full; Redis with an error
	// wrapping weir.ErrStore.
	put(ctx context.Context, id string, rec []byte, ttl time.Duration) error
	// take returns id's record and deletes it, atomically; ok is false for
	// an unknown, expired or already taken id.
	take(ctx context.Context, id string) (rec []byte, ok bool, err error)
}

// memReservations keeps reservations in a map of at most max entries. A
// full map first drops its expired reservations; if none expired it
// refuses the new one (errTooManyReservations).
type memReservations struct {
	now func() time.Time
	max int

	mu sync.Mutex
	m  map[string]memReservation
}

type memReservation struct {
	rec     []byte
	expires time.Time
}

func newMemReservations(now func() time.Time, max int) *memReservations {
	return &memReservations{now: now, max: max, m: map[string]memReservation{}}
}

func (r *memReservations) put(_ context.Context, id string, rec []byte, ttl time.Duration) error {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[id]; !ok && len(r.m) >= r.max {
		for k, v := range r.m {
			if !now.Before(v.expires) {
				delete(r.m, k)
			}
		}
		if len(r.m) >= r.max {
			return errTooManyReservations
		}
	}
	r.m[id] = memReservation{rec: append([]byte(nil), rec...), expires: now.Add(ttl)}
	return nil
}

func (r *memReservations) take(_ context.Context, id string) ([]byte, bool, error) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.m[id]
	if !ok {
		return nil, false, nil
	}
	delete(r.m, id)
	if !now.Before(v.expires) {
		return nil, false, nil
	}
	return v.rec, true, nil
}

// redisReservations keeps each reservation in Redis under prefix+id (the
// deployment's "<prefix>:r:<id>", where earlier versions kept them) with
// SET PX, and takes it with GETDEL (Redis 6.2), so that one is read once
// however many instances race for it. Each call has the store's timeout.
type redisReservations struct {
	c       rueidis.Client
	prefix  string
	timeout time.Duration
}

func (r redisReservations) put(ctx context.Context, id string, rec []byte, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	cmd := r.c.B().Set().Key(r.prefix + id).Value(rueidis.BinaryString(rec)).PxMilliseconds(max(ttl.Milliseconds(), 1)).Build()
	if err := r.c.Do(ctx, cmd).Error(); err != nil {
		return fmt.Errorf("%w: keeping a reservation: %w", weir.ErrStore, err)
	}
	return nil
}

func (r redisReservations) take(ctx context.Context, id string) ([]byte, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	v, err := r.c.Do(ctx, r.c.B().Getdel().Key(r.prefix+id).Build()).AsBytes()
	switch {
	case rueidis.IsRedisNil(err):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("%w: reading a reservation: %w", weir.ErrStore, err)
	}
	return v, true, nil
}
