// Package hidden is internal: not counted.
package hidden

func Hidden() {}
