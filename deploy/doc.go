// Package deploy holds the tests of weir's deployment files: the systemd
// unit (systemd/, in `make test`), and, under the fleet build tag (`make
// test-fleet`), the container image (image/), the Compose demo (compose/)
// and faults across containers (a weir instance cut off from Redis, a
// Sentinel failover, a split brain, a rolling restart behind nginx), run on
// this machine's Docker. It has no code of its own.
package deploy
