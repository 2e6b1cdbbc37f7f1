package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/override"
)

// Overrides (internal/override), with Config.Overrides set:
//
//   - An exact key's override is the string "<prefix>:{<tag>}:ovr", in
//     the slot of the key's state, holding "<until µs or 0>|<packed
//     cost>|<shape>|<packed limit>". Every decision script reads it (prelude.lua's
//     override_of) in the same atomic step as the state, so the override
//     binds every instance's next decision once its SET has returned,
//     when the caller's limit has the override's shape (override.Shape). A
//     key without one costs the script one GET of a missing key and no
//     round trip.
//   - Every override, patterns included, is also a field of the hash
//     "<prefix>:{overrides}" (its JSON), which lists them and bounds their
//     number, and every change is appended to the stream
//     "<prefix>:{overrides}:log", capped at about override.MaxLog entries.
//     One script (ovr_scripts.go) checks the bound and writes the index,
//     the log and, on a server that is not a cluster, the exact key's
//     override, so that instances changing overrides at once never pass
//     the bound. On a cluster the exact key's override lives in another
//     slot and is written just after the script, only if no later change
//     of it was written first (ovrPutScript), so it ends as the index says.
//   - Patterns are read from the hash into each store's memory by
//     RefreshOverrides (weir serve calls it every second) and applied in
//     Go before the call: a pattern binds the instance that set it at
//     once, and every other instance from its next refresh.

// ovrKey is the Redis key of an exact key's override.
func (s *Store) ovrKey(key string) string {
	var b strings.Builder
	b.WriteString(s.prefix)
	b.WriteString(":{")
	writeTag(&b, key)
	b.WriteString("}:ovr")
	return b.String()
}

// ovrIndex and ovrLog are the index of every override and the audit
// log, in one slot.
func (s *Store) ovrIndex() string { return s.ovrIdx }
func (s *Store) ovrLog() string   { return s.prefix + ":{overrides}:log" }

// ovrSeq counts the changes, numbering each (ovr_scripts.go).
func (s *Store) ovrSeq() string { return s.prefix + ":{overrides}:seq" }

// ovrNow is the store's clock for checking an override's expiry: the test
// clock, or Redis TIME.
func (s *Store) ovrNow(ctx context.Context) (time.Time, error) {
	if s.clock != nil {
		return s.clock(), nil
	}
	arr, err := s.client.Do(ctx, s.client.B().Time().Build()).AsStrSlice()
	if err != nil || len(arr) != 2 {
		return time.Time{}, fmt.Errorf("%w: TIME: %v", weir.ErrStore, err)
	}
	sec, _ := strconv.ParseInt(arr[0], 10, 64)
	us, _ := strconv.ParseInt(arr[1], 10, 64)
	return time.Unix(sec, us*1000), nil
}

// SetOverride implements override.Store. It needs Config.Overrides.
func (s *Store) SetOverride(ctx context.Context, ov override.Override) error {
	if !s.overrides {
		return fmt.Errorf("%w: the store was made without Config.Overrides", weir.ErrUnsupported)
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	now, err := s.ovrNow(ctx)
	if err != nil {
		return err
	}
	if err := override.Check(&ov, now); err != nil {
		return err
	}
	p, _ := ov.Limit.Compile() // Check compiled it
	doc, err := json.Marshal(ov)
	if err != nil {
		return err
	}
	keys := []string{s.ovrIndex(), s.ovrLog(), s.ovrSeq(), s.ovrDue()}
	untilArg := "0"
	if !ov.Until.IsZero() {
		untilArg = strconv.FormatInt(ov.Until.UnixMicro(), 10)
	}
	args := []string{ov.Key, string(doc), strconv.Itoa(s.maxOverrides()), strconv.Itoa(override.MaxLog), "", "0", untilArg}
	var val, pxat string // the exact key's override, on a cluster written after the index
	_, pat := ov.Pattern()
	if !pat {
		var until int64
		if !ov.Until.IsZero() {
			until = ov.Until.UnixMicro()
		}
		val = strconv.FormatInt(until, 10) + "|" + strconv.FormatInt(p.MaxCost(), 10) + "|" + override.Shape(ov.Limit) + "|" + limitArg(&p)
		pxat = "0"
		if until != 0 && s.clock == nil {
			// Redis drops it a second after it stops applying; the
			// script's own check by its clock is what counts.
			pxat = strconv.FormatInt(ov.Until.Add(time.Second).UnixMilli(), 10)
		}
		if !s.cluster {
			keys = append(keys, s.ovrKey(ov.Key))
			args[4], args[5] = val, pxat
		}
	}
	seq, err := ovrSetScript.Exec(ctx, s.client, keys, args).AsInt64()
	if err != nil {
		if n, ok := boundError(err); ok {
			return &override.Error{Field: "key", Reason: fmt.Sprintf("the store holds %d overrides, the most it keeps (%d): delete one first", n, s.maxOverrides())}
		}
		return fmt.Errorf("%w: overrides: %w", weir.ErrStore, err)
	}
	if !pat && s.cluster {
		if err := s.putOverride(ctx, ov.Key, seq, val, pxat); err != nil {
			return err
		}
	}
	if _, pat := ov.Pattern(); pat {
		return s.RefreshOverrides(ctx)
	}
	return nil
}

// putOverride writes, on a cluster, the exact key's override as change
// number seq left it (val "": deleted), unless a later change was
// written first.
func (s *Store) putOverride(ctx context.Context, key string, seq int64, val, pxat string) error {
	k := s.ovrKey(key)
	err := ovrPutScript.Exec(ctx, s.client, []string{k, k + "v"},
		[]string{strconv.FormatInt(seq, 10), val, pxat, strconv.FormatInt(ovrSeqTTL.Milliseconds(), 10)}).Error()
	if err != nil {
		return fmt.Errorf("%w: override of %s: %w", weir.ErrStore, keyRef(key), err)
	}
	return nil
}

// maxOverrides is the most overrides the store keeps.
func (s *Store) maxOverrides() int {
	if s.ovrMax > 0 {
		return s.ovrMax
	}
	return override.MaxOverrides
}

// boundError reports whether err is ovrSetScript's refusal beyond the
// bound, and the count it found.
func boundError(err error) (int, bool) {
	var re *rueidis.RedisError
	if !errors.As(err, &re) {
		return 0, false
	}
	_, rest, ok := strings.Cut(re.Error(), "WEIRBOUND ")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSpace(rest))
	return n, err == nil
}

// DeleteOverride implements override.Store.
func (s *Store) DeleteOverride(ctx context.Context, key string) (bool, error) {
	if !s.overrides {
		return false, fmt.Errorf("%w: the store was made without Config.Overrides", weir.ErrUnsupported)
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	keys := []string{s.ovrIndex(), s.ovrLog(), s.ovrSeq(), s.ovrDue()}
	_, pat := override.IsPattern(key)
	if !pat && !s.cluster {
		keys = append(keys, s.ovrKey(key))
	}
	seq, err := ovrDeleteScript.Exec(ctx, s.client, keys, []string{key, strconv.Itoa(override.MaxLog)}).AsInt64()
	if rueidis.IsRedisNil(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%w: overrides: %w", weir.ErrStore, err)
	}
	if !pat && s.cluster {
		if err := s.putOverride(ctx, key, seq, "", "0"); err != nil {
			return true, err
		}
	}
	if pat {
		if err := s.RefreshOverrides(ctx); err != nil {
			return true, err
		}
	}
	return true, nil
}

// Overrides implements override.Store.
func (s *Store) Overrides(ctx context.Context, prefix string) ([]override.Override, error) {
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	m, err := s.client.Do(ctx, s.client.B().Hgetall().Key(s.ovrIndex()).Build()).AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("%w: overrides: %w", weir.ErrStore, err)
	}
	out := make([]override.Override, 0, len(m))
	for k, v := range m {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		var o override.Override
		if err := json.Unmarshal([]byte(v), &o); err != nil {
			return nil, fmt.Errorf("overrides: the entry of %s: %w", keyRef(k), err)
		}
		out = append(out, o)
	}
	slices.SortFunc(out, func(a, b override.Override) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

// RefreshOverrides reloads the pattern overrides from Redis into the
// store's memory, where decisions apply them.
func (s *Store) RefreshOverrides(ctx context.Context) error {
	all, err := s.Overrides(ctx, "")
	if err != nil {
		return err
	}
	var ps override.Patterns
	for _, o := range all {
		if _, pat := o.Pattern(); pat {
			ps = append(ps, o)
		}
	}
	slices.SortStableFunc(ps, func(a, b override.Override) int { return len(b.Key) - len(a.Key) })
	s.patterns.Store(&ps)
	return nil
}

// OverrideLog implements override.Store.
func (s *Store) OverrideLog(ctx context.Context, n int) ([]override.Change, error) {
	if n <= 0 {
		return nil, nil
	}
	ctx, cancel := s.withDeadline(ctx)
	defer cancel()
	es, err := s.client.Do(ctx, s.client.B().Xrevrange().Key(s.ovrLog()).End("+").Start("-").Count(int64(n)).Build()).AsXRange()
	if err != nil {
		return nil, fmt.Errorf("%w: overrides log: %w", weir.ErrStore, err)
	}
	out := make([]override.Change, 0, len(es))
	for i := len(es) - 1; i >= 0; i-- {
		e := es[i]
		c := override.Change{ID: e.ID, Op: e.FieldValues["op"]}
		if ms, _, ok := strings.Cut(e.ID, "-"); ok {
			v, _ := strconv.ParseInt(ms, 10, 64)
			c.Time = time.UnixMilli(v).UTC()
		}
		_ = json.Unmarshal([]byte(e.FieldValues["override"]), &c.Override)
		out = append(out, c)
	}
	return out, nil
}

// patterned returns the limit key decides under in Go: a live pattern
// override's, else l. The exact override, if any, the script applies.
func (s *Store) patterned(key string, l weir.Limit) weir.Limit {
	ps := s.patterns.Load()
	if ps == nil || len(*ps) == 0 {
		return l
	}
	now := time.Now()
	if s.clock != nil {
		now = s.clock()
	}
	if e := ps.Match(key, now); e != nil && override.Compatible(l, e.Limit) {
		return e.Limit
	}
	return l
}

// costError turns a script's refusal of a cost its key's override can
// never admit ("WEIRCOST <max>", prelude.lua's override_cost) into
// weir.CheckCost's error; any other error is returned as it is.
// A batch's error names its request, which at returns the key and cost
// of (at is nil for a single decision).
func costError(err error, key string, n int64, at func(int) (string, int64)) error {
	var re *rueidis.RedisError
	if !errors.As(err, &re) {
		return err
	}
	msg := re.Error()
	i := strings.Index(msg, "WEIRCOST ")
	if i < 0 {
		return err
	}
	f := strings.Fields(msg[i+len("WEIRCOST "):])
	if len(f) == 0 {
		return err
	}
	if at != nil && len(f) > 1 {
		// An all-or-nothing batch names its request (from 1).
		j, perr := strconv.Atoi(f[1])
		if perr != nil || j < 1 {
			return err
		}
		key, n = at(j - 1)
	}
	max, perr := strconv.ParseInt(f[0], 10, 64)
	if perr != nil {
		return err
	}
	return weir.CheckCost(key, n, max)
}
