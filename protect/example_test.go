package protect_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/weir-dev/weir/protect"
)

// A handler behind an adaptive concurrency limit that keeps a fifth of
// it for critical requests, and an outbound client whose breaker opens
// when half the calls to a dependency fail.
func Example() {
	api, err := protect.New(protect.Config{
		Name: "api", Adaptive: true, MaxConcurrency: 1000, Reserve: 0.2,
	})
	if err != nil {
		panic(err)
	}
	handler := api.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}), protect.HeaderPriority("X-Priority"))
	_ = handler

	payments, err := protect.New(protect.Config{
		Name:    "payments",
		Breaker: &protect.BreakerConfig{ErrorRatio: 0.5, MinRequests: 20, Window: 10 * time.Second, OpenFor: 10 * time.Second},
	})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: &protect.Transport{Rule: payments}}
	_ = client
	fmt.Println(api.Stats().Limit, payments.Stats().State)
	// Output: 20 closed
}
