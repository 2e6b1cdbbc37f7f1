// Package waitctx holds the one wait that weir's middleware packages share.
package waitctx

import (
	"context"
	"time"
)

// Sleep waits for d, or until ctx is done, and then returns ctx's error.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
