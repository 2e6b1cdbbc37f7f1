// Package deploy holds the tests of weir's deployment files: the systemd
// unit (systemd/, in `make test`), and, under the fleet build tag (`make
// test-fleet`), the container image (image/) and the Compose demo
// (compose/), run on this machine's Docker. It has no code of its own.
package deploy
