// Package bench holds side-by-side benchmarks of weir against peer rate
// limiters. It is its own module so that the peers never become
// dependencies of weir itself.
package bench
