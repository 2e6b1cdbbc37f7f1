package main

import (
	"flag"

	"github.com/weir-dev/weir/internal/server"
)

// envoyServeFlags are weir serve's global settings of the Envoy service,
// envoyproxy/ratelimit's environment settings of the same names.
type envoyServeFlags struct {
	shadow, headers, merge, quota bool
}

// addEnvoyFlags defines the --envoy-* settings on fs.
func addEnvoyFlags(fs *flag.FlagSet, e *envoyServeFlags) {
	fs.BoolVar(&e.shadow, "envoy-shadow-mode", false, "Envoy calls are decided and counted, statuses and metrics report OVER_LIMIT, but the call's overall code is always OK (envoyproxy/ratelimit's SHADOW_MODE)")
	fs.BoolVar(&e.headers, "envoy-response-headers", false, "add RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset to Envoy responses, from the descriptor closest to its limit (LIMIT_RESPONSE_HEADERS_ENABLED)")
	fs.BoolVar(&e.merge, "envoy-merge-domains", false, "let several --envoy-config files define one domain, their descriptors merged; without it a repeated domain is refused (MERGE_DOMAIN_CONFIG)")
	fs.BoolVar(&e.quota, "envoy-quota-mode", false, "treat every Envoy descriptor as quota_mode: a call is OVER_LIMIT only when all its limited descriptors are (QUOTA_MODE)")
}

// option is the server option of the settings.
func (e *envoyServeFlags) option() server.Option {
	return server.WithEnvoySettings(server.EnvoySettings{
		ShadowMode: e.shadow, ResponseHeaders: e.headers, MergeDomains: e.merge, QuotaMode: e.quota,
	})
}
