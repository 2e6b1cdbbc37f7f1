package main

// Mozilla's CA roots, built in: rediss:// and OTLP over TLS then verify
// their peers in a container image that has no /etc/ssl (the image holds
// the binary alone). They apply only when the system has no roots of its
// own; a host's roots (SSL_CERT_FILE, /etc/ssl/certs) win.
import _ "golang.org/x/crypto/x509roots/fallback"
