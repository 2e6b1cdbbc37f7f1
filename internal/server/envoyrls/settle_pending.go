package envoyrls

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/weir-dev/weir"
)

// Settlements the store could not decide (it failed, and the Decider's
// fallback answered, or the reservation could not be read) are kept by
// the instance and made when the store answers again, since Envoy never
// repeats a response-path call:
//
//   - a reservation that could not be read stays in the reservation
//     store, and is taken and settled exactly once the store answers (an
//     id it no longer knows is a plain charge, as ever);
//   - a reservation already taken whose settlement fell back owes the
//     store what the actual cost passed the estimate by: that charge is
//     made later. What it fell short by is never refunded late (the
//     store may have made the refund before failing to answer it): the
//     estimate stays charged, so a late settlement can only charge more,
//     never admit more.
//
// At most maxPendingSettlements are kept, of at most maxPendingBytes of
// keys and ids (a descriptor's key may be long), each for ReservationTTL;
// one more, or one kept longer, is dropped and counted
// (DroppedSettlements).
// They live in the instance's memory: an instance that stops loses its
// own.

// maxPendingSettlements bounds the settlements an instance keeps for
// the store's return.
const maxPendingSettlements = 10000

// maxPendingBytes bounds the bytes of the keys and ids of the kept
// settlements: 10,000 of the usual keys fit well within it, about 1,450
// of the longest a call can make.
const maxPendingBytes = 4 << 20

// pendingSettle is a settlement waiting for the store.
type pendingSettle struct {
	id     string // the reservation to take first; "" once taken
	key    string // the descriptor's store key
	rule   *rule
	amount int64 // with id: the actual cost; without: the charge owed
	until  time.Time
}

// size is what p counts against maxPendingBytes.
func (p *pendingSettle) size() int { return len(p.key) + len(p.id) + 64 }

// pendingSettlements is the Service's queue of pendingSettle.
type pendingSettlements struct {
	mu       sync.Mutex
	q        []pendingSettle
	bytes    int // the sizes of q's settlements
	draining bool
}

// PendingSettlements returns how many settlements wait for the store.
func (s *Service) PendingSettlements() int {
	s.pend.mu.Lock()
	defer s.pend.mu.Unlock()
	return len(s.pend.q)
}

// DroppedSettlements counts the settlements given up: more than the
// instance keeps, or not made within ReservationTTL.
func (s *Service) DroppedSettlements() uint64 { return s.droppedSettles.Load() }

// keep queues p, or drops it when the queue is full.
func (s *Service) keepSettle(p pendingSettle) {
	s.pend.mu.Lock()
	defer s.pend.mu.Unlock()
	if len(s.pend.q) >= maxPendingSettlements || s.pend.bytes+p.size() > maxPendingBytes {
		s.droppedSettles.Add(1)
		return
	}
	s.pend.q = append(s.pend.q, p)
	s.pend.bytes += p.size()
}

// deferSettlements keeps the settlements of a call the store did not
// decide: those whose reservation could not be read, and those the
// fallback answered (all of them when failed: the Decider failed).
func (s *Service) deferSettlements(items []item, reqs []weir.Request, fallback []string, failed bool) {
	until := s.now().Add(ReservationTTL)
	for i := range items {
		it := &items[i]
		switch {
		case it.deferred != nil:
			p := *it.deferred
			p.until = until
			s.keepSettle(p)
		case it.settling && it.resv != nil && it.req >= 0 && (failed || fallback[it.req] != ""):
			if q := reqs[it.req]; q.Mode != weir.ModeRefund && q.N > 0 {
				s.keepSettle(pendingSettle{key: q.Key, rule: it.rule, amount: it.hits - it.resv.Estimate, until: until})
			}
		}
	}
}

// drainSettlements makes the kept settlements in the background, unless
// that is under way: the store has just answered.
func (s *Service) drainSettlements() {
	s.pend.mu.Lock()
	if s.pend.draining || len(s.pend.q) == 0 {
		s.pend.mu.Unlock()
		return
	}
	s.pend.draining = true
	s.pend.mu.Unlock()
	go func() {
		for {
			s.pend.mu.Lock()
			// Drop what waited too long.
			now := s.now()
			q := s.pend.q[:0]
			for _, p := range s.pend.q {
				if now.After(p.until) {
					s.droppedSettles.Add(1)
					s.pend.bytes -= p.size()
					continue
				}
				q = append(q, p)
			}
			s.pend.q = q
			if len(q) == 0 {
				s.pend.draining = false
				s.pend.mu.Unlock()
				return
			}
			p := q[0]
			s.pend.q = q[1:]
			s.pend.bytes -= p.size()
			s.pend.mu.Unlock()
			if !s.replaySettle(&p) {
				s.pend.mu.Lock()
				s.pend.q = append([]pendingSettle{p}, s.pend.q...)
				s.pend.bytes += p.size()
				s.pend.draining = false
				s.pend.mu.Unlock()
				return
			}
		}
	}()
}

// replaySettle makes p; false when the store failed again, with p
// updated to what is still owed.
func (s *Service) replaySettle(p *pendingSettle) bool {
	ctx := context.Background()
	var res *reservation
	if p.id != "" {
		rec, found, err := s.resv.Take(ctx, p.id)
		if err != nil {
			return false
		}
		var r reservation
		if found && json.Unmarshal(rec, &r) == nil && r.Estimate > 0 && r.Key == p.key {
			res = &r
		} else {
			s.unknownResv.Add(1)
		}
		p.id = ""
	}
	q := settleOf(p.key, p.rule, p.amount, res)
	if res != nil {
		// Taken: from here on only the charge past the estimate is owed.
		p.amount = p.amount - res.Estimate
	}
	if q.N == 0 {
		return true
	}
	out, fb := make([]weir.Result, 1), make([]string, 1)
	if err := s.decide(ctx, []weir.Request{q}, out, fb); err != nil || fb[0] != "" {
		return q.Mode == weir.ModeRefund // a refund is not made late
	}
	return true
}
