// Package sub has 2 exported identifiers.
package sub

type S int

func (S) String() string { return "" }
