package envoyrls

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
	"github.com/weir-dev/weir/internal/yamlnode"
)

// ReservationKey is both the field of the response's dynamic metadata
// that carries a reservation's id and the key of the descriptor entry
// that brings it back on the response path.
const ReservationKey = "weir_reservation"

// ReservationTTL is how long a reservation made on the request path can
// be settled; one never settled stays charged at its estimate.
const ReservationTTL = 15 * time.Minute

// maxReservationID bounds the ids looked up (weir's are 32 hex digits):
// a longer one is unknown.
const maxReservationID = 64

// Reservations keeps the open reservations of descriptors with reserve:
// (weir serve keeps them where POST /v1/reserve keeps its own): small
// records under random ids, each with a TTL, each taken at most once.
type Reservations interface {
	// Put keeps rec under id for ttl.
	Put(ctx context.Context, id string, rec []byte, ttl time.Duration) error
	// Take returns id's record and deletes it, atomically; ok is false
	// for an unknown, expired or already taken id.
	Take(ctx context.Context, id string) (rec []byte, ok bool, err error)
}

// WithReservations honours the reserve: of descriptors (weir serve
// --envoy-reserve), keeping reservations in r. A request-path call (no
// hits_addend, or 0) of such a descriptor takes its reserve as a plain
// take and, when admitted, answers the reservation's id in the dynamic
// metadata field ReservationKey. A call with a descriptor entry of that
// key is a response-path charge: the entry is removed before matching,
// and the reservation settled against the hits_addend, the actual cost:
// the difference is debited, or refunded. An unknown, expired, reused or
// foreign id is answered as a plain charge of hits_addend, never a refund.
// Without this option the entry is matched like any other.
func WithReservations(r Reservations) Option { return func(s *Service) { s.resv = r } }

// UnknownReservations counts the response-path calls whose reservation
// was unknown, expired, already settled or of another descriptor, and
// that were answered as plain charges.
func (s *Service) UnknownReservations() uint64 { return s.unknownResv.Load() }

// reservationCounters are the Service's reservation counters.
type reservationCounters struct {
	unknownResv    atomic.Uint64
	droppedSettles atomic.Uint64
}

// storeAnswered reports whether the store itself answered at least one
// request of a call (fallback names none for it).
func storeAnswered(fallback []string) bool {
	for _, f := range fallback {
		if f == "" {
			return true
		}
	}
	return false
}

// reservation is what the store keeps under an id: the store key and the
// take it dates (weir.Stamp). Its field names differ from those of POST
// /v1/reserve's records, so neither settles the other's.
type reservation struct {
	Key       string `json:"envoy_key"`
	Estimate  int64  `json:"envoy_estimate"`
	At        int64  `json:"envoy_at,omitempty"`
	Remaining int64  `json:"envoy_remaining,omitempty"`
}

func (r *reservation) stamp() weir.Stamp {
	if r.At <= 0 || r.Remaining < 0 {
		return weir.Stamp{Estimate: r.Estimate}
	}
	return weir.Stamp{At: r.At, Estimate: r.Estimate, Remaining: r.Remaining}
}

// reserveOf reads a descriptor's reserve: into r. It needs the loader's
// permission (LoadOptions.Reserve) and debit: true, so that the settlement
// can charge past the limit.
func (p *parser) reserveOf(r *rule, vn *yaml.Node) error {
	if vn == nil {
		return nil
	}
	if !p.reserveOK {
		return yamlnode.Errorf(vn, "reserve is off: start weir serve with --envoy-reserve to reserve on the request path and settle on the response path")
	}
	n, err := yamlnode.IntMin(vn, "reserve", 1)
	if err != nil {
		return err
	}
	if !r.debit {
		return yamlnode.Errorf(vn, "reserve needs debit: true beside it, so that the settlement can charge past the limit, and %s has none", r.path)
	}
	if n > r.maxCost {
		return yamlnode.Errorf(vn, "reserve %d is more than the limit of %s can ever admit at once (%d)", n, r.path, r.maxCost)
	}
	r.reserve = n
	return nil
}

// stripReservations returns req without its ReservationKey entries and,
// by descriptor, the id each brought ("" for none); req itself is not
// changed. A descriptor with two such entries is a bad request.
func stripReservations(req *rlspb.RateLimitRequest) (*rlspb.RateLimitRequest, []string, error) {
	var ids []string
	var descs []*rlcommon.RateLimitDescriptor
	for i, d := range req.GetDescriptors() {
		at := -1
		for j, e := range d.GetEntries() {
			if e.GetKey() != ReservationKey {
				continue
			}
			if at >= 0 {
				return nil, nil, fmt.Errorf("%w: descriptors[%d] has two %s entries", ErrBadRequest, i, ReservationKey)
			}
			at = j
		}
		if at < 0 {
			continue
		}
		if ids == nil {
			ids = make([]string, len(req.GetDescriptors()))
			descs = append([]*rlcommon.RateLimitDescriptor(nil), req.GetDescriptors()...)
		}
		ids[i] = d.GetEntries()[at].GetValue()
		if ids[i] == "" {
			ids[i] = "-" // an empty id is unknown, not absent
		}
		es := make([]*rlcommon.RateLimitDescriptor_Entry, 0, len(d.GetEntries())-1)
		es = append(append(es, d.GetEntries()[:at]...), d.GetEntries()[at+1:]...)
		descs[i] = &rlcommon.RateLimitDescriptor{Entries: es, Limit: d.GetLimit(), HitsAddend: d.GetHitsAddend(), IsNegativeHits: d.GetIsNegativeHits()}
	}
	if ids == nil {
		return req, nil, nil
	}
	return &rlspb.RateLimitRequest{Domain: req.GetDomain(), Descriptors: descs, HitsAddend: req.GetHitsAddend()}, ids, nil
}

// planReservations marks the items that reserve (request path) or settle
// (response path), taking each settled reservation from the store. ids is
// stripReservations' (nil when no descriptor brought one).
func (s *Service) planReservations(ctx context.Context, req *rlspb.RateLimitRequest, items []item, ids []string) error {
	reserving := -1
	for i := range items {
		it := &items[i]
		r := it.rule
		if r == nil || !r.debit && !r.override || it.refund {
			continue
		}
		if ids != nil && ids[i] != "" {
			actual := it.hits
			if !it.explicit {
				actual = int64(req.GetHitsAddend())
			}
			it.hits, it.settling = min(actual, algorithm.MaxDebt), true
			if err := s.takeReservation(ctx, req, it, i, ids[i]); err != nil {
				return err
			}
			continue
		}
		requestPath := req.GetHitsAddend() == 0
		if it.explicit {
			requestPath = it.hits == 0
		}
		if r.reserve == 0 || !requestPath {
			continue
		}
		if reserving >= 0 {
			return fmt.Errorf("%w: descriptors[%d] and descriptors[%d] both reserve; a call may reserve under one descriptor only", ErrBadRequest, reserving, i)
		}
		reserving = i
		it.hits, it.reserving = r.reserve, true
	}
	return nil
}

// takeReservation takes reservation id of descriptor i from the store.
// A reservation made for the descriptor's own key settles it (it.resv);
// any other, or none, leaves a plain charge and is counted.
func (s *Service) takeReservation(ctx context.Context, req *rlspb.RateLimitRequest, it *item, i int, id string) error {
	var rec []byte
	found := false
	if len(id) <= maxReservationID {
		var err error
		if rec, found, err = s.resv.Take(ctx, id); err != nil {
			if ctx.Err() != nil {
				return err
			}
			// The store failed: the reservation stays where it is, and
			// the settlement waits for the store (deferSettlements);
			// this call only peeks.
			key := requestKey(req, it.rule, req.GetDescriptors()[i].GetEntries(), it.shared)
			it.deferred = &pendingSettle{id: id, key: key, rule: it.rule, amount: it.hits}
			it.hits = 0
			return nil
		}
	}
	var res reservation
	if found && json.Unmarshal(rec, &res) == nil && res.Estimate > 0 &&
		res.Key == requestKey(req, it.rule, req.GetDescriptors()[i].GetEntries(), it.shared) {
		it.resv = &res
		return nil
	}
	s.unknownResv.Add(1)
	return nil
}

// settleOf is the store request that settles reservation res (nil: a
// plain charge of actual) under key and r: the charge of what the actual
// cost passes the estimate by, the refund of what it falls short by
// (dated by the take), or a peek when they are equal. A debit rule
// charges into debt; a limit override charges as its window counts a
// response-path cost (peerCount: past the limit, within the window).
func settleOf(key string, r *rule, actual int64, res *reservation) weir.Request {
	d := actual
	if res != nil {
		d = actual - res.Estimate
		switch {
		case d < 0 && r.deny:
			d = 0 // an override's limit of 0 has no refund to give: a peek
		case d < 0:
			return weir.Request{Key: key, Limit: r.limit, N: -d, Mode: weir.ModeRefund, Stamp: res.stamp()}
		}
	}
	if r.override {
		l := r.limit
		l.Rate = countRate
		return weir.Request{Key: key, Limit: l, N: min(d, countRate)}
	}
	return weir.Request{Key: key, Limit: r.limit, N: min(d, algorithm.MaxDebt), Mode: weir.ModeDebit}
}

// keepReservation keeps the reservation of the reserving item, if the
// store admitted its take, and returns its id ("" for none). When the
// call is over its limit all the same (over: another descriptor refused
// it), the stream never runs, so the take is refunded and no reservation
// kept. A reservation that cannot be kept is refunded, and its error
// returned.
func (s *Service) keepReservation(ctx context.Context, items []item, reqs []weir.Request, results []weir.Result, fallback []string, over bool) (string, error) {
	for i := range items {
		it := &items[i]
		if !it.reserving || it.req < 0 || !results[it.req].Allowed || fallback[it.req] != "" {
			continue
		}
		q := reqs[it.req]
		st := results[it.req].Stamp(q.N)
		undo := func() {
			u := []weir.Request{{Key: q.Key, Limit: q.Limit, N: q.N, Mode: weir.ModeRefund, Stamp: st}}
			_ = s.decide(context.WithoutCancel(ctx), u, make([]weir.Result, 1), make([]string, 1))
		}
		if over {
			undo()
			return "", nil
		}
		rec, _ := json.Marshal(reservation{Key: q.Key, Estimate: q.N, At: st.At, Remaining: st.Remaining})
		id := newReservationID()
		if err := s.resv.Put(ctx, id, rec, ReservationTTL); err != nil {
			undo()
			return "", fmt.Errorf("envoyrls: keeping a reservation: %w", err)
		}
		return id, nil
	}
	return "", nil
}

// withReservation adds the reservation's id to resp's dynamic metadata.
func withReservation(resp *rlspb.RateLimitResponse, id string) {
	if resp.DynamicMetadata == nil {
		resp.DynamicMetadata = &structpb.Struct{}
	}
	if resp.DynamicMetadata.Fields == nil {
		resp.DynamicMetadata.Fields = map[string]*structpb.Value{}
	}
	resp.DynamicMetadata.Fields[ReservationKey] = structpb.NewStringValue(id)
}

// newReservationID returns a random reservation id: 128 bits, hex.
func newReservationID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
