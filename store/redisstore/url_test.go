package redisstore

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Config
	}{
		{"redis://127.0.0.1:6380", Config{Addrs: []string{"127.0.0.1:6380"}}},
		{"redis://127.0.0.1:6380/", Config{Addrs: []string{"127.0.0.1:6380"}}},
		{"redis://localhost/3", Config{Addrs: []string{"localhost:6379"}, DB: 3}},
		{"redis://u:p%40ss@h:1/2", Config{Addrs: []string{"h:1"}, Username: "u", Password: "p@ss", DB: 2}},
		{"redis://:secret@h:1", Config{Addrs: []string{"h:1"}, Password: "secret"}},
		{"redis://secret@h:1", Config{Addrs: []string{"h:1"}, Password: "secret"}},
		{"redis://[::1]:7000", Config{Addrs: []string{"[::1]:7000"}}},
		{"redis+sentinel://s1:26379,s2:26380/mymaster", Config{Addrs: []string{"s1:26379", "s2:26380"}, MasterName: "mymaster"}},
		{"redis+sentinel://u:p@s1,s2/mymaster/4", Config{Addrs: []string{"s1:26379", "s2:26379"}, MasterName: "mymaster", Username: "u", Password: "p", DB: 4}},
		{"10.0.0.1:7000,10.0.0.2:7001,10.0.0.3:7002", Config{Addrs: []string{"10.0.0.1:7000", "10.0.0.2:7001", "10.0.0.3:7002"}}},
		{"127.0.0.1:6390", Config{Addrs: []string{"127.0.0.1:6390"}}},
		// A cluster with a password.
		{"redis://:pw@n1:7000,n2:7001,n3", Config{Addrs: []string{"n1:7000", "n2:7001", "n3:6379"}, Password: "pw"}},
		{"redis://n1:7000,n2:7001/0", Config{Addrs: []string{"n1:7000", "n2:7001"}}},
	} {
		got, err := ParseURL(tc.in)
		if err != nil {
			t.Errorf("ParseURL(%q): %v", tc.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseURL(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}

	tlsCfg, err := ParseURL("rediss://u:p@cache.example.com:6380/1")
	if err != nil || tlsCfg.TLS == nil || tlsCfg.TLS.ServerName != "cache.example.com" || tlsCfg.DB != 1 || tlsCfg.Addrs[0] != "cache.example.com:6380" {
		t.Errorf("rediss: %+v %v", tlsCfg, err)
	}
	// A cluster over TLS: each connection checks the name it dialled.
	tlsCfg, err = ParseURL("rediss://:pw@n1.example.com:7000,n2.example.com:7001")
	if err != nil || tlsCfg.TLS == nil || tlsCfg.TLS.ServerName != "" || len(tlsCfg.Addrs) != 2 || tlsCfg.Password != "pw" {
		t.Errorf("rediss cluster: %+v %v", tlsCfg, err)
	}

	for _, bad := range []string{
		"", " ", "http://h:1", "redis://", "redis://h:1/x", "redis://h:1/-1", "redis://h:1/1/2",
		"redis://h:99999", "redis://h:0", "redis://h:port", "redis://a:1,b:2/3", "redis://a:1,,b:2", "redis://h:1?db=2",
		"redis+sentinel://s1:1", "redis+sentinel://s1:1/", "h1", "h1:1,,h2:2", "h1:1,h2",
	} {
		_, err := ParseURL(bad)
		if err == nil {
			t.Errorf("ParseURL(%q) succeeded", bad)
		} else if !strings.Contains(err.Error(), `"`+bad+`"`) {
			t.Errorf("ParseURL(%q): error %q does not quote the input", bad, err)
		}
	}
	// Passwords never reach an error message.
	for bad, quoted := range map[string]string{
		"redis://u:s3cret@h:1/x":      "redis://u:xxxxx@h:1/x",
		"redis://s3cret@h:1/x":        "redis://xxxxx@h:1/x",
		"redis://u:%zz@h:1":           "redis://u:xxxxx@h:1",
		"redis+sentinel://u:s3cret@h": "redis+sentinel://u:xxxxx@h",
		"redis://u:s3cret?x@h:1":      "redis://u:xxxxx@h:1",
	} {
		_, err := ParseURL(bad)
		if err == nil || strings.Contains(err.Error(), "s3cret") || strings.Contains(err.Error(), "%zz") || !strings.Contains(err.Error(), `"`+quoted+`"`) {
			t.Errorf("ParseURL(%q): error %v, want the input quoted as %q", bad, err, quoted)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "no address"},
		{Config{Addrs: []string{"localhost"}}, `"localhost"`},
		{Config{Addrs: []string{"h:1"}, Prefix: "a{b"}, `"a{b"`},
		{Config{Addrs: []string{"h:1"}, Timeout: -time.Second}, "-1s"},
		{Config{Addrs: []string{"h:1"}, DB: -2}, "-2"},
		{Config{Addrs: []string{"h:1", "h:2"}, DB: 3}, "database 3"},
		{Config{Addrs: []string{"h:1"}, MaxBatch: -1}, "batch size -1"},
		{Config{Addrs: []string{"h:1"}, MaxBatch: 1001}, "batch size 1001"},
		{Config{Addrs: []string{"h:1"}, MaxInFlight: -3}, "-3"},
	} {
		if _, err := New(context.Background(), tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v): %v, want an error naming %s", tc.cfg, err, tc.want)
		}
	}
}
