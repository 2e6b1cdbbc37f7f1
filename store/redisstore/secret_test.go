package redisstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/internal/redistest"
	"github.com/weir-dev/weir/store/guard"
)

// secretIdentity stands for an API key counted by a rule.
const secretIdentity = "sk_live_4f8a9c2e7b1d6f3a"

// checkNoSecret fails when text holds the identity or the state key, and
// checks that it names the rule and the key's hash instead.
func checkNoSecret(t *testing.T, what, text, key string) {
	t.Helper()
	if strings.Contains(text, secretIdentity) {
		t.Errorf("%s reveals the identity: %s", what, text)
	}
	sum := sha256.Sum256([]byte(key))
	rule := `rule "api"`
	if what == "log" {
		rule = `rule \"api\"` // quoted again by the text handler
	}
	for _, want := range []string{rule, "key#" + hex.EncodeToString(sum[:8])} {
		if !strings.Contains(text, want) {
			t.Errorf("%s lacks %s: %s", what, want, text)
		}
	}
}

// TestStoreErrorsHideTheKey: a failing decision, reset or batch names the
// rule and a hash of the key, never the identity in it.
func TestStoreErrorsHideTheKey(t *testing.T) {
	srv := redistest.Standalone(t)
	ctx := context.Background()
	key := weir.Key("api", secretIdentity)
	l := weir.Limit{Algorithm: weir.GCRA, Rate: 10, Period: time.Minute}
	for _, coalesce := range []bool{true, false} {
		cfg := Config{Addrs: []string{srv.Addr}, Prefix: "hide" + map[bool]string{true: "c", false: "n"}[coalesce]}
		if !coalesce {
			cfg.MaxBatch = 1 // one script call per decision
		}
		s := newTestStore(t, cfg)
		// A key of the wrong type: every script call on it fails.
		if _, err := srv.Do("LPUSH", s.names(key, "gcra").state, "x"); err != nil {
			t.Fatal(err)
		}
		_, err := s.Take(ctx, key, l, 1)
		if err == nil || !errors.Is(err, weir.ErrStore) {
			t.Fatalf("coalesce=%v: Take on a list: err %v, want a store error", coalesce, err)
		}
		checkNoSecret(t, "Take error", err.Error(), key)

		res := make([]weir.Result, 2)
		err = s.Do(ctx, []weir.Request{{Key: key, Limit: l, N: 1}, {Key: weir.Key("api", "other"), Limit: l, N: 1}}, res)
		if err == nil {
			t.Fatalf("coalesce=%v: TakeAll on a list: no error", coalesce)
		}
		checkNoSecret(t, "TakeAll error", err.Error(), key)
	}
	if got := keyRef("no-rule-part-" + secretIdentity); strings.Contains(got, secretIdentity) || strings.Contains(got, "rule") {
		t.Errorf("keyRef of a key without a rule part: %s", got)
	}
}

// TestStoreFailureLogHidesTheKey: what the guard logs about a store that
// is down carries no identity.
func TestStoreFailureLogHidesTheKey(t *testing.T) {
	srv := redistest.Standalone(t)
	s := newTestStore(t, Config{Addrs: []string{srv.Addr}, Timeout: time.Second})
	var buf bytes.Buffer
	g := guard.New(s, guard.Config{Timeout: time.Second, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	key := weir.Key("api", secretIdentity)
	l := weir.Limit{Algorithm: weir.TokenBucket, Rate: 10, Period: time.Minute}
	if _, err := g.Take(context.Background(), key, l, 1); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	_, err := g.Take(context.Background(), key, l, 1)
	if err == nil {
		t.Fatal("Take with Redis stopped: no error")
	}
	checkNoSecret(t, "Take error", err.Error(), key)
	if err := weir.NewLimiter(s).Reset(context.Background(), key, l); err == nil {
		t.Fatal("Reset with Redis stopped: no error")
	} else {
		checkNoSecret(t, "Reset error", err.Error(), key)
	}
	out := buf.String()
	if !strings.Contains(out, "store failing") {
		t.Fatalf("the guard logged no store failure:\n%s", out)
	}
	checkNoSecret(t, "log", out, key)
}
