package algorithm

import (
	"fmt"
	"time"
)

// Calendar quotas: a fixed_window whose windows are calendar days, weeks
// (ISO: from Monday) or months in a time zone, starting ResetAt after local
// midnight. Months have their real lengths and a day with a daylight-saving
// change lasts 23 or 25 hours, because every boundary is a local time
// converted by the zone's rules (time.Date). The window a key's state
// belongs to is identified by its start, in µs since the epoch, instead of
// the epoch-aligned index a plain fixed window uses.
//
// The Redis store keeps reading its own clock: the Go side sends, with
// each call, the boundaries of the window its own clock falls in, of the
// one before and of the two after (CalendarBounds), and the script picks
// the window that Redis's clock falls in (scripts/prelude.lua's fw_window
// mirrors fwWindow). The boundaries are a function of the zone alone, so
// any server sends the same ones, and clocks may disagree by up to a
// window before the script refuses the call.

// CalendarUnit is the length of a calendar window; 0 is none.
type CalendarUnit uint8

// The calendar units.
const (
	CalendarDay CalendarUnit = iota + 1
	CalendarWeek
	CalendarMonth
)

// String returns the unit's name as a limit writes it: "day", "week", "month".
func (u CalendarUnit) String() string {
	switch u {
	case CalendarDay:
		return "day"
	case CalendarWeek:
		return "week"
	case CalendarMonth:
		return "month"
	}
	return ""
}

// Nominal returns the unit's nominal length in µs (a month counts 31
// days), which a calendar limit reports as its Period.
func (u CalendarUnit) Nominal() int64 {
	const day = 24 * 3600 * 1_000_000
	switch u {
	case CalendarDay:
		return day
	case CalendarWeek:
		return 7 * day
	case CalendarMonth:
		return 31 * day
	}
	return 0
}

// maxCalendarTime bounds the instants calendar arithmetic takes, in µs
// either side of the epoch: a window's start a month or two away from one
// stays far within int64 and time.Time's range.
const maxCalendarTime = 1 << 62

// maxResetAt bounds ResetAt: a window starts within its first local day.
const maxResetAt = 24 * 3600 * 1_000_000

// IsCalendar reports whether p's windows follow the calendar.
func (p *Params) IsCalendar() bool { return p.Calendar != 0 }

func (p *Params) location() *time.Location {
	if p.Location == nil {
		return time.UTC
	}
	return p.Location
}

// calendarStart returns the start, in µs, of the calendar window that is
// i windows after the one holding the local date (y, m, d): always
// computed the same way from the same date, so that one window's end is
// the next one's start.
func (p *Params) calendarStart(y int, m time.Month, d, i int) int64 {
	h := int(p.ResetAt / 3_600_000_000)
	mi := int(p.ResetAt / 60_000_000 % 60)
	s := int(p.ResetAt / 1_000_000 % 60)
	us := int(p.ResetAt % 1_000_000)
	loc := p.location()
	var t time.Time
	switch p.Calendar {
	case CalendarDay:
		t = time.Date(y, m, d+i, h, mi, s, us*1000, loc)
	case CalendarWeek:
		t = time.Date(y, m, d+7*i, h, mi, s, us*1000, loc)
	default:
		t = time.Date(y, m+time.Month(i), 1, h, mi, s, us*1000, loc)
	}
	return t.UnixMicro()
}

// calendarAnchor returns the local date that names the calendar window
// holding the local date of now (the day itself, the week's Monday, the
// month's first), before ResetAt is taken into account.
func (p *Params) calendarAnchor(now int64) (int, time.Month, int) {
	t := time.UnixMicro(now).In(p.location())
	y, m, d := t.Date()
	switch p.Calendar {
	case CalendarWeek:
		d -= (int(t.Weekday()) + 6) % 7 // back to Monday
	case CalendarMonth:
		d = 1
	}
	t = time.Date(y, m, d, 12, 0, 0, 0, time.UTC) // normalise the date only
	return t.Year(), t.Month(), t.Day()
}

// CalendarBounds returns the starts of the calendar window holding now, of
// the one before it and of the two after it: b[0] <= b[1] <= now < b[2] <
// b[3]. The Redis store sends them with each call.
//
// Calendar arithmetic is exact within ±2^62µs of the epoch (±146,000
// years); an instant beyond is taken as that bound, so that no date
// overflows: its bounds are in order but do not hold it.
func CalendarBounds(p *Params, now int64) [4]int64 {
	now = min(max(now, -maxCalendarTime), maxCalendarTime)
	y, m, d := p.calendarAnchor(now)
	i := 0
	// The window named by now's local date starts ResetAt into it: before
	// that, now is still in the previous window. (A zone's change of
	// offset can move a start by a day at most, so each loop runs at most
	// twice; the bound on k makes that so whatever the zone's rules say.)
	for k := 0; k < 4 && p.calendarStart(y, m, d, i) > now; k++ {
		i--
	}
	for k := 0; k < 4 && p.calendarStart(y, m, d, i+1) <= now; k++ {
		i++
	}
	return [4]int64{p.calendarStart(y, m, d, i-1), p.calendarStart(y, m, d, i), p.calendarStart(y, m, d, i+1), p.calendarStart(y, m, d, i+2)}
}

// fwWindow returns the window now falls in, and its end in µs: for a plain
// fixed window its epoch-aligned index, for a calendar one its start
// (fw_window).
func fwWindow(p *Params, now int64) (w, end int64) {
	if !p.IsCalendar() {
		w = now / p.Period
		return w, (w + 1) * p.Period
	}
	b := CalendarBounds(p, now)
	return b[1], b[2]
}

// compileCalendar validates a calendar window's settings. Calendar units
// are taken by fixed_window alone (the table's FieldCalendar), where a
// window has a start and an end; timezone and reset_at need a unit.
func compileCalendar(p *Params) error {
	k := p.Kind
	if p.ResetAt < 0 || p.ResetAt >= maxResetAt {
		return fieldError(k, FieldResetAt, Invalid, p.ResetAt, "reset_at must be a time of day from 00:00 to 23:59:59, got %dµs", p.ResetAt)
	}
	if !p.IsCalendar() {
		if p.Location != nil || p.ResetAt != 0 {
			f := FieldTimezone
			if p.Location == nil {
				f = FieldResetAt
			}
			return fieldError(k, f, NeedsOther, p.ResetAt, "timezone and reset_at apply to calendar windows: a limit per day, week or month")
		}
		return nil
	}
	if p.Calendar > CalendarMonth {
		return fieldError(k, FieldCalendar, Invalid, int64(p.Calendar), "unknown calendar unit %d", p.Calendar)
	}
	if p.Period != p.Calendar.Nominal() {
		return fieldError(k, FieldPeriod, Invalid, p.Period, "a calendar %s's period is %s, not %dµs", p.Calendar, fmt.Sprint(time.Duration(p.Calendar.Nominal())*time.Microsecond), p.Period)
	}
	// The longest window: the nominal length and a day's worth of zone
	// changes (a daylight-saving hour, or a skipped date line day).
	p.MaxWait = p.Period + 24*3600*1_000_000
	return nil
}
