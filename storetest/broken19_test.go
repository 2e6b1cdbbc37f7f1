package storetest_test

import (
	"context"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
	"github.com/weir-dev/weir/storetest"
)

// The defects of escalating penalties, calendar windows and warm-up, each
// of which the suite must catch.
func init() {
	defects = append(defects,
		defect{
			name:  "no-escalation",
			build: func(c *storetest.Clock) store { return strip{mem(c), noEscalation} },
			fails: []failure{{every("EscalatingPenalty"), "first offence: state TTL"}},
		},
		defect{
			name:  "calendar-as-epoch-window",
			build: func(c *storetest.Clock) store { return strip{mem(c), epochWindow} },
			fails: []failure{{[]string{"fixed_window/Calendar"}, "month end, the last minute of January: got"}},
		},
		defect{
			name:  "warmup-ignored",
			build: func(c *storetest.Clock) store { return strip{mem(c), noWarmup} },
			fails: []failure{{[]string{"token_bucket/Warmup", "gcra/Warmup"}, "peek on a cold key"}},
		},
	)
}

// strip is a memstore that rewrites every limit before deciding.
type strip struct {
	*memstore.Store
	f func(weir.Limit) weir.Limit
}

func (s strip) Take(ctx context.Context, key string, l weir.Limit, n int64) (weir.Result, error) {
	return s.Store.Take(ctx, key, s.f(l), n)
}

func (s strip) Do(ctx context.Context, reqs []weir.Request, out []weir.Result) error {
	rs := make([]weir.Request, len(reqs))
	for i, r := range reqs {
		r.Limit = s.f(r.Limit)
		rs[i] = r
	}
	return s.Store.Do(ctx, rs, out)
}

// noEscalation keeps the first box for every offence.
func noEscalation(l weir.Limit) weir.Limit {
	l.Escalate, l.ForgetAfter = [7]time.Duration{}, 0
	return l
}

// epochWindow counts a calendar limit in epoch-aligned windows of the
// unit's nominal length.
func epochWindow(l weir.Limit) weir.Limit {
	if l.Calendar != 0 {
		l.Period = time.Duration(l.Calendar.Nominal()) * time.Microsecond
		l.Calendar, l.Timezone, l.ResetAt = 0, "", 0
	}
	return l
}

// noWarmup starts every key at the full rate.
func noWarmup(l weir.Limit) weir.Limit {
	l.Warmup = 0
	return l
}
