package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// ErrBadRequest is wrapped by every error about a malformed request: an
// empty domain or descriptor list, a call over the bounds below, an
// unusable limit override, a negative hits addend. gRPC reports it as
// InvalidArgument, CheckJSON as 400.
var ErrBadRequest = errors.New("envoyrls: bad request")

// Bounds on one call. Envoy sends a handful of descriptors of a few short
// entries each; a call over any bound is refused whole, with an error
// wrapping ErrBadRequest that names the count and the bound, before
// anything is decided or counted.
const (
	MaxDescriptors   = 64   // descriptors per call
	MaxEntries       = 32   // entries per descriptor
	MaxEntryKeyLen   = 256  // bytes in an entry's key
	MaxEntryValueLen = 4096 // bytes in an entry's value
	MaxDomainLen     = 256  // bytes in the domain
)

// KeyRule is the rule part of every state key the Service writes: a
// descriptor's counter lives under weir.Key(KeyRule, domain, key1, value1,
// key2, value2, ...).
const KeyRule = "envoy"

// keyRuleOverride is the rule part of the keys of descriptors that carry
// their own limit (Envoy's limit override): weir.Key(keyRuleOverride,
// domain, unit, unit_multiplier, key1, value1, ...). An override never
// shares a counter with a configured descriptor. Its requests_per_unit is
// not part of the key, so a tenant whose limit changes keeps its count;
// its period is, as upstream's keys carry the start of the unit's window.
const keyRuleOverride = "envoy-override"

// keyRuleShared is the rule part of the keys of descriptors that match a
// share_threshold wildcard. Their parts are tagged ("=" before a value,
// "*" before a shared pattern) so that a pattern never meets a value.
const keyRuleShared = "envoy-shared"

// A Decider decides a batch of requests, one per rate-limited descriptor of
// a call, and fills res (as long as reqs). Each request is decided on its
// own: one being rejected must not stop another from consuming, because
// envoyproxy/ratelimit counts descriptors independently. An error fails the
// whole call (gRPC Unavailable); a Decider that implements fail-open or
// fail-closed fills res and returns nil instead.
type Decider func(ctx context.Context, reqs []weir.Request, res []weir.Result) error

// A FallbackDecider is a Decider that answers some requests by a fallback
// while the store fails, and says which: it sets fallback[i] (as long as
// reqs, all "" on entry) to the fallback's name, such as "allow", "deny"
// or "local", for each request it did not get from the store. Observers
// see it in Observation.Fallback.
type FallbackDecider func(ctx context.Context, reqs []weir.Request, res []weir.Result, fallback []string) error

// Outcome is what happened to one descriptor of a call.
type Outcome int

// The outcomes, as an Observer sees them.
const (
	NoLimit       Outcome = iota // no rule applies: unknown domain, no match, or replaced
	Unlimited                    // the rule is unlimited: OK without counting
	Allowed                      // within the limit
	Limited                      // over the limit: OVER_LIMIT
	ShadowLimited                // over the limit, but the rule is in shadow mode: OK
	Failed                       // the Decider failed, so the call failed
)

// String returns the outcome's name, fit for a metric label.
func (o Outcome) String() string {
	switch o {
	case NoLimit:
		return "no_limit"
	case Unlimited:
		return "unlimited"
	case Allowed:
		return "allowed"
	case Limited:
		return "limited"
	case ShadowLimited:
		return "shadow_limited"
	case Failed:
		return "error"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// An Observation reports one descriptor of a call to an Observer.
type Observation struct {
	// Domain is the request's domain. It may be one the configuration does
	// not know (Outcome NoLimit, Rule empty): label metrics by Rule, which
	// names a configured rule, rather than by Domain alone.
	Domain     string
	Descriptor int // index in the request's descriptors
	// Rule names the rule that decided, from the configuration only, so
	// that it is fit for a metric label: a configured rule's path
	// ("domain.key_value.key"), or "domain.(override)" for every
	// descriptor of a configured domain that carries its own limit
	// (Envoy's limit override), whatever its entries. It is never built
	// from a request, so there are at most as many values as configured
	// rules and domains. Empty when Outcome is NoLimit.
	Rule    string
	Name    string // the rule's name, if it has one
	Hits    int64  // the hits asked for; 0 checks without counting
	Outcome Outcome
	Result  weir.Result // the store's answer; zero when it was not asked
	Err     error       // set when Outcome is Failed

	// Fallback names the fallback of a FallbackDecider that made Result
	// while the store failed; "" when the store decided.
	Fallback string
}

// An Observer is told about every descriptor of every call, after the
// decision and before the response is sent. It must be quick and safe for
// concurrent use.
type Observer func(ctx context.Context, d Observation)

// Option configures a Service.
type Option func(*Service)

// WithDecider routes the store calls through d, for example to add a
// circuit breaker and fail modes. The default calls the store directly.
func WithDecider(d Decider) Option {
	return func(s *Service) {
		s.decide = func(ctx context.Context, reqs []weir.Request, res []weir.Result, _ []string) error {
			return d(ctx, reqs, res)
		}
	}
}

// WithFallbackDecider is WithDecider for a Decider that reports the
// requests its fallback answered, in Observation.Fallback.
func WithFallbackDecider(d FallbackDecider) Option { return func(s *Service) { s.decide = d } }

// WithObserver reports every decision to o, for metrics.
func WithObserver(o Observer) Option { return func(s *Service) { s.observe = o } }

// WithLogger sets where the service logs; the default is slog.Default().
// It logs only what should never happen: a panic caught in a call.
func WithLogger(l *slog.Logger) Option { return func(s *Service) { s.log = l } }

// WithMaxOverridePeriod refuses, as a bad request, a limit override whose
// period (unit times unit_multiplier) is longer than d. Each override
// limit is a counter of its own that lasts its period, so the bound keeps
// whoever reaches the service from creating state that lasts years. 0 (the
// default) leaves the bound every limit has, ten years; weir serve sets a
// day (server.envoy_max_override_period).
func WithMaxOverridePeriod(d time.Duration) Option { return func(s *Service) { s.maxOverride = d } }

// WithClock makes the service read time from now; it only needs time to
// report duration_until_reset for a fixed window the store has not yet
// touched. Tests set it to the store's clock.
func WithClock(now func() time.Time) Option { return func(s *Service) { s.now = now } }

// Service answers Envoy's ShouldRateLimit calls from an envoyproxy/ratelimit
// Config, keeping its counters in a weir Store. It implements
// envoy.service.ratelimit.v3.RateLimitServiceServer and is safe for
// concurrent use; SetConfig swaps the configuration atomically.
//
// Responses are those of envoyproxy/ratelimit for the same configuration
// and requests, with one difference of substance: a request weir rejects
// consumes nothing, where upstream counts it anyway (a descriptor's own
// hits_addend, a cost, counts as upstream counts it). docs/envoy.md lists
// the details.
type Service struct {
	cfg     atomic.Pointer[Config]
	store   weir.Store
	decide  FallbackDecider
	observe Observer
	now     func() time.Time
	log     *slog.Logger
	// maxOverride is the longest period of a limit override; 0: ten years.
	maxOverride time.Duration
	// dynamicMetadata: responses carry dynamic metadata (WithDynamicMetadata).
	dynamicMetadata bool
	g               globals // weir serve's global settings (globals.go)
	// resv keeps the reservations of reserve: (WithReservations); nil:
	// reserve: is not honoured.
	resv Reservations
	reservationCounters
	pend pendingSettlements // settlements waiting for the store
}

// New returns a Service answering from cfg with counters in store. A nil
// cfg knows no domain, so every call is answered OK until SetConfig.
func New(cfg *Config, store weir.Store, opts ...Option) *Service {
	s := &Service{store: store, now: time.Now, log: slog.Default()}
	for _, o := range opts {
		o(s)
	}
	if s.decide == nil {
		WithDecider(StoreDecider(store))(s)
	}
	s.SetConfig(cfg)
	return s
}

// SetConfig replaces the configuration. Calls under way finish with the one
// they started with. Counters survive: they are keyed by descriptor, not by
// configuration.
func (s *Service) SetConfig(cfg *Config) {
	if cfg == nil {
		cfg = &Config{domains: map[string]*domainConfig{}}
	}
	s.cfg.Store(cfg)
}

// Config returns the configuration in force.
func (s *Service) Config() *Config { return s.cfg.Load() }

// StoreDecider returns the default Decider: each request goes to store on
// its own, through its Do.
func StoreDecider(store weir.Store) Decider {
	return func(ctx context.Context, reqs []weir.Request, res []weir.Result) error {
		for i := range reqs {
			if err := store.Do(ctx, reqs[i:i+1], res[i:i+1]); err != nil {
				return err
			}
		}
		return nil
	}
}

// ShouldRateLimit implements envoy.service.ratelimit.v3.RateLimitService.
// A malformed request gets InvalidArgument; a store failure the Decider
// does not absorb gets Unavailable.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlspb.RateLimitRequest) (resp *rlspb.RateLimitResponse, err error) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("envoyrls: panic in ShouldRateLimit", "panic", p, "domain", req.GetDomain())
			resp, err = nil, status.Errorf(codes.Internal, "envoyrls: internal error: %v", p)
		}
	}()
	resp, err = s.Check(ctx, req)
	if err != nil {
		return nil, status.Error(grpcCode(err), err.Error())
	}
	return resp, nil
}

func grpcCode(err error) codes.Code {
	switch {
	case badInput(err):
		return codes.InvalidArgument
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	}
	return codes.Unavailable
}

// badInput reports an error that is the request's fault: a malformed
// request, or a limit or cost the store's own validation refused. A store
// that is unhealthy, or a decision never sent (weir.ErrNotSent), is not.
func badInput(err error) bool {
	return errors.Is(err, ErrBadRequest) || errors.Is(err, weir.ErrInvalidLimit) || errors.Is(err, weir.ErrInvalidCost)
}

// checkBounds refuses a call over the bounds of one call (MaxDescriptors
// and the others), before any work is done for it.
func checkBounds(req *rlspb.RateLimitRequest) error {
	if n := len(req.GetDomain()); n > MaxDomainLen {
		return fmt.Errorf("%w: the domain is %d bytes, over the limit of %d", ErrBadRequest, n, MaxDomainLen)
	}
	descs := req.GetDescriptors()
	if len(descs) > MaxDescriptors {
		return fmt.Errorf("%w: %d descriptors, over the limit of %d per call", ErrBadRequest, len(descs), MaxDescriptors)
	}
	for i, d := range descs {
		es := d.GetEntries()
		if len(es) > MaxEntries {
			return fmt.Errorf("%w: descriptors[%d] has %d entries, over the limit of %d", ErrBadRequest, i, len(es), MaxEntries)
		}
		for j, e := range es {
			if n := len(e.GetKey()); n > MaxEntryKeyLen {
				return fmt.Errorf("%w: descriptors[%d].entries[%d].key is %d bytes, over the limit of %d", ErrBadRequest, i, j, n, MaxEntryKeyLen)
			}
			if n := len(e.GetValue()); n > MaxEntryValueLen {
				return fmt.Errorf("%w: descriptors[%d].entries[%d].value is %d bytes, over the limit of %d", ErrBadRequest, i, j, n, MaxEntryValueLen)
			}
		}
	}
	return nil
}

// item is one descriptor of a call being decided.
type item struct {
	rule   *rule
	shared []string // share_threshold patterns by entry, or nil
	// meta: the rule's metadata, unless value_to_metric dropped it.
	meta   *structpb.Struct
	hits   int64
	forced bool // over the limit's capacity: rejected without consuming
	// explicit: the descriptor has its own hits_addend, as Envoy sends
	// for a cost (apply_on_stream_done, token counts).
	explicit bool
	peer     peerMode // how a fixed window is asked, as upstream counts
	req      int      // index in the store batch, -1 if the store is not asked
	refund   bool     // is_negative_hits on a debit descriptor: give the hits back
	// reserving: a request-path call takes the rule's reserve, kept as a
	// reservation (reserve.go); settling: a response-path call brought a
	// reservation's id, and resv is the reservation it settles (nil:
	// unknown, a plain charge).
	reserving, settling bool
	resv                *reservation
	// deferred: the settling call's reservation could not be read (the
	// store failed), so the call only peeks, and this settlement waits
	// for the store (settle_pending.go).
	deferred *pendingSettle
}

// Check decides req like ShouldRateLimit, returning plain errors: those
// wrapping ErrBadRequest are the caller's fault, others the store's.
func (s *Service) Check(ctx context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, fmt.Errorf("%w: domain must not be empty", ErrBadRequest)
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, fmt.Errorf("%w: descriptors must not be empty", ErrBadRequest)
	}
	if err := checkBounds(req); err != nil {
		return nil, err
	}
	dom := s.cfg.Load().domains[req.Domain]
	if dom == nil {
		s.g.unknownDomains.Add(1)
	}
	var ids []string
	if s.resv != nil {
		var err error
		if req, ids, err = stripReservations(req); err != nil {
			return nil, err
		}
	}
	items, err := matchRules(dom, req, s.maxOverride)
	if err != nil {
		return nil, err
	}
	if s.resv != nil {
		if err := s.planReservations(ctx, req, items, ids); err != nil {
			return nil, fmt.Errorf("envoyrls: domain %q: %w", req.Domain, err)
		}
	}
	reqs := storeRequests(req, items)
	var results []weir.Result
	var fallback []string
	if len(reqs) == 1 {
		one := &oneResult{}
		results, fallback = one.res[:], one.fb[:]
	} else {
		results, fallback = make([]weir.Result, len(reqs)), make([]string, len(reqs))
	}
	if len(reqs) > 0 {
		if err := s.decide(ctx, reqs, results, fallback); err != nil {
			if s.resv != nil && !badInput(err) && ctx.Err() == nil {
				s.deferSettlements(items, reqs, fallback, true)
			}
			err = fmt.Errorf("envoyrls: domain %q: %w", req.Domain, err)
			// A limit or cost the store refused is the request's fault:
			// no decision failed.
			if !badInput(err) {
				s.observeFailed(ctx, req.Domain, items, err)
			}
			return nil, err
		}
	}
	resp := s.respond(ctx, req, items, results, fallback)
	if s.resv != nil {
		s.deferSettlements(items, reqs, fallback, false)
		if storeAnswered(fallback) {
			s.drainSettlements()
		}
		over := resp.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT
		id, err := s.keepReservation(ctx, items, reqs, results, fallback, over)
		if err != nil {
			return nil, fmt.Errorf("envoyrls: domain %q: %w", req.Domain, err)
		}
		if id != "" {
			withReservation(resp, id)
		}
	}
	return resp, nil
}

// matchRules finds each descriptor's rule in dom (nil for a domain the
// configuration does not know) and the hits it asks for. A limit override
// may last at most maxOverride (0: no bound but the ten years of any limit).
func matchRules(dom *domainConfig, req *rlspb.RateLimitRequest, maxOverride time.Duration) ([]item, error) {
	reqHits := max(int64(1), int64(req.GetHitsAddend()))
	descs := req.GetDescriptors()
	items := make([]item, len(descs))
	for i, desc := range descs {
		it := &items[i]
		it.req = -1
		if dom == nil {
			continue // unknown domain: OK, as upstream
		}
		if ov := desc.GetLimit(); ov != nil {
			r, err := overrideRule(dom, i, desc, maxOverride)
			if err != nil {
				return nil, err
			}
			if r.rpu > 0 {
				// reserve: of the configured descriptor the override's
				// entries match (reserve.go).
				if tr, _, _ := dom.match(desc.GetEntries()); tr != nil && tr.reserve > 0 {
					r.reserve = min(tr.reserve, r.maxCost)
				}
			}
			it.rule = r
		} else {
			var renamed bool
			it.rule, it.shared, renamed = dom.match(desc.GetEntries())
			if it.rule != nil && !renamed {
				it.meta = it.rule.metadata
			}
		}
		if desc.GetIsNegativeHits() {
			// Only a debit descriptor gives back: elsewhere weir never
			// counted what it rejected, so there is nothing to return.
			if it.rule == nil || !it.rule.debit {
				return nil, fmt.Errorf("%w: descriptors[%d].is_negative_hits applies only to a descriptor with debit: true", ErrBadRequest, i)
			}
			it.refund = true
		}
		if it.rule == nil {
			continue
		}
		it.hits = reqHits
		if h := desc.GetHitsAddend(); h != nil {
			it.hits = int64(min(h.GetValue(), math.MaxInt64))
			it.explicit = true
		}
	}
	return items, nil
}

// storeRequests builds the store batch: one request for each matched
// rule that counts, setting each item's index in the batch. Rules named
// in another matched rule's replaces are dropped (their item's rule set
// to nil); unlimited rules are never dropped but do replace.
func storeRequests(req *rlspb.RateLimitRequest, items []item) []weir.Request {
	var replacing map[string]bool
	for i := range items {
		if r := items[i].rule; r != nil {
			for _, name := range r.replaces {
				if replacing == nil {
					replacing = map[string]bool{}
				}
				replacing[name] = true
			}
		}
	}
	descs := req.GetDescriptors()
	var reqs []weir.Request
	for i := range items {
		it := &items[i]
		r := it.rule
		if r == nil || r.unlimited {
			continue
		}
		if r.name != "" && replacing[r.name] {
			it.rule = nil
			continue
		}
		if r.override && (it.reserving || it.settling && it.deferred == nil) {
			// An override's reserve, or its settlement (reserve.go), even
			// under a limit of 0: what the stream used still counts.
			it.req = len(reqs)
			key := requestKey(req, r, descs[i].GetEntries(), it.shared)
			if it.reserving {
				reqs = append(reqs, weir.Request{Key: key, Limit: r.limit, N: it.hits})
				continue
			}
			q := settleOf(key, r, it.hits, it.resv)
			if q.Mode != weir.ModeRefund {
				it.peer = peerCount
			}
			reqs = append(reqs, q)
			continue
		}
		if r.deny {
			continue
		}
		n := it.hits
		if r.debit {
			// Every call counts its hits, into debt if need be (0: the
			// request-path check, a peek).
			it.req = len(reqs)
			key := requestKey(req, r, descs[i].GetEntries(), it.shared)
			switch {
			case it.reserving:
				// The request path's reserve: a plain take.
				if n > r.maxCost {
					n, it.forced = 0, true
				}
				reqs = append(reqs, weir.Request{Key: key, Limit: r.limit, N: n})
				continue
			case it.resv != nil:
				reqs = append(reqs, settleOf(key, r, it.hits, it.resv))
				continue
			}
			mode := weir.ModeDebit
			if it.refund {
				mode = weir.ModeRefund
			}
			reqs = append(reqs, weir.Request{Key: key, Limit: r.limit, N: min(n, algorithm.MaxDebt), Mode: mode})
			continue
		}
		if it.peer = peerModeOf(r, it); it.peer != peerTake {
			it.req = len(reqs)
			reqs = append(reqs, peerRequest(requestKey(req, r, descs[i].GetEntries(), it.shared), r, it))
			continue
		}
		if n > r.maxCost {
			// More than the limit can ever admit: upstream says OVER_LIMIT,
			// and a peek fetches the state to report.
			n, it.forced = 0, true
		}
		it.req = len(reqs)
		reqs = append(reqs, weir.Request{Key: requestKey(req, r, descs[i].GetEntries(), it.shared), Limit: r.limit, N: n})
	}
	return reqs
}

// requestKey is the state key of a descriptor's rule.
func requestKey(req *rlspb.RateLimitRequest, r *rule, entries []*rlcommon.RateLimitDescriptor_Entry, shared []string) string {
	if r.override {
		return overrideKey(req.Domain, r, entries)
	}
	return stateKey(req.Domain, entries, shared)
}

// observeFailed reports each descriptor the store was asked about as
// Failed with err.
func (s *Service) observeFailed(ctx context.Context, domain string, items []item, err error) {
	if s.observe == nil {
		return
	}
	for i, it := range items {
		if it.req >= 0 {
			s.observe(ctx, Observation{Domain: domain, Descriptor: i, Rule: it.rule.path, Name: it.rule.name, Hits: it.hits, Outcome: Failed, Err: err})
		}
	}
}

// respond builds the response from the store's results, reporting each
// descriptor to the Observer. The call is over the limit when a plain
// descriptor is, or when every quota_mode descriptor of the call is, as
// upstream decides.
func (s *Service) respond(ctx context.Context, req *rlspb.RateLimitRequest, items []item, results []weir.Result, fallback []string) *rlspb.RateLimitResponse {
	// The messages of all statuses in one allocation each: statuses,
	// and the durations of those that have one; of a call of one
	// descriptor, the whole response in one.
	var resp *rlspb.RateLimitResponse
	var sts []rlspb.RateLimitResponse_DescriptorStatus
	var durs []durationpb.Duration
	if len(items) == 1 {
		one := &oneStatus{}
		resp, sts, durs = &one.resp, one.sts[:], one.durs[:]
		resp.Statuses = one.ptrs[:]
	} else {
		resp = &rlspb.RateLimitResponse{Statuses: make([]*rlspb.RateLimitResponse_DescriptorStatus, len(items))}
		sts = make([]rlspb.RateLimitResponse_DescriptorStatus, len(items))
	}
	over := false
	quotas, quotasOver := 0, 0
	limited := make([]bool, len(items))
	for i := range items {
		st := &sts[i]
		d, reset, ok := s.descriptorStatus(st, req.Domain, i, &items[i], results, fallback)
		if ok {
			if durs == nil {
				durs = make([]durationpb.Duration, len(items))
			}
			// durationpb.New, in place.
			durs[i].Seconds, durs[i].Nanos = int64(reset/time.Second), int32(reset%time.Second)
			st.DurationUntilReset = &durs[i]
		}
		resp.Statuses[i] = st
		limited[i] = d.Outcome == Limited
		if r := items[i].rule; r != nil && !r.unlimited {
			if r.quota {
				quotas++
				if d.Outcome == Limited {
					quotasOver++
				}
			} else if d.Outcome == Limited {
				over = true
			}
		}
		if s.observe != nil {
			s.observe(ctx, d)
		}
	}
	if quotas > 0 && quotasOver == quotas {
		over = true
	}
	over = s.applyGlobals(req.Domain, resp, items, limited, over)
	if over {
		resp.OverallCode = rlspb.RateLimitResponse_OVER_LIMIT
	} else {
		resp.OverallCode = rlspb.RateLimitResponse_OK
	}
	if s.dynamicMetadata {
		passed := make([]bool, len(items))
		meta := make([]*structpb.Struct, len(items))
		for i := range items {
			r := items[i].rule
			passed[i] = resp.Statuses[i].Code == rlspb.RateLimitResponse_OK && (r == nil || !r.unlimited)
			if r != nil {
				meta[i] = items[i].meta
			}
		}
		resp.DynamicMetadata = responseMetadata(req, passed, meta)
	}
	return resp
}

// oneStatus is the response to a call of one descriptor, allocated at
// once.
type oneStatus struct {
	resp rlspb.RateLimitResponse
	ptrs [1]*rlspb.RateLimitResponse_DescriptorStatus
	sts  [1]rlspb.RateLimitResponse_DescriptorStatus
	durs [1]durationpb.Duration
}

// oneResult holds the store's answer to a call of one request.
type oneResult struct {
	res [1]weir.Result
	fb  [1]string
}

// descriptorStatus fills st, the status of the i-th descriptor of a call
// but for its duration_until_reset, and returns the Observation that reports
// it and that duration, if it has one.
func (s *Service) descriptorStatus(st *rlspb.RateLimitResponse_DescriptorStatus, domain string, i int, it *item, results []weir.Result, fallback []string) (Observation, time.Duration, bool) {
	st.Code = rlspb.RateLimitResponse_OK
	d := Observation{Domain: domain, Descriptor: i, Hits: it.hits}
	r := it.rule
	switch {
	case r == nil:
		d.Outcome = NoLimit
		return d, 0, false
	case r.unlimited:
		st.LimitRemaining = math.MaxUint32
		d.Rule, d.Name, d.Outcome = r.path, r.name, Unlimited
		return d, 0, false
	}
	d.Rule, d.Name = r.path, r.name
	allowed := false
	if it.req >= 0 {
		d.Result, d.Fallback = results[it.req], fallback[it.req]
		peerResult(r, it, &d.Result)
		allowed = d.Result.Allowed && !it.forced
	}
	st.CurrentLimit = r.proto()
	st.LimitRemaining = uint32(min(max(d.Result.Remaining, 0), math.MaxUint32))
	reset := s.untilReset(r, d.Result)
	switch {
	case allowed:
		d.Outcome = Allowed
	case r.shadow:
		d.Outcome = ShadowLimited
	default:
		d.Outcome = Limited
		st.Code = rlspb.RateLimitResponse_OVER_LIMIT
	}
	return d, reset, true
}

// untilReset is duration_until_reset. For a fixed window it is the time
// to the end of the window in whole seconds, as upstream computes it even
// when the window is untouched; for other algorithms it is the time until
// the key's state is empty again.
func (s *Service) untilReset(r *rule, res weir.Result) time.Duration {
	d := res.ResetAfter
	if r.deny || r.limit.Algorithm == weir.FixedWindow {
		p := r.limit.Period
		if d <= 0 {
			d = p - time.Duration(s.now().UnixNano()%int64(p))
		}
		if p%time.Second == 0 {
			d = (d + time.Second - 1).Truncate(time.Second)
		}
	}
	return d
}

// proto returns the rule's current_limit: one message for every response
// that reports the rule, which nothing may modify.
func (r *rule) proto() *rlspb.RateLimitResponse_RateLimit {
	if l := r.current.Load(); l != nil {
		return l
	}
	l := &rlspb.RateLimitResponse_RateLimit{Name: r.name, RequestsPerUnit: r.rpu, Unit: r.unit}
	if r.mult > 1 {
		l.UnitMultiplier = wrapperspb.UInt32(r.mult)
	}
	r.current.Store(l) // two first calls at once store equal messages
	return l
}

// match walks the domain's descriptor tree along entries. At each level an
// entry matches its exact key and value first, then the first wildcard (in
// file order) whose key_value pattern matches the entry's key_value
// (wildcardMatch), then its key alone. The
// rule is the one on the node reached by the last entry; a request with
// more or fewer entries than the tree is deep matches nothing. shared
// holds, per entry, the wildcard pattern whose counter is shared
// (share_threshold), or is nil.
func (d *domainConfig) match(entries []*rlcommon.RateLimitDescriptor_Entry) (r *rule, shared []string, renamed bool) {
	lvl := &d.root
	for i, e := range entries {
		k, v := e.GetKey(), e.GetValue()
		n := lvl.exact[entryKey{k, v}]
		wild := false
		if n == nil && len(lvl.wildcards) > 0 {
			full := k + "_" + v
			for _, w := range lvl.wildcards {
				if wildcardMatch(w.parts, full) {
					n, wild = w, true
					break
				}
			}
		}
		byKey := false
		if n == nil {
			n, byKey = lvl.defaults[k], true
		}
		if n == nil {
			return nil, nil, false
		}
		// value_to_metric puts the request's value in the stats key where
		// the configuration has none (by key) or a pattern (by wildcard,
		// without share_threshold); upstream then rebuilds the rule
		// without its metadata.
		if n.valueToMetric && (byKey && v != "" || wild && !n.share && v != strings.TrimPrefix(n.fullKey(), k+"_")) {
			renamed = true
		}
		if wild && n.share {
			if shared == nil {
				shared = make([]string, len(entries))
			}
			// The pattern past the request's key, as upstream keys it.
			shared[i] = strings.TrimPrefix(n.fullKey(), k+"_")
		}
		if i == len(entries)-1 {
			return n.rule, shared, renamed
		}
		if n.children.empty() {
			return nil, nil, false
		}
		lvl = &n.children
	}
	return nil, nil, false
}

// overrideRule builds the rule of a descriptor that carries its own limit
// (Envoy's limit override). As upstream, it applies whatever the tree
// says, counts like a plain fixed window and is never in shadow mode. Its
// path is the domain's fixed override label, never the request's entries,
// and its limit passes weir's own validation (weir.Limit.Compile, as the
// stores use) here, so that a limit no store accepts is a bad request
// rather than a store failure. A period longer than maxOverride (when not
// 0) is refused too.
func overrideRule(dom *domainConfig, i int, desc *rlcommon.RateLimitDescriptor, maxOverride time.Duration) (*rule, error) {
	ov := desc.GetLimit()
	unit := rlspb.RateLimitResponse_RateLimit_Unit(ov.GetUnit())
	ud := unitDuration(unit)
	if ud == 0 {
		return nil, fmt.Errorf("%w: descriptors[%d].limit.unit must be a known unit, got %v", ErrBadRequest, i, ov.GetUnit())
	}
	mult := max(1, ov.GetUnitMultiplier().GetValue())
	if time.Duration(mult) > math.MaxInt64/ud {
		return nil, fmt.Errorf("%w: descriptors[%d].limit: unit_multiplier %d makes the period too long (at most 10 years)", ErrBadRequest, i, mult)
	}
	r := &rule{
		domain: dom.name, path: dom.overridePath(), override: true,
		rpu: ov.GetRequestsPerUnit(), unit: unit, mult: mult,
		limit: weir.Limit{Algorithm: weir.FixedWindow, Rate: int64(ov.GetRequestsPerUnit()), Period: ud * time.Duration(mult)},
	}
	r.deny = r.rpu == 0
	check := r.limit
	if r.deny {
		check.Rate = 1 // a denying override never reaches the store, but its period must still be usable
	}
	params, err := check.Compile()
	if err != nil {
		return nil, fmt.Errorf("%w: descriptors[%d].limit: %w", ErrBadRequest, i, err)
	}
	if maxOverride > 0 && r.limit.Period > maxOverride {
		return nil, fmt.Errorf("%w: descriptors[%d].limit: unit %v with unit_multiplier %d is a period of %s, longer than the %s an override may have (weir serve: server.envoy_max_override_period)",
			ErrBadRequest, i, unit, mult, span(r.limit.Period), span(maxOverride))
	}
	if !r.deny {
		r.maxCost = params.MaxCost()
	}
	return r, nil
}

// span writes d in days when it is a whole number of them ("365d"), as
// weir.yaml's durations may be written, and as a Go duration otherwise.
func span(d time.Duration) string {
	const day = 24 * time.Hour
	if d >= day && d%day == 0 {
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	return d.String()
}

// overrideKey is the store key of an override's counter: apart from the
// configured descriptors' keys, the same whatever the override's
// requests_per_unit, one per period.
func overrideKey(domain string, r *rule, entries []*rlcommon.RateLimitDescriptor_Entry) string {
	parts := make([]string, 0, 3+2*len(entries))
	parts = append(parts, domain, strings.ToLower(r.unit.String()), strconv.FormatUint(uint64(r.mult), 10))
	for _, e := range entries {
		parts = append(parts, e.GetKey(), e.GetValue())
	}
	return weir.Key(keyRuleOverride, parts...)
}

// stateKey is the store key of a descriptor's counter.
func stateKey(domain string, entries []*rlcommon.RateLimitDescriptor_Entry, shared []string) string {
	var buf [9]string // a domain and four entries without allocating
	parts := append(buf[:0], domain)
	if shared == nil {
		for _, e := range entries {
			parts = append(parts, e.GetKey(), e.GetValue())
		}
		return weir.Key(KeyRule, parts...)
	}
	for i, e := range entries {
		v := "=" + e.GetValue()
		if shared[i] != "" {
			v = "*" + shared[i]
		}
		parts = append(parts, e.GetKey(), v)
	}
	return weir.Key(keyRuleShared, parts...)
}
