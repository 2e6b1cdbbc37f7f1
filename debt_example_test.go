package weir_test

import (
	"context"
	"fmt"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// Token budgets for an LLM API: reserve the request's max_tokens, settle
// with the tokens the response really used. A response that used more than
// remained puts the key into debt: nothing fits until it is paid back.
func ExampleLimiter_Reserve() {
	lim := weir.NewLimiter(memstore.New(memstore.WithClock(fixedClock)))
	budget := weir.PerMinute(weir.TokenBucket, 1000) // tokens per minute
	ctx := context.Background()
	key := weir.Key("llm", "sk-team-a")

	r, res, _ := lim.Reserve(ctx, key, budget, 500) // max_tokens
	fmt.Println("reserved:", res.Allowed, "remaining", res.Remaining)
	res, _ = r.Settle(ctx, 120) // usage.total_tokens
	fmt.Println("settled at 120: remaining", res.Remaining)

	// A streamed answer that ran long: billed in full, into debt.
	res, _ = lim.Debit(ctx, key, budget, 1500)
	fmt.Println("debit 1500: fitted", res.Allowed, "retry after", res.RetryAfter)
	_, err := r.Settle(ctx, 1)
	fmt.Println(err)
	// Output:
	// reserved: true remaining 500
	// settled at 120: remaining 880
	// debit 1500: fitted false retry after 37.26s
	// weir: reservation already settled
}
