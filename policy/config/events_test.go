package config

import (
	"slices"
	"strings"
	"testing"
)

func TestEventsConfig(t *testing.T) {
	cfg, err := Parse([]byte(`events:
  webhook: https://hooks.example.com/weir
  secret_env: WEIR_WEBHOOK_SECRET
  thresholds: [80%, 0.95, 1.0]
rules:
  - name: api
    limit: 100/m
    events: true
  - name: login
    limit: 5/m
    events:
      thresholds: [0.5, 1]
      webhook: https://other.example.com/x
  - name: plain
    limit: 5/m
`), "weir.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.EventWebhook != "https://hooks.example.com/weir" || cfg.EventSecretEnv != "WEIR_WEBHOOK_SECRET" || !slices.Equal(cfg.EventThresholds, []float64{0.8, 0.95, 1}) {
		t.Fatalf("events section read as %q %q %v", cfg.EventWebhook, cfg.EventSecretEnv, cfg.EventThresholds)
	}
	r := cfg.Rules
	if !r[0].Events || r[0].EventThresholds != nil || !r[1].Events || !slices.Equal(r[1].EventThresholds, []float64{0.5, 1}) || r[1].EventWebhook != "https://other.example.com/x" || r[2].Events {
		t.Fatalf("rules' events read as %+v", r)
	}
}

func TestEventsConfigErrors(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"rules:\n  - name: a\n    limit: 5/m\n    events:\n      thresholds: [0.5, 0.4]\n", "weir.yaml:5:"},
		{"rules:\n  - name: a\n    limit: 5/m\n    events:\n      thresholds: [0.5, 0.4]\n", "ascend"},
		{"rules:\n  - name: a\n    limit: 5/m\n    events:\n      thresholds: [150%]\n", "150%"},
		{"rules:\n  - name: a\n    limit: 5/m\n    events:\n      thresholds: [0]\n", "weir.yaml:5:"},
		{"events:\n  secret_env: S\nrules:\n  - name: a\n    limit: 5/m\n    events:\n      webhook: ftp://x\n", "weir.yaml:7:"},
		{"events:\n  webhook: https://u:hunter2@h.example.com/\nrules: []\n", "secret_env"},
		{"events:\n  webhook: nope://u:hunter2@h/\n  secret_env: S\nrules: []\n", "weir.yaml:2:"},
		{"events:\n  secret_env: S\n  secret_file: /f\nrules: []\n", "not both"},
		{"events:\n  thresholds: [1, 2, 3]\nrules: []\n", "weir.yaml:2:"},
		{"events:\n  bogus: 1\nrules: []\n", "bogus"},
		{"rules:\n  - name: a\n    limit: 5/m\n    events: maybe\n", "weir.yaml:4:"},
	} {
		_, err := Parse([]byte(c.yaml), "weir.yaml")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.yaml, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: the error shows the URL's password: %v", c.yaml, err)
		}
	}
}
