package denycache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"
)

// A Message is one invalidation: every entry of Key, or every entry.
type Message struct {
	Key string
	All bool
}

// A Bus carries invalidations between the instances that share a store.
type Bus interface {
	// Publish sends m to every subscribed instance, this one included.
	Publish(ctx context.Context, m Message) error
	// Run subscribes until ctx ends: it calls deliver with every message
	// that arrives, state(true) once every message published from then on
	// will arrive, and state(false) as soon as that may no longer hold
	// (the connection was lost), then subscribes again.
	Run(ctx context.Context, deliver func(Message), state func(up bool))
}

// DefaultChannel is the pub/sub channel of NewRedisBus when none is given,
// under the key prefix: "<prefix>:denycache".
const DefaultChannel = "denycache"

// RedisBus is a Bus over Redis pub/sub, on a standalone Redis, under
// Sentinel, or on a Redis Cluster (a plain channel, which every node
// forwards to the subscribers of all the others).
//
// It subscribes on a dedicated connection, which rueidis never
// re-subscribes by itself: a broken connection ends the subscription, the
// cache goes bypassed, and the bus subscribes again. On the same
// connection it subscribes to a probe channel of its own
// ("<channel>:probe:<random>"); it publishes a probe there and is up when
// the probe comes back. It then sends one every Heartbeat and goes down
// when none has come back for three, so that a connection that stalls
// without breaking cannot hide lost invalidations for long.
type RedisBus struct {
	client  rueidis.Client
	channel string
	beat    time.Duration
	log     *slog.Logger
}

// RedisBusConfig tunes NewRedisBus.
type RedisBusConfig struct {
	// Channel is the pub/sub channel; instances that share a store must
	// share it. Default "weir:denycache".
	Channel string
	// Heartbeat is how often the bus checks its subscription end to end
	// (default 1s).
	Heartbeat time.Duration
	// Logger receives the rare events (default slog.Default()).
	Logger *slog.Logger
}

// NewRedisBus returns a Bus over client (redisstore.Store.Client lends the
// store's).
func NewRedisBus(client rueidis.Client, cfg RedisBusConfig) *RedisBus {
	b := &RedisBus{client: client, channel: cfg.Channel, beat: cfg.Heartbeat, log: cfg.Logger}
	if b.channel == "" {
		b.channel = "weir:" + DefaultChannel
	}
	if b.beat <= 0 {
		b.beat = time.Second
	}
	if b.log == nil {
		b.log = slog.Default()
	}
	return b
}

// The wire form of a message: one letter, then the key.
const (
	tagKey = 'k'
	tagAll = 'a'
)

// Publish sends m on the channel.
func (b *RedisBus) Publish(ctx context.Context, m Message) error {
	var msg string
	if m.All {
		msg = string(tagAll)
	} else {
		msg = string(tagKey) + m.Key
	}
	return b.publish(ctx, msg)
}

func (b *RedisBus) publish(ctx context.Context, msg string) error {
	return b.client.Do(ctx, b.client.B().Publish().Channel(b.channel).Message(msg).Build()).Error()
}

// Run implements Bus.
func (b *RedisBus) Run(ctx context.Context, deliver func(Message), state func(bool)) {
	backoff := 100 * time.Millisecond
	failures := 0 // subscriptions failed in a row: the first is logged
	for ctx.Err() == nil {
		wasUp := b.session(ctx, deliver, state, &failures)
		if ctx.Err() != nil {
			return
		}
		state(false)
		if wasUp {
			backoff = 100 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// conn picks the client to subscribe on: on a cluster one node's (a
// dedicated connection needs a node, and a plain channel reaches them all).
func (b *RedisBus) conn() rueidis.Client {
	if b.client.Mode() != rueidis.ClientModeCluster {
		return b.client
	}
	for _, c := range b.client.Nodes() { // map order: a random node
		return c
	}
	return b.client
}

// session subscribes once and serves until the subscription ends or ctx
// does; it reports whether the bus was up. failures counts the failed
// subscriptions in a row: only the first of a run is logged, and the
// subscription that ends the run logs how many were not.
func (b *RedisBus) session(ctx context.Context, deliver func(Message), state func(bool), failures *int) (wasUp bool) {
	dc, release := b.conn().Dedicate()
	defer release()
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	// Probes go to a channel of this session's own, on the same
	// connection, so that a fleet's heartbeats do not fan out to everyone.
	probes := b.channel + ":probe:" + hex.EncodeToString(nonce[:])

	var mu sync.Mutex
	var lastBack time.Time // when a probe of ours last came back
	back := make(chan struct{}, 1)
	broken := dc.SetPubSubHooks(rueidis.PubSubHooks{
		OnMessage: func(m rueidis.PubSubMessage) {
			switch msg := m.Message; {
			case m.Channel == probes:
				mu.Lock()
				lastBack = time.Now()
				mu.Unlock()
				select {
				case back <- struct{}{}:
				default:
				}
			case m.Channel != b.channel:
			case len(msg) > 0 && msg[0] == tagKey:
				deliver(Message{Key: msg[1:]})
			case msg == string(tagAll):
				deliver(Message{All: true})
			}
		},
	})
	if err := dc.Do(ctx, dc.B().Subscribe().Channel(b.channel, probes).Build()).Error(); err != nil {
		if ctx.Err() == nil {
			if *failures == 0 {
				b.log.Warn("weir: deny cache: subscribing to its invalidation channel failed; retrying quietly", "err", err)
			}
			*failures++
		}
		return false
	}
	if *failures > 1 {
		b.log.Info("weir: deny cache: subscribed to its invalidation channel again", "failures_not_logged", *failures-1)
	}
	*failures = 0
	tick := time.NewTicker(b.beat)
	defer tick.Stop()
	seq := 0
	probe := func() {
		seq++
		pctx, cancel := context.WithTimeout(ctx, b.beat)
		defer cancel()
		_ = b.client.Do(pctx, b.client.B().Publish().Channel(probes).Message(strconv.Itoa(seq)).Build()).Error()
	}
	probe()
	started := time.Now()
	for {
		select {
		case <-ctx.Done():
			return wasUp
		case err := <-broken:
			if ctx.Err() == nil {
				b.log.Warn("weir: deny cache: its invalidation channel was lost; bypassing the cache until it is back", "err", err)
			}
			return wasUp
		case <-back:
			if !wasUp {
				wasUp = true
				state(true)
			}
		case now := <-tick.C:
			mu.Lock()
			last := lastBack
			mu.Unlock()
			if last.IsZero() {
				last = started
			}
			if now.Sub(last) > 3*b.beat {
				b.log.Warn("weir: deny cache: its invalidation channel stalled (a heartbeat did not come back); bypassing the cache", "after", now.Sub(last).String())
				return wasUp
			}
			probe()
		}
	}
}
