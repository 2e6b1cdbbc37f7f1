package replay

import (
	"reflect"
	"testing"
)

// fuzzFormat builds the format FuzzParseLine reads a line in, chosen by
// which: each of nginx, Envoy's default format, Envoy's JSON, Caddy, two
// jsonl mappings, and --format auto's detection from the line itself.
func fuzzFormat(which uint8, line string) (*format, error) {
	sample := []string{line}
	switch which % 7 {
	case 0:
		return nginxFormat(sample), nil
	case 1:
		return envoyFormat(), nil
	case 2:
		return envoyJSONFormat(sample), nil
	case 3:
		return caddyFormat(sample), nil
	case 4:
		return jsonlFormat(map[string]string{"time": "t", "ip": "c.ip", "method": "m", "uri": "u", "host": "h", "status": "s",
			"header:X-Api-Key": "k", "header:User-Agent": "ua"})
	case 5:
		return jsonlFormat(map[string]string{"time": "req.ts", "path": "req.path", "query": "req.q", "header:Referer": "req.ref"})
	}
	return detect(FormatAuto, sample, nil)
}

// FuzzParseLine feeds any line to the parser of every log format weir
// replay reads (which picks it) and checks: no panic; a line read has a
// time from 1970 to 9999, a method, a status from 0 to 999 and fields of
// bounded length, and reads the same again; a refusal is a short message.
func FuzzParseLine(f *testing.F) {
	seeds := []string{
		`203.0.113.9 - bob [23/Nov/2026:10:00:01 +0100] "GET /a/b?x=1 HTTP/1.1" 200 612 "https://ref.example/" "curl/8.5.0"`,
		`10.0.0.1 - - [23/Nov/2026:09:00:01 +0000] "POST /login HTTP/2.0" 401 0 "-" "Mozilla/5.0" "198.51.100.7, 10.0.0.9"`,
		`198.51.100.1 - - [31/Dec/1969:23:59:59 +0000] "GET / HTTP/1.1" 200 1 "-" "ua"`,
		`198.51.100.1 - - [23/Nov/2026:09:00:01 +0000] "\x16\x03\x01" 400 157 "-" "-"`,
		`[2026-11-23T09:00:01.250Z] "GET /api/v1/x HTTP/1.1" 200 - 0 15 3 2 "198.51.100.7,203.0.113.9" "curl/8.5.0" "1f2e" "api.example.com" "10.1.2.3:8080"`,
		`{"start_time":"2026-11-23T09:00:01.000Z","method":"GET","path":"/p","protocol":"HTTP/1.1","response_code":429,"x_forwarded_for":"-","user_agent":"ua","request_id":"-","authority":"h.example","downstream_remote_address":"203.0.113.9:5555"}`,
		`{"level":"info","ts":1795424401.5,"logger":"http.log.access","msg":"handled request","request":{"remote_ip":"2001:db8::7","remote_port":"41342","proto":"HTTP/2.0","method":"GET","host":"shop.example","uri":"/cart?id=3","headers":{"User-Agent":["curl/8.5.0"],"X-Api-Key":["k1"],"Cookie":["REDACTED"]}},"duration":0.25,"status":200}`,
		`{"ts":"NaN","request":{"remote_ip":"198.51.100.1","method":"GET","uri":"/"}}`,
		`{"t":"2026-11-23T09:00:00.5Z","c":{"ip":"198.51.100.1"},"m":"post","u":"/x","h":"shop.example","s":"200","k":"k1","ua":"curl"}`,
		`{"t":1795424401000,"c":{"ip":"198.51.100.1"},"m":"GET","u":"/x"}`,
		`{"t":-1e20,"u":"/x"}`,
		`{"t":"23/Nov/2026:09:00:02 +0000","u":"/x","s":1e300}`,
		`{"req":{"ts":"Infinity","path":"/p","q":"a=1","ref":"https://r.example/"}}`,
		`{"req":{"ts":1795424401.000001,"path":"/p","q":"a=1","ref":"https://r.example/"}}`,
	}
	for _, s := range seeds {
		for which := uint8(0); which < 7; which++ {
			f.Add(which, s)
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, line string) {
		fm, err := fuzzFormat(which, line)
		if err != nil {
			return // auto detection refused the line, naming why
		}
		var rec Record
		if err := fm.parse(line, &rec); err != nil {
			if len(err.Error()) > 512 {
				t.Fatalf("a refusal of %d bytes: %.100q", len(err.Error()), err.Error())
			}
			return
		}
		if rec.Time < 0 || rec.Time > maxTime {
			t.Fatalf("time %d out of range", rec.Time)
		}
		if !validMethod(rec.Method) || rec.Status < 0 || rec.Status > 999 {
			t.Fatalf("method %q, status %d", rec.Method, rec.Status)
		}
		// Decoded JSON may turn a byte of invalid UTF-8 into 3; a few
		// bytes are added ("[" and "]:" around an IPv6 address, "?"
		// before a query, a default method and path).
		if n := fieldBytes(&rec); n > 3*len(line)+16 || len(rec.Extra) > len(line) {
			t.Fatalf("fields of %d bytes and %d headers from a line of %d", n, len(rec.Extra), len(line))
		}
		again, fresh := Record{}, Record{}
		if err := fm.parse(line, &again); err != nil || !reflect.DeepEqual(rec, again) {
			t.Fatalf("read again: %v\n%+v\n%+v", err, rec, again)
		}
		if fm2, err := fuzzFormat(which, line); err == nil {
			if err := fm2.parse(line, &fresh); err != nil || !reflect.DeepEqual(rec, fresh) {
				t.Fatalf("read by a new parser: %v\n%+v\n%+v", err, rec, fresh)
			}
		}
	})
}
