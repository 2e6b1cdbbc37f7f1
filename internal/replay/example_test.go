package replay_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/weir-dev/weir/internal/replay"
	"github.com/weir-dev/weir/policy"
	"github.com/weir-dev/weir/policy/config"
)

// Replay three requests of an nginx log through a rule of 2 a minute.
func ExampleRun() {
	cfg, err := policy.Parse([]byte(`
rules:
  - name: per-ip
    limit: 2/m
    algorithm: fixed_window
`), "weir.yaml")
	if err != nil {
		panic(err)
	}
	log := strings.Repeat(`203.0.113.7 - - [23/Nov/2026:09:00:01 +0000] "GET / HTTP/1.1" 200 512 "-" "curl/8.5.0"`+"\n", 3)
	reps, err := replay.Run(context.Background(), []replay.Input{{Name: "access.log", R: strings.NewReader(log)}}, []*config.Config{cfg}, replay.Options{})
	if err != nil {
		panic(err)
	}
	r := reps[0].Rules[0]
	fmt.Printf("%s: %d matched, %d limited, top %s (%d)\n", r.Name, r.Matched, r.Limited, r.Top[0].Identity, r.Top[0].Limited)
	// Output: per-ip: 3 matched, 1 limited, top 203.0.113.7 (1)
}
