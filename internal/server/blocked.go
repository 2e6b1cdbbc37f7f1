package server

import (
	"context"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/weir-dev/weir/internal/keys"
)

// BlockedEntry is one identity held in a rule's penalty box.
type BlockedEntry struct {
	Rule           string `json:"rule"`
	Identity       string `json:"identity"`
	BlockedUntilMS int64  `json:"blocked_until_ms"`
}

// blockKey names a penalty-box entry.
type blockKey struct{ rule, identity string }

// member is the entry's member in the Redis ZSET: rule NUL identity.
func (k blockKey) member() string { return k.rule + "\x00" + k.identity }

// blockedIndex remembers which identities a penalty box holds, so that
// GET /v1/blocked can list them without scanning the store. Decisions that
// come back with Result.BlockedUntil set are recorded in a bounded
// in-process map and, with Redis, in the ZSET weir:index:blocked (member
// rule+"\x00"+identity, score blocked_until in ms) so that every instance
// lists the whole fleet's penalty box. Redis writes are best-effort and
// leave the request path at once: they go through a small queue that a
// background writer drains in pipelines; when the queue is full an entry
// is dropped, never waited for. Expired entries are trimmed on every write
// batch and every read.
//
// An identity longer than keys.MaxIdentityLen is kept in the form
// keys.ShortIdentity gives it ("~" and its SHA-256, 44 bytes), which the
// admin calls accept, so that no entry is larger than a rule name and 64
// bytes. Both sets are bounded: the map holds at most max entries and the
// ZSET at most rmax, each dropping the entries that expire soonest.
type blockedIndex struct {
	mu   sync.Mutex
	m    map[blockKey]int64 // blocked until, Unix ms
	max  int
	rmax int64 // the most members the Redis ZSET keeps

	rdb   rueidis.Client // nil without Redis
	key   string         // the ZSET
	queue chan BlockedEntry
	log   *slog.Logger
	now   func() time.Time
}

// maxBlockedLocal bounds the in-process index.
const maxBlockedLocal = 10000

// maxBlockedRedis bounds the fleet's index in Redis.
const maxBlockedRedis = 100000

// maxBlockedList bounds what GET /v1/blocked returns.
const maxBlockedList = 1000

func newBlockedIndex(rdb rueidis.Client, key string, log *slog.Logger, now func() time.Time) *blockedIndex {
	b := &blockedIndex{m: make(map[blockKey]int64), max: maxBlockedLocal, rmax: maxBlockedRedis, rdb: rdb, key: key, log: log, now: now}
	if rdb != nil {
		b.queue = make(chan BlockedEntry, 1024)
	}
	return b
}

// record notes that rule's penalty box holds identity until until. It never
// blocks: the Redis write, if any, is queued.
func (b *blockedIndex) record(rule, identity string, until time.Time) {
	ms := until.UnixMilli()
	identity = keys.ShortIdentity(identity)
	k := blockKey{rule, identity}
	b.mu.Lock()
	if b.m[k] == ms {
		b.mu.Unlock()
		return // known already: a repeated rejection inside the block
	}
	if _, ok := b.m[k]; !ok && len(b.m) >= b.max {
		b.evictLocked(b.now().UnixMilli())
	}
	b.m[k] = ms
	b.mu.Unlock()
	if b.queue != nil {
		select {
		case b.queue <- BlockedEntry{rule, identity, ms}:
		default: // best-effort: the writer is behind
		}
	}
}

// evictLocked drops expired entries and, if still full, the entry that
// expires soonest. b.mu must be held.
func (b *blockedIndex) evictLocked(nowMS int64) {
	var victim blockKey
	soonest := int64(1<<63 - 1)
	for k, until := range b.m {
		if until <= nowMS {
			delete(b.m, k)
			continue
		}
		if until < soonest {
			victim, soonest = k, until
		}
	}
	if len(b.m) >= b.max {
		delete(b.m, victim)
	}
}

// run writes queued entries to Redis until ctx is done.
func (b *blockedIndex) run(ctx context.Context) {
	if b.rdb == nil {
		return
	}
	fl := &failLog{
		warn: "penalty-box index: writing to Redis failed; the fleet list may miss entries",
		back: "penalty-box index: writing to Redis works again",
	}
	for {
		var batch []BlockedEntry
		select {
		case <-ctx.Done():
			return
		case e := <-b.queue:
			batch = append(batch, e)
		}
	drain:
		for len(batch) < 256 {
			select {
			case e := <-b.queue:
				batch = append(batch, e)
			default:
				break drain
			}
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := b.write(wctx, batch); err == nil {
			fl.ok(b.log, time.Now())
		} else if ctx.Err() == nil {
			fl.fail(b.log, time.Now(), err)
		}
		cancel()
	}
}

// write adds batch to the Redis ZSET in one pipeline, which then trims it
// to the rmax members released last and drops the expired ones.
func (b *blockedIndex) write(ctx context.Context, batch []BlockedEntry) error {
	cmds := make(rueidis.Commands, 0, len(batch)+2)
	for _, e := range batch {
		cmds = append(cmds, b.rdb.B().Zadd().Key(b.key).ScoreMember().
			ScoreMember(float64(e.BlockedUntilMS), blockKey{e.Rule, e.Identity}.member()).Build())
	}
	// Ranks run from the lowest score, the soonest release.
	cmds = append(cmds, b.rdb.B().Zremrangebyrank().Key(b.key).Start(0).Stop(-b.rmax-1).Build(), b.trimCmd())
	for _, r := range b.rdb.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}

func (b *blockedIndex) trimCmd() rueidis.Completed {
	return b.rdb.B().Zremrangebyscore().Key(b.key).Min("-inf").
		Max(strconv.FormatInt(b.now().UnixMilli(), 10)).Build()
}

// list returns the identities held now, soonest release first: the whole
// fleet's from Redis when there is one (falling back to this instance's
// on a Redis error), this instance's otherwise.
func (b *blockedIndex) list(ctx context.Context) ([]BlockedEntry, error) {
	nowMS := b.now().UnixMilli()
	if b.rdb != nil {
		out, err := b.listRedis(ctx, nowMS)
		if err == nil {
			return out, nil
		}
		local := b.listLocal(nowMS)
		return local, err
	}
	return b.listLocal(nowMS), nil
}

func (b *blockedIndex) listLocal(nowMS int64) []BlockedEntry {
	b.mu.Lock()
	out := make([]BlockedEntry, 0, len(b.m))
	for k, until := range b.m {
		if until <= nowMS {
			delete(b.m, k)
			continue
		}
		out = append(out, BlockedEntry{k.rule, k.identity, until})
	}
	b.mu.Unlock()
	sortBlocked(out)
	if len(out) > maxBlockedList {
		out = out[:maxBlockedList]
	}
	return out
}

func (b *blockedIndex) listRedis(ctx context.Context, nowMS int64) ([]BlockedEntry, error) {
	now := strconv.FormatInt(nowMS, 10)
	res := b.rdb.DoMulti(ctx,
		b.trimCmd(),
		b.rdb.B().Zrange().Key(b.key).Min("("+now).Max("+inf").Byscore().
			Limit(0, maxBlockedList).Withscores().Build())
	zs, err := res[1].AsZScores()
	if err != nil {
		if rueidis.IsRedisNil(err) {
			return []BlockedEntry{}, nil
		}
		return nil, err
	}
	out := make([]BlockedEntry, 0, len(zs))
	for _, z := range zs {
		rule, id, ok := strings.Cut(z.Member, "\x00")
		if !ok {
			continue
		}
		out = append(out, BlockedEntry{rule, id, int64(z.Score)})
	}
	sortBlocked(out)
	return out, nil
}

func sortBlocked(es []BlockedEntry) {
	sort.Slice(es, func(i, j int) bool {
		if es[i].BlockedUntilMS != es[j].BlockedUntilMS {
			return es[i].BlockedUntilMS < es[j].BlockedUntilMS
		}
		if es[i].Rule != es[j].Rule {
			return es[i].Rule < es[j].Rule
		}
		return es[i].Identity < es[j].Identity
	})
}

// remove forgets rule's entry for identity, here and in Redis. identity
// may be the identity or the form keys.ShortIdentity gives it.
func (b *blockedIndex) remove(ctx context.Context, rule, identity string) error {
	k := blockKey{rule, keys.ShortIdentity(identity)}
	b.mu.Lock()
	delete(b.m, k)
	b.mu.Unlock()
	if b.rdb == nil {
		return nil
	}
	return b.rdb.Do(ctx, b.rdb.B().Zrem().Key(b.key).Member(k.member()).Build()).Error()
}
