package policy

import (
	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/guard"
)

// The store wrapper that protects a policy from a failing store lives in
// package guard (store/guard); these names forward to it, so that code
// written against policy's keeps compiling.

// Guard is guard.Guard.
//
// Deprecated: use guard.Guard.
type Guard = guard.Guard

// GuardConfig is guard.Config.
//
// Deprecated: use guard.Config.
type GuardConfig = guard.Config

// BreakerConfig is guard.BreakerConfig.
//
// Deprecated: use guard.BreakerConfig.
type BreakerConfig = guard.BreakerConfig

// BreakerState is guard.BreakerState.
//
// Deprecated: use guard.BreakerState.
type BreakerState = guard.BreakerState

// The breaker's states, as guard names them.
//
// Deprecated: use guard.BreakerClosed, guard.BreakerOpen and
// guard.BreakerHalfOpen.
const (
	BreakerClosed   = guard.BreakerClosed
	BreakerOpen     = guard.BreakerOpen
	BreakerHalfOpen = guard.BreakerHalfOpen
)

// ErrCircuitOpen is guard.ErrCircuitOpen.
//
// Deprecated: use guard.ErrCircuitOpen.
var ErrCircuitOpen = guard.ErrCircuitOpen

// DefaultTimeout is guard.DefaultTimeout, the deadline of a store call
// when store.timeout is not set.
const DefaultTimeout = guard.DefaultTimeout

// NewGuard is guard.New.
//
// Deprecated: use guard.New.
func NewGuard(store weir.Store, cfg GuardConfig) *Guard { return guard.New(store, cfg) }

// LocalLimit is guard.LocalLimit: the limit that on_error: local enforces
// in each of instances instances for l.
//
// Deprecated: use guard.LocalLimit.
func LocalLimit(l weir.Limit, instances int) weir.Limit { return guard.LocalLimit(l, instances) }
