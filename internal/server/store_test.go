package server

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/weir-dev/weir/internal/certtest"
	"github.com/weir-dev/weir/policy/config"
	"github.com/weir-dev/weir/store/redisstore"
)

// TestRedisConfigEveryField: weir.yaml's store.redis section (files,
// names of secrets) and redisstore.Config (what the store runs with)
// are two forms of one setting with one conversion, redisConfig. Every
// field of the file form must reach the store: a field added to one
// form and not carried over fails here.
func TestRedisConfigEveryField(t *testing.T) {
	pki := certtest.New(t)
	t.Setenv("WEIR_TEST_REDIS_PASSWORD", "from-env")
	linger := 3 * time.Millisecond
	type check struct {
		set  func(r *config.RedisConfig)
		want func(rc redisstore.Config) bool
	}
	checks := map[string]check{
		"Addrs": {func(r *config.RedisConfig) { r.Addrs = []string{"h1:1", "h2:2"} },
			func(rc redisstore.Config) bool { return slices.Equal(rc.Addrs, []string{"h1:1", "h2:2"}) }},
		"MasterName": {func(r *config.RedisConfig) { r.MasterName = "m" },
			func(rc redisstore.Config) bool { return rc.MasterName == "m" }},
		"Username": {func(r *config.RedisConfig) { r.Username = "u" },
			func(rc redisstore.Config) bool { return rc.Username == "u" }},
		"Password": {func(r *config.RedisConfig) { r.Password = "pw" },
			func(rc redisstore.Config) bool { return rc.Password == "pw" }},
		"PasswordEnv": {func(r *config.RedisConfig) { r.PasswordEnv = "WEIR_TEST_REDIS_PASSWORD" },
			func(rc redisstore.Config) bool { return rc.Password == "from-env" }},
		"TLS": {func(r *config.RedisConfig) { r.TLS = true },
			func(rc redisstore.Config) bool { return rc.TLS != nil && rc.TLS.RootCAs == nil }},
		"TLSCA": {func(r *config.RedisConfig) { r.TLSCA = pki.CA },
			func(rc redisstore.Config) bool { return rc.TLS != nil && rc.TLS.RootCAs != nil }},
		"TLSCert": {func(r *config.RedisConfig) { r.TLSCert, r.TLSKey = pki.ClientCert, pki.ClientKey },
			func(rc redisstore.Config) bool { return rc.TLS != nil && rc.TLS.GetClientCertificate != nil }},
		"TLSKey": {func(r *config.RedisConfig) { r.TLSCert, r.TLSKey = pki.ClientCert, pki.ClientKey },
			func(rc redisstore.Config) bool { return rc.TLS != nil && rc.TLS.GetClientCertificate != nil }},
		"TLSServerName": {func(r *config.RedisConfig) { r.TLS, r.TLSServerName = true, "redis.internal" },
			func(rc redisstore.Config) bool { return rc.TLS != nil && rc.TLS.ServerName == "redis.internal" }},
		"DB": {func(r *config.RedisConfig) { r.DB = 5 },
			func(rc redisstore.Config) bool { return rc.DB == 5 }},
		"MaxInFlight": {func(r *config.RedisConfig) { r.MaxInFlight = 7 },
			func(rc redisstore.Config) bool { return rc.MaxInFlight == 7 }},
		"MaxBatch": {func(r *config.RedisConfig) { r.MaxBatch = 9 },
			func(rc redisstore.Config) bool { return rc.MaxBatch == 9 }},
		"Linger": {func(r *config.RedisConfig) { r.Linger = &linger },
			func(rc redisstore.Config) bool { return rc.Linger == linger }},
		"Prefix": {func(r *config.RedisConfig) { r.Prefix = "blue" },
			func(rc redisstore.Config) bool { return rc.Prefix == "blue" }},
	}
	typ := reflect.TypeFor[config.RedisConfig]()
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		c, ok := checks[name]
		if !ok {
			t.Errorf("store.redis field %s has no check here: carry it over in redisConfig and add one", name)
			continue
		}
		sc := config.StoreConfig{Type: config.StoreRedis, Redis: config.RedisConfig{Addrs: []string{"a:1"}}}
		base, err := redisConfig(sc)
		if err != nil {
			t.Fatal(err)
		}
		if c.want(base) {
			t.Errorf("%s: the check already holds without the field set; it proves nothing", name)
		}
		c.set(&sc.Redis)
		rc, err := redisConfig(sc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !c.want(rc) {
			t.Errorf("store.redis %s did not reach redisstore.Config", name)
		}
	}
	if len(checks) != typ.NumField() {
		t.Errorf("%d checks for %d fields: a check names a field that is gone", len(checks), typ.NumField())
	}
	// The store-level timeout is the other setting the store takes.
	if rc, _ := redisConfig(config.StoreConfig{Timeout: 40 * time.Millisecond, Redis: config.RedisConfig{Addrs: []string{"a:1"}}}); rc.Timeout != 40*time.Millisecond {
		t.Errorf("store.timeout 40ms reached the store as %v", rc.Timeout)
	}
}
