package config_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/weir-dev/weir/policy/config"
)

// TestParseChecksSchema: Parse reports every problem of the store and
// server sections at its line, runs the extra checks with the same
// positions, and fills in the defaults of a valid file.
func TestParseChecksSchema(t *testing.T) {
	doc := "store:\n  type: redis\n  on_error: sometimes\nserver:\n  http: nowhere\nrules:\n  - name: a\n    limit: 1/s\n"
	var sawRules int
	extra := func(cfg *config.Config, rep config.Reporter) {
		sawRules = len(cfg.Rules)
		rep.Add("rules[0].limit", "extra problem")
	}
	_, err := config.Parse([]byte(doc), "w.yaml", extra)
	var ce *config.Error
	if !errors.As(err, &ce) {
		t.Fatalf("Parse: %v, want a *config.Error", err)
	}
	want := []string{
		`w.yaml:2:9: store.type redis needs store.redis.addrs`,
		`w.yaml:3:13: unknown on_error "sometimes" (want allow, deny or local)`,
		`w.yaml:5:9: http "nowhere" must be host:port or :port, such as :8080`,
		`w.yaml:8:12: extra problem`,
	}
	if got := ce.Lines(); !slices.Equal(got, want) {
		t.Errorf("problems:\n got %q\nwant %q", got, want)
	}
	if sawRules != 1 || ce.Empty() {
		t.Errorf("the extra check saw %d rules; Empty() = %v", sawRules, ce.Empty())
	}

	cfg, err := config.Parse([]byte("rules: []\n"), "w.yaml")
	if err != nil || cfg.Store.Type != config.StoreMemory || cfg.Store.OnError != config.OnErrorLocal {
		t.Fatalf("Parse of no rules: %+v, %v; want store memory, on_error local", cfg, err)
	}
	_, err = config.Parse([]byte("# nothing\n"), "w.yaml")
	if !errors.As(err, &ce) || !ce.Empty() {
		t.Fatalf("Parse of an empty file: %v, want an Empty *config.Error", err)
	}
}
