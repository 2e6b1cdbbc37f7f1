package redisstore

import (
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/weir-dev/weir/algorithm"
)

// Calendar windows (algorithm/calendar.go): Redis keeps reading its own
// clock, and the script needs to know where the calendar window holding
// that clock starts and ends, which only the time zone's rules say. The
// store sends, with every call of a calendar limit, the starts of the
// window its own clock falls in, of the one before and of the two after
// (algorithm.CalendarBounds), as "c=<b0>,<b1>,<b2>,<b3>" in the limit's
// packed ARGV value's last field; prelude.lua's fw_window picks the window that Redis's
// clock falls in. The boundaries depend on the zone alone, so every
// instance sends the same ones, and instance and Redis clocks may differ
// by up to a window (at least 23 hours) before the script refuses the
// call. The rendered arguments are cached per limit until the window ends.

// calArgs is a calendar limit's ARGV for the window [from, until) of the
// store's clock.
type calArgs struct {
	from, until int64
	arg         string
}

// calCache holds a compiled calendar limit's current calArgs.
type calCache struct{ p atomic.Pointer[calArgs] }

// argOf returns c's packed ARGV value for a call made now.
func (s *Store) argOf(c *compiled) string {
	if !c.p.IsCalendar() {
		return c.arg
	}
	now := time.Now()
	switch {
	case s.boundsClock != nil:
		now = s.boundsClock()
	case s.clock != nil:
		now = s.clock()
	}
	us := now.UnixMicro()
	if ca := c.cal.p.Load(); ca != nil && us >= ca.from && us < ca.until {
		return ca.arg
	}
	b := algorithm.CalendarBounds(&c.p, us)
	ca := &calArgs{from: b[1], until: b[2]}
	var sb strings.Builder
	sb.WriteString(c.arg) // its last field, the extras, goes on
	if !strings.HasSuffix(c.arg, "|") {
		sb.WriteByte(';')
	}
	sb.WriteString("c=")
	for i, v := range b {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.FormatInt(v, 10))
	}
	ca.arg = sb.String()
	c.cal.p.Store(ca)
	return ca.arg
}
