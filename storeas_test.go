package weir_test

import (
	"testing"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/store/memstore"
)

// wrapper is a store wrapper that offers Unwrap, as the deny cache does.
type wrapper struct{ weir.Store }

func (w wrapper) Unwrap() weir.Store { return w.Store }

func TestStoreAs(t *testing.T) {
	ms := memstore.New()
	if got, ok := weir.StoreAs[*memstore.Store](wrapper{wrapper{ms}}); !ok || got != ms {
		t.Fatalf("through two wrappers: %v %v, want the memstore", got, ok)
	}
	if _, ok := weir.StoreAs[weir.ReservationStore](wrapper{ms}); !ok {
		t.Fatal("an interface the wrapped store implements was not found")
	}
	if _, ok := weir.StoreAs[interface{ Nope() }](wrapper{ms}); ok {
		t.Fatal("found an interface nothing implements")
	}
}
