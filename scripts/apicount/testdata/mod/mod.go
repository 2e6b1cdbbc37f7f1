// Package mod is apicount's test input: 7 exported identifiers.
package mod

// Exported names: T, T.M, F, V, C1, C2, I.
type T struct {
	Field  int // a field: counted only with -fields
	hidden int
}

func (T) M()  {}
func (T) m()  {}
func (*t) N() {} // a method of an unexported type
func F()      {}
func f()      {}

type t struct{}
type I interface{ Method() }

var V, v = 1, 2

const (
	C1 = iota
	C2
	c3
)
