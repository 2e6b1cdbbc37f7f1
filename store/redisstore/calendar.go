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
// last ARGV value; prelude.lua's fw_window picks the window that Redis's
// clock falls in. The boundaries depend on the zone alone, so every
// instance sends the same ones, and instance and Redis clocks may differ
// by up to a window (at least 23 hours) before the script refuses the
// call. The rendered arguments are cached per limit until the window ends.

// calArgs is a calendar limit's ARGV for the window [from, until) of the
// store's clock.
type calArgs struct {
	from, until int64
	args        [nLimitArgs]string
}

// calCache holds a compiled calendar limit's current calArgs.
type calCache struct{ p atomic.Pointer[calArgs] }

// argsOf returns c's ARGV values for a call made now.
func (s *Store) argsOf(c *compiled) *[nLimitArgs]string {
	if !c.p.IsCalendar() {
		return &c.args
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
		return &ca.args
	}
	b := algorithm.CalendarBounds(&c.p, us)
	ca := &calArgs{from: b[1], until: b[2], args: c.args}
	var sb strings.Builder
	if ext := c.args[nLimitArgs-1]; ext != "" {
		sb.WriteString(ext)
		sb.WriteByte(';')
	}
	sb.WriteString("c=")
	for i, v := range b {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.FormatInt(v, 10))
	}
	ca.args[nLimitArgs-1] = sb.String()
	c.cal.p.Store(ca)
	return &ca.args
}
