package memstore

import (
	"testing"

	"github.com/weir-dev/weir/storetest"
)

func TestOverrides(t *testing.T) {
	storetest.RunOverrides(t, func(t *testing.T) storetest.Harness {
		clock := storetest.NewClock(storetest.Epoch)
		return storetest.Harness{Store: New(WithClock(clock.Now)), Clock: clock}
	})
}
