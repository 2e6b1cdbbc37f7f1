package resp

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/weir-dev/weir"
)

// Version is the Redis version HELLO reports: the protocol level weir's
// listener speaks, so that clients that read it pick RESP3-era behaviour.
const Version = "7.2.0"

// kind is a decision's command.
type kind uint8

const (
	kindNone kind = iota // not a decision
	kindThrottle
	kindGCRA
	kindCheck
	kindReserve
	kindSettle
)

// decisionKind returns the decision command name is, in any case, or
// kindNone: the commands decided by the backend, which a pipeline runs at
// once.
func decisionKind(name []byte) kind {
	switch len(name) {
	case 4:
		if bytes.EqualFold(name, []byte("gcra")) {
			return kindGCRA
		}
	case 10:
		if bytes.EqualFold(name, []byte("weir.check")) {
			return kindCheck
		}
	case 11:
		if bytes.EqualFold(name, []byte("cl.throttle")) {
			return kindThrottle
		}
		if bytes.EqualFold(name, []byte("weir.settle")) {
			return kindSettle
		}
	case 12:
		if bytes.EqualFold(name, []byte("weir.reserve")) {
			return kindReserve
		}
	}
	return kindNone
}

// command answers a command that is not a decision, or any command before
// AUTH. It reports whether the connection must close after the reply.
func (c *conn) command(args [][]byte, b []byte) ([]byte, bool) {
	name := strings.ToUpper(string(args[0]))
	switch name {
	case "AUTH":
		return c.auth(args, b), false
	case "HELLO":
		return c.hello(args, b), false
	case "QUIT":
		return appendSimple(b, "OK"), true
	}
	if !c.authed {
		return appendError(b, "NOAUTH Authentication required."), false
	}
	switch name {
	case "PING":
		switch len(args) {
		case 1:
			return appendSimple(b, "PONG"), false
		case 2:
			return appendBulk(b, string(args[1])), false
		}
		return arity(b, "ping"), false
	case "ECHO":
		if len(args) != 2 {
			return arity(b, "echo"), false
		}
		return appendBulk(b, string(args[1])), false
	case "SELECT":
		if len(args) != 2 {
			return arity(b, "select"), false
		}
		if string(args[1]) != "0" {
			return appendError(b, "ERR DB index is out of range"), false
		}
		return appendSimple(b, "OK"), false
	case "CLIENT":
		return c.client(args, b), false
	case "COMMAND":
		if len(args) >= 2 && strings.EqualFold(string(args[1]), "COUNT") {
			return appendInt(b, int64(len(commandNames))), false
		}
		if len(args) >= 2 && strings.EqualFold(string(args[1]), "DOCS") {
			return appendMap(b, 0, c.proto), false
		}
		return appendArray(b, 0), false
	case "CONFIG":
		// redis-benchmark asks for "save" and "appendonly" (and warns
		// when they are missing): weir persists nothing. Any other
		// setting is absent, as Redis answers an unknown one.
		if len(args) >= 2 && strings.EqualFold(string(args[1]), "GET") {
			var pairs [][2]string
			for _, a := range args[2:] {
				switch {
				case strings.EqualFold(string(a), "save"):
					pairs = append(pairs, [2]string{"save", ""})
				case strings.EqualFold(string(a), "appendonly"):
					pairs = append(pairs, [2]string{"appendonly", "no"})
				}
			}
			b = appendMap(b, len(pairs), c.proto)
			for _, p := range pairs {
				b = appendBulk(appendBulk(b, p[0]), p[1])
			}
			return b, false
		}
	}
	if k := decisionKind(args[0]); k != kindNone {
		ctx, cancel := context.WithTimeout(c.s.ctx, decisionTimeout)
		defer cancel()
		return c.decide(ctx, k, args, b), false
	}
	return unknown(b, args), false
}

// commandNames are the commands the listener answers.
var commandNames = []string{"auth", "hello", "quit", "ping", "echo", "select", "client", "command", "config",
	"cl.throttle", "gcra", "weir.check", "weir.reserve", "weir.settle"}

func arity(b []byte, name string) []byte {
	return appendError(b, "ERR wrong number of arguments for '"+name+"' command")
}

// unknown answers a command the listener does not have, as Redis words it.
func unknown(b []byte, args [][]byte) []byte {
	var m strings.Builder
	m.WriteString("ERR unknown command '")
	m.WriteString(printable(args[0], 64))
	m.WriteString("', with args beginning with:")
	for i, a := range args[1:] {
		if i == 8 {
			break
		}
		m.WriteString(" '")
		m.WriteString(printable(a, 64))
		m.WriteString("'")
	}
	m.WriteString(" (weir answers PING, AUTH, HELLO, CLIENT, SELECT 0, COMMAND, QUIT, CL.THROTTLE, GCRA, WEIR.CHECK, WEIR.RESERVE and WEIR.SETTLE)")
	return appendError(b, m.String())
}

func (c *conn) auth(args [][]byte, b []byte) []byte {
	var user, pass []byte
	switch len(args) {
	case 2:
		pass = args[1]
	case 3:
		user, pass = args[1], args[2]
	default:
		return arity(b, "auth")
	}
	if c.s.cfg.Token == "" {
		return appendError(b, "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?")
	}
	if !c.checkToken(user, pass) {
		return appendError(b, "WRONGPASS invalid username-password pair or user is disabled.")
	}
	c.authed = true
	return appendSimple(b, "OK")
}

func (c *conn) hello(args [][]byte, b []byte) []byte {
	proto := c.proto
	i := 1
	if len(args) > 1 {
		v, ok := parseInt(args[1])
		if !ok {
			return appendError(b, "ERR Protocol version is not an integer or out of range")
		}
		if v != 2 && v != 3 {
			return appendError(b, "NOPROTO unsupported protocol version")
		}
		proto = int(v)
		i = 2
	}
	name, setName := "", false
	for ; i < len(args); i++ {
		switch opt := strings.ToUpper(string(args[i])); {
		case opt == "AUTH" && i+2 < len(args):
			if c.s.cfg.Token == "" {
				// Redis without a password accepts any AUTH in HELLO
				// for the default user; so does weir without a token.
				i += 2
				continue
			}
			if !c.checkToken(args[i+1], args[i+2]) {
				return appendError(b, "WRONGPASS invalid username-password pair or user is disabled.")
			}
			c.authed = true
			i += 2
		case opt == "SETNAME" && i+1 < len(args):
			name, setName = string(args[i+1]), true
			i++
		default:
			return appendError(b, "ERR Syntax error in HELLO option '"+printable(args[i], 64)+"'")
		}
	}
	if !c.authed {
		return appendError(b, "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time")
	}
	if setName {
		c.name = name
	}
	c.proto = proto
	b = appendMap(b, 7, proto)
	b = appendBulk(b, "server")
	b = appendBulk(b, "weir")
	b = appendBulk(b, "version")
	b = appendBulk(b, Version)
	b = appendBulk(b, "proto")
	b = appendInt(b, int64(proto))
	b = appendBulk(b, "id")
	b = appendInt(b, c.id)
	b = appendBulk(b, "mode")
	b = appendBulk(b, "standalone")
	b = appendBulk(b, "role")
	b = appendBulk(b, "master")
	b = appendBulk(b, "modules")
	return appendArray(b, 0)
}

func (c *conn) client(args [][]byte, b []byte) []byte {
	if len(args) < 2 {
		return arity(b, "client")
	}
	switch sub := strings.ToUpper(string(args[1])); sub {
	case "SETNAME":
		if len(args) != 3 {
			return arity(b, "client|setname")
		}
		c.name = string(args[2])
		return appendSimple(b, "OK")
	case "GETNAME":
		if c.name == "" {
			return appendNull(b, c.proto)
		}
		return appendBulk(b, c.name)
	case "SETINFO":
		if len(args) != 4 {
			return arity(b, "client|setinfo")
		}
		return appendSimple(b, "OK")
	case "ID":
		return appendInt(b, c.id)
	}
	return appendError(b, "ERR unknown subcommand '"+printable(args[1], 64)+"'. Try CLIENT SETNAME, GETNAME, SETINFO or ID.")
}

// decisionTimeout bounds the decisions of one pipeline, store included.
const decisionTimeout = 10 * time.Second

// decide answers CL.THROTTLE, GCRA, WEIR.CHECK, WEIR.RESERVE and
// WEIR.SETTLE (k) by ctx.
func (c *conn) decide(ctx context.Context, k kind, args [][]byte, b []byte) []byte {
	switch k {
	case kindThrottle:
		q, err := parseThrottle(args)
		if err != nil {
			return appendError(b, err.Error())
		}
		return c.throttle(ctx, "cl.throttle", q, b)
	case kindGCRA:
		q, err := parseGCRA(args)
		if err != nil {
			return appendError(b, err.Error())
		}
		return c.throttle(ctx, "gcra", q, b)
	case kindReserve:
		return c.reserve(ctx, args, b)
	case kindSettle:
		return c.settle(ctx, args, b)
	}
	if len(args) < 3 || len(args) > 4 {
		return arity(b, "weir.check")
	}
	hits := int64(1)
	if len(args) == 4 {
		v, ok := parseInt(args[3])
		if !ok || v < 0 {
			return appendError(b, "ERR hits must be an integer, 0 (peek) or more")
		}
		hits = v
	}
	res, err := c.s.b.Check(ctx, string(args[1]), string(args[2]), hits)
	if err != nil {
		return appendError(b, errorText(err))
	}
	limited, retry := int64(0), int64(-1)
	if !res.Allowed {
		limited, retry = 1, ceilMS(res.RetryAfter)
	}
	return appendInts(b, limited, res.Limit, max(res.Remaining, 0), retry, ceilMS(res.ResetAfter))
}

// maxReservationID bounds the id WEIR.SETTLE takes, as /v1/settle does.
const maxReservationID = 64

// reserve answers WEIR.RESERVE rule key estimate [TIER tier].
func (c *conn) reserve(ctx context.Context, args [][]byte, b []byte) []byte {
	if len(args) != 4 && len(args) != 6 {
		return arity(b, "weir.reserve")
	}
	est, err := intArg(args[3], "estimate", 1, math.MaxInt64/2)
	if err != nil {
		return appendError(b, err.Error())
	}
	tier := ""
	if len(args) == 6 {
		if !strings.EqualFold(string(args[4]), "TIER") {
			return appendError(b, "ERR syntax error: '"+printable(args[4], 64)+"' where TIER was expected")
		}
		if tier = string(args[5]); tier == "" {
			return appendError(b, "ERR TIER is empty; name a tier of the rule")
		}
	}
	res, err := c.s.b.Reserve(ctx, string(args[1]), tier, string(args[2]), est)
	if err != nil {
		return appendError(b, errorText(err))
	}
	b = c.decision(b, res.CheckResult, 2)
	b = appendBulk(b, "reservation")
	b = appendBulk(b, res.Reservation)
	b = appendBulk(b, "expires_in_ms")
	return appendInt(b, ceilMS(res.ExpiresIn))
}

// settle answers WEIR.SETTLE reservation actual.
func (c *conn) settle(ctx context.Context, args [][]byte, b []byte) []byte {
	if len(args) != 3 {
		return arity(b, "weir.settle")
	}
	if len(args[1]) == 0 || len(args[1]) > maxReservationID {
		return appendError(b, "ERR reservation '"+printable(args[1], maxReservationID)+"' is not an id WEIR.RESERVE answers (1 to 64 bytes)")
	}
	actual, err := intArg(args[2], "actual", 0, math.MaxInt64/2)
	if err != nil {
		return appendError(b, err.Error())
	}
	res, err := c.s.b.Settle(ctx, string(args[1]), actual)
	if err != nil {
		return appendError(b, errorText(err))
	}
	return c.decision(b, res, 0)
}

// decision appends a decision as a map (RESP3) or a flat array of names
// and values (RESP2), with room for extra more pairs after it.
func (c *conn) decision(b []byte, r CheckResult, extra int) []byte {
	allowed, retry := int64(1), int64(0)
	if !r.Allowed {
		allowed, retry = 0, ceilMS(r.RetryAfter)
	}
	b = appendMap(b, 5+extra, c.proto)
	for _, f := range [...]struct {
		name string
		v    int64
	}{{"allowed", allowed}, {"limit", r.Limit}, {"remaining", max(r.Remaining, 0)}, {"retry_after_ms", retry}, {"reset_after_ms", ceilMS(r.ResetAfter)}} {
		b = appendBulk(b, f.name)
		b = appendInt(b, f.v)
	}
	return b
}

// errorText makes a backend error a RESP error: ERR and its text, unless
// it starts with an error code already.
func errorText(err error) string {
	s := err.Error()
	if i := strings.IndexByte(s, ' '); i > 0 && s[:i] == strings.ToUpper(s[:i]) && !strings.ContainsAny(s[:i], ":.,") {
		return s
	}
	return "ERR " + s
}

// throttleQuery is a CL.THROTTLE or GCRA request.
type throttleQuery struct {
	key    string
	limit  weir.Limit
	burst  int64 // the reply's limit: max_burst + 1
	tokens int64
}

// throttle decides q and answers redis-cell's five integers.
func (c *conn) throttle(ctx context.Context, command string, q throttleQuery, b []byte) []byte {
	n := q.tokens
	over := n > q.burst // more than a burst can ever admit: limited, never retry
	if over {
		n = 0
	}
	res, err := c.s.b.Take(ctx, command, q.key, q.limit, n)
	if err != nil {
		if errors.Is(err, weir.ErrInvalidLimit) || errors.Is(err, weir.ErrInvalidCost) {
			return appendError(b, "ERR "+strings.TrimPrefix(err.Error(), "weir: "))
		}
		return appendError(b, "ERR the store failed: "+strings.TrimPrefix(err.Error(), "weir: "))
	}
	limited, retry := int64(0), int64(-1)
	switch {
	case over:
		limited = 1
	case n > 0 && !res.Allowed:
		limited, retry = 1, ceilSeconds(res.RetryAfter)
	}
	return appendInts(b, limited, q.burst, max(res.Remaining, 0), retry, ceilSeconds(res.ResetAfter))
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

func ceilMS(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// maxPeriodSeconds is the longest period CL.THROTTLE and GCRA take: a
// year, far past any rate limit and far from overflowing.
const maxPeriodSeconds = 366 * 24 * 3600

// maxBurst is the largest max_burst: larger ones are refused rather than
// overflowing the store's arithmetic.
const maxBurst = 1 << 40

// parseThrottle reads CL.THROTTLE key max_burst count_per_period period
// [quantity].
func parseThrottle(args [][]byte) (throttleQuery, error) {
	if len(args) != 5 && len(args) != 6 {
		return throttleQuery{}, errors.New("ERR wrong number of arguments for 'cl.throttle' command")
	}
	burst, err := intArg(args[2], "max_burst", 0, maxBurst)
	if err != nil {
		return throttleQuery{}, err
	}
	count, err := intArg(args[3], "count_per_period", 1, maxBurst)
	if err != nil {
		return throttleQuery{}, err
	}
	period, err := intArg(args[4], "period", 1, maxPeriodSeconds)
	if err != nil {
		return throttleQuery{}, err
	}
	qty := int64(1)
	if len(args) == 6 {
		if qty, err = intArg(args[5], "quantity", 0, math.MaxInt64/2); err != nil {
			return throttleQuery{}, err
		}
	}
	return query(args[1], burst, count, time.Duration(period)*time.Second, qty), nil
}

// parseGCRA reads GCRA key max_burst tokens_per_period period [TOKENS n],
// with the checks and errors of Redis: period is seconds, fractions
// allowed; TOKENS is at least 1.
func parseGCRA(args [][]byte) (throttleQuery, error) {
	if len(args) < 5 {
		return throttleQuery{}, errors.New("ERR wrong number of arguments for 'gcra' command")
	}
	if len(args) > 7 {
		return throttleQuery{}, errors.New("ERR wrong number of arguments for 'gcra' command")
	}
	burst, err := intArg(args[2], "max_burst", 0, maxBurst)
	if err != nil {
		return throttleQuery{}, err
	}
	rate, err := intArg(args[3], "tokens_per_period", 1, maxBurst)
	if err != nil {
		return throttleQuery{}, err
	}
	p, err := strconv.ParseFloat(string(args[4]), 64)
	if err != nil || math.IsNaN(p) || math.IsInf(p, 0) {
		return throttleQuery{}, errors.New("ERR value is not a valid float")
	}
	if p <= 0 {
		return throttleQuery{}, errors.New("ERR period must be > 0")
	}
	if p > maxPeriodSeconds {
		return throttleQuery{}, errors.New("ERR period must be at most a year (31622400 seconds)")
	}
	period := time.Duration(math.Round(p*1e6)) * time.Microsecond
	if period <= 0 {
		return throttleQuery{}, errors.New("ERR period must be at least a microsecond")
	}
	tokens := int64(1)
	if len(args) >= 6 {
		if !strings.EqualFold(string(args[5]), "TOKENS") {
			return throttleQuery{}, errors.New("ERR syntax error")
		}
		if len(args) == 6 {
			return throttleQuery{}, errors.New("ERR Missing TOKENS value")
		}
		if tokens, err = intArg(args[6], "TOKENS", 1, math.MaxInt64/2); err != nil {
			return throttleQuery{}, err
		}
	}
	return query(args[1], burst, rate, period, tokens), nil
}

// query maps redis-cell's parameters onto weir's GCRA: max_burst + 1
// events at once (the bucket's capacity, Burst), refilled at rate events
// per period.
func query(key []byte, burst, rate int64, period time.Duration, tokens int64) throttleQuery {
	return throttleQuery{
		key:    string(key),
		limit:  weir.Limit{Algorithm: weir.GCRA, Rate: rate, Period: period, Burst: burst + 1},
		burst:  burst + 1,
		tokens: tokens,
	}
}

// intArg parses an integer argument in lo..hi.
func intArg(b []byte, name string, lo, hi int64) (int64, error) {
	v, ok := parseInt(b)
	if !ok {
		return 0, errors.New("ERR " + name + " is not an integer or out of range")
	}
	if v < lo || v > hi {
		return 0, errors.New("ERR " + name + " is out of range: it must be from " + strconv.FormatInt(lo, 10) + " to " + strconv.FormatInt(hi, 10))
	}
	return v, nil
}
