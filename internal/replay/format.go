package replay

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Formats that Options.Format names.
const (
	FormatAuto  = "auto"
	FormatNginx = "nginx"
	FormatEnvoy = "envoy"
	FormatCaddy = "caddy"
	FormatJSONL = "jsonl"
)

// Record is one request as a log line describes it.
type Record struct {
	// Line is the line's number in its input, from 1; Input the input's
	// index among the inputs.
	Line  int64
	Input int
	// Time is when the request was logged, in µs since the Unix epoch.
	Time int64
	// Addr is the peer address (an address, or host:port), "" when the
	// line has none.
	Addr string
	// Method, URI (the request target: path and query) and Host.
	Method, URI, Host string
	// Status is the response status, 0 when not logged.
	Status int
	// UA, Referer and XFF are the User-Agent, Referer and
	// X-Forwarded-For headers, "" when absent.
	UA, Referer, XFF string
	// Extra holds other headers, canonical names.
	Extra []Header
}

// Header is one logged request header.
type Header struct{ Name, Value string }

// recorded says what a format records of a request: what the rules can
// be evaluated on.
type recorded struct {
	ip, method, uri, host bool
	// headers lists the canonical names of the headers recorded; every
	// header when all is set, except those in redacted.
	headers  map[string]bool
	all      bool
	redacted map[string]bool
	// ipNote explains how the client address is read, when it is not the
	// plain peer address the proxy saw.
	ipNote string
}

// header reports whether the header named name (canonical) is recorded.
func (r *recorded) header(name string) bool {
	if r.all {
		return !r.redacted[name]
	}
	return r.headers[name]
}

// parser parses one line of a format into rec (whose Line and Input are
// set). It returns an error naming what is wrong.
type parser interface {
	parse(line string, rec *Record) error
}

// maxTime is the latest time a line may carry, in µs since the epoch: the
// end of the year 9999, the last that RFC 3339 and nginx's $time_local
// can write.
const maxTime = 253402300799999999

// checkTime refuses a time before 1970 or after 9999, naming it: no
// request was made then, and the algorithms' window arithmetic counts
// time from the epoch.
func checkTime(us int64) error {
	switch {
	case us < 0:
		return fmt.Errorf("time %s is before 1970", time.UnixMicro(us).UTC().Format(time.RFC3339Nano))
	case us > maxTime:
		return fmt.Errorf("time %s is after 9999", time.UnixMicro(us).UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// parse parses one line into rec in the format, and refuses a time out of
// range. A record whose fields are less than half its line is compacted:
// it holds at most twice the bytes of its fields (recBytes).
func (f *format) parse(line string, rec *Record) error {
	if err := f.p.parse(line, rec); err != nil {
		return err
	}
	if err := checkTime(rec.Time); err != nil {
		return err
	}
	if n := fieldBytes(rec); 2*n < len(line) {
		compact(rec, n)
	}
	return nil
}

// fieldBytes is the length of rec's strings.
func fieldBytes(rec *Record) int {
	n := len(rec.Addr) + len(rec.Method) + len(rec.URI) + len(rec.Host) + len(rec.UA) + len(rec.Referer) + len(rec.XFF)
	for _, h := range rec.Extra {
		n += len(h.Name) + len(h.Value)
	}
	return n
}

// recBytes bounds the memory rec holds beyond its own struct: its
// strings share its line, at most twice as long as they are (parse
// compacts the rest), or were decoded apart; a header costs its two
// string headers too.
func recBytes(rec *Record) int64 {
	return 2*int64(fieldBytes(rec)) + 32*int64(len(rec.Extra))
}

// compact copies rec's strings, n bytes, into one string of their own,
// so that rec no longer holds the line they were sliced from.
func compact(rec *Record, n int) {
	var b strings.Builder
	b.Grow(n)
	fields := [...]*string{&rec.Addr, &rec.Method, &rec.URI, &rec.Host, &rec.UA, &rec.Referer, &rec.XFF}
	for _, f := range fields {
		b.WriteString(*f)
	}
	for _, h := range rec.Extra {
		b.WriteString(h.Name)
		b.WriteString(h.Value)
	}
	all := b.String()
	take := func(f *string) {
		*f, all = all[:len(*f)], all[len(*f):]
	}
	for _, f := range fields {
		take(f)
	}
	extra := make([]Header, len(rec.Extra))
	for i, h := range rec.Extra {
		take(&h.Name)
		take(&h.Value)
		extra[i] = h
	}
	if rec.Extra != nil {
		rec.Extra = extra
	}
}

// format is a detected log format.
type format struct {
	name    string // as Report.Format shows it: "nginx combined", ...
	p       parser
	fields  recorded
	isJSONL bool
}

// detect picks the format of an input from its first lines. want is
// Options.Format; fields the jsonl field mapping.
func detect(want string, sample []string, fields map[string]string) (*format, error) {
	switch want {
	case "", FormatAuto:
	case FormatNginx, FormatEnvoy, FormatCaddy, FormatJSONL:
	default:
		return nil, fmt.Errorf("unknown --format %q (want auto, nginx, envoy, caddy or jsonl)", want)
	}
	if want == FormatJSONL || (len(fields) > 0 && (want == "" || want == FormatAuto)) {
		return jsonlFormat(fields)
	}
	var first string
	for _, l := range sample {
		if l = strings.TrimSpace(l); l != "" {
			first = l
			break
		}
	}
	if want == "" || want == FormatAuto {
		switch {
		case first == "":
			want = FormatNginx // nothing to read; any format reads it
		case strings.HasPrefix(first, "{"):
			var m map[string]any
			if err := json.Unmarshal([]byte(first), &m); err != nil {
				return nil, fmt.Errorf("--format auto: the first line looks like JSON but is not: %v", err)
			}
			if _, ok := m["request"].(map[string]any); ok {
				want = FormatCaddy
			} else if _, ok := m["start_time"]; ok {
				want = FormatEnvoy
			} else {
				return nil, fmt.Errorf("--format auto: a JSON line that is neither Caddy's access log nor Envoy's JSON format; use --format jsonl with --field time=FIELD,ip=FIELD,method=FIELD,uri=FIELD")
			}
		case strings.HasPrefix(first, "["):
			want = FormatEnvoy
		default:
			want = FormatNginx
		}
	}
	switch want {
	case FormatNginx:
		return nginxFormat(sample), nil
	case FormatEnvoy:
		if strings.HasPrefix(first, "{") {
			return envoyJSONFormat(sample), nil
		}
		return envoyFormat(), nil
	case FormatCaddy:
		return caddyFormat(sample), nil
	}
	return jsonlFormat(fields)
}

// --- nginx ---

// nginxParser reads nginx's combined format, and main, which adds
// "$http_x_forwarded_for":
//
//	$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent" ["$http_x_forwarded_for"]
type nginxParser struct{ tc timeCache }

func nginxFormat(sample []string) *format {
	f := &format{name: "nginx combined", p: &nginxParser{}}
	f.fields = recorded{ip: true, method: true, uri: true, headers: map[string]bool{"User-Agent": true, "Referer": true}}
	// main has a third quoted field after the status: X-Forwarded-For.
	var rec Record
	for _, l := range sample {
		if l == "" {
			continue
		}
		if (&nginxParser{}).parse(l, &rec) == nil && rec.XFF != "" || strings.Count(l, `"`) >= 8 {
			f.name = "nginx main"
			f.fields.headers["X-Forwarded-For"] = true
			break
		}
	}
	return f
}

func (p *nginxParser) parse(line string, rec *Record) error {
	sp := strings.IndexByte(line, ' ')
	if sp <= 0 {
		return fmt.Errorf("no remote address")
	}
	rec.Addr = line[:sp]
	rest := line[sp:]
	lb := strings.IndexByte(rest, '[')
	if lb < 0 {
		return fmt.Errorf("no [time]")
	}
	rb := strings.IndexByte(rest[lb:], ']')
	if rb < 0 {
		return fmt.Errorf("no [time]")
	}
	t, err := p.tc.parse(rest[lb+1:lb+rb], parseNginxTime)
	if err != nil {
		return err
	}
	rec.Time = t
	rest = rest[lb+rb+1:]
	req, rest, ok := quoted(rest)
	if !ok {
		return fmt.Errorf("no quoted request")
	}
	if err := splitRequest(req, rec); err != nil {
		return err
	}
	rest = strings.TrimLeft(rest, " ")
	sp = strings.IndexByte(rest, ' ')
	if sp < 0 {
		sp = len(rest)
	}
	rec.Status = statusText(rest[:sp])
	ref, rest, ok := quoted(rest)
	if !ok {
		return fmt.Errorf("no quoted referer")
	}
	ua, rest, ok := quoted(rest)
	if !ok {
		return fmt.Errorf("no quoted user agent")
	}
	xff, _, _ := quoted(rest)
	rec.Referer, rec.UA, rec.XFF = dash(ref), dash(ua), dash(xff)
	return nil
}

// quoted returns the first "..." field of s (nginx escapes a quote inside
// as \x22) and what follows it.
func quoted(s string) (field, rest string, ok bool) {
	i := strings.IndexByte(s, '"')
	if i < 0 {
		return "", s, false
	}
	j := strings.IndexByte(s[i+1:], '"')
	if j < 0 {
		return "", s, false
	}
	return s[i+1 : i+1+j], s[i+2+j:], true
}

// dash is "" for a logged "-" (nothing sent), else s.
func dash(s string) string {
	if s == "-" {
		return ""
	}
	return s
}

// splitRequest reads "METHOD TARGET PROTO" into rec.
func splitRequest(req string, rec *Record) error {
	sp := strings.IndexByte(req, ' ')
	if sp <= 0 {
		return fmt.Errorf("request %q is not METHOD URI PROTOCOL", clip(req))
	}
	rec.Method = req[:sp]
	target := req[sp+1:]
	if sp := strings.LastIndexByte(target, ' '); sp >= 0 {
		target = target[:sp]
	}
	if !validMethod(rec.Method) || target == "" || (target[0] != '/' && target != "*" && !strings.Contains(target, "://")) {
		return fmt.Errorf("request %q is not METHOD URI PROTOCOL", clip(req))
	}
	rec.URI = target
	return nil
}

func validMethod(m string) bool {
	for i := 0; i < len(m); i++ {
		if c := m[i]; c < 'A' || c > 'Z' {
			return false
		}
	}
	return m != ""
}

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}

var months = map[string]time.Month{"Jan": 1, "Feb": 2, "Mar": 3, "Apr": 4, "May": 5, "Jun": 6, "Jul": 7, "Aug": 8, "Sep": 9, "Oct": 10, "Nov": 11, "Dec": 12}

// parseNginxTime parses $time_local, "10/Oct/2000:13:55:36 -0700".
func parseNginxTime(s string) (int64, error) {
	if len(s) != 26 || s[2] != '/' || s[6] != '/' || s[11] != ':' || s[20] != ' ' {
		return 0, fmt.Errorf("time %q is not like 10/Oct/2000:13:55:36 -0700", clip(s))
	}
	num := func(a, b int) int {
		n := 0
		for i := a; i < b; i++ {
			c := s[i]
			if c < '0' || c > '9' {
				return -1
			}
			n = n*10 + int(c-'0')
		}
		return n
	}
	day, year, hh, mm, ss := num(0, 2), num(7, 11), num(12, 14), num(15, 17), num(18, 20)
	mon, ok := months[s[3:6]]
	zh, zm := num(22, 24), num(24, 26)
	if !ok || day < 1 || year < 0 || hh < 0 || mm < 0 || ss < 0 || zh < 0 || zm < 0 || (s[21] != '+' && s[21] != '-') {
		return 0, fmt.Errorf("time %q is not like 10/Oct/2000:13:55:36 -0700", clip(s))
	}
	off := (zh*60 + zm) * 60
	if s[21] == '-' {
		off = -off
	}
	t := time.Date(year, mon, day, hh, mm, ss, 0, time.UTC)
	return t.UnixMicro() - int64(off)*1e6, nil
}

// timeCache remembers the last time text parsed: a busy log repeats each
// second many times.
type timeCache struct {
	s string
	v int64
}

func (c *timeCache) parse(s string, f func(string) (int64, error)) (int64, error) {
	if s == c.s && s != "" {
		return c.v, nil
	}
	v, err := f(s)
	if err != nil {
		return 0, err
	}
	c.s, c.v = s, v
	return v, nil
}

// --- Envoy ---

// envoyParser reads Envoy's default access log format:
//
//	[%START_TIME%] "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%" %RESPONSE_CODE% %RESPONSE_FLAGS%
//	%BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% "%REQ(X-FORWARDED-FOR)%"
//	"%REQ(USER-AGENT)%" "%REQ(X-REQUEST-ID)%" "%REQ(:AUTHORITY)%" "%UPSTREAM_HOST%"
type envoyParser struct{ tc timeCache }

const envoyIPNote = "Envoy's default format logs no peer address: the client is the last X-Forwarded-For entry, which Envoy appends when use_remote_address is on"

func envoyFormat() *format {
	return &format{name: "envoy", p: &envoyParser{}, fields: recorded{
		ip: true, method: true, uri: true, host: true, ipNote: envoyIPNote,
		headers: map[string]bool{"User-Agent": true, "X-Forwarded-For": true, "X-Request-Id": true},
	}}
}

func (p *envoyParser) parse(line string, rec *Record) error {
	if !strings.HasPrefix(line, "[") {
		return fmt.Errorf("no [START_TIME]")
	}
	rb := strings.IndexByte(line, ']')
	if rb < 0 {
		return fmt.Errorf("no [START_TIME]")
	}
	t, err := p.tc.parse(line[1:rb], parseRFC3339)
	if err != nil {
		return err
	}
	rec.Time = t
	req, rest, ok := quoted(line[rb+1:])
	if !ok {
		return fmt.Errorf("no quoted request")
	}
	if err := splitRequest(req, rec); err != nil {
		return err
	}
	rest = strings.TrimLeft(rest, " ")
	sp := strings.IndexByte(rest, ' ')
	if sp < 0 {
		return fmt.Errorf("no response code")
	}
	rec.Status = statusText(rest[:sp])
	var q [5]string
	for i := range q {
		if q[i], rest, ok = quoted(rest); !ok {
			return fmt.Errorf("want 5 quoted fields after the numbers, found %d", i)
		}
	}
	envoyXFF(dash(q[0]), rec)
	rec.UA, rec.Host = dash(q[1]), dash(q[3])
	if id := dash(q[2]); id != "" {
		rec.Extra = append(rec.Extra[:0], Header{"X-Request-Id", id})
	}
	return nil
}

// envoyXFF sets the peer from X-Forwarded-For's last entry and keeps the
// entries before it as the header a proxy in front would have sent.
func envoyXFF(xff string, rec *Record) {
	if xff == "" {
		return
	}
	if i := strings.LastIndexByte(xff, ','); i >= 0 {
		rec.Addr, rec.XFF = strings.TrimSpace(xff[i+1:]), strings.TrimSpace(xff[:i])
		return
	}
	rec.Addr = strings.TrimSpace(xff)
}

func parseRFC3339(s string) (int64, error) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, fmt.Errorf("time %q is not RFC 3339", clip(s))
	}
	return t.UnixMicro(), nil
}

// jsonLine decodes one JSON object.
func jsonLine(line string) (map[string]any, error) {
	d := json.NewDecoder(strings.NewReader(line))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		return nil, fmt.Errorf("not a JSON object: %v", err)
	}
	return m, nil
}

// envoyJSONParser reads Envoy's default format as JSON, with the keys
// Istio's JSON access log uses (start_time, method, path, authority,
// x_forwarded_for, user_agent, request_id, response_code, and
// downstream_remote_address when logged).
type envoyJSONParser struct{}

func envoyJSONFormat(sample []string) *format {
	f := &format{name: "envoy json", p: envoyJSONParser{}, fields: recorded{
		ip: true, method: true, uri: true, host: true, ipNote: envoyIPNote,
		headers: map[string]bool{"User-Agent": true, "X-Forwarded-For": true, "X-Request-Id": true},
	}}
	for _, l := range sample {
		if m, err := jsonLine(l); err == nil && m["downstream_remote_address"] != nil {
			f.fields.ipNote = ""
			break
		}
	}
	return f
}

func (envoyJSONParser) parse(line string, rec *Record) error {
	m, err := jsonLine(line)
	if err != nil {
		return err
	}
	if rec.Time, err = timeValue(m["start_time"]); err != nil {
		return fmt.Errorf("start_time: %v", err)
	}
	rec.Method, rec.URI, rec.Host = str(m["method"]), str(m["path"]), str(m["authority"])
	if !validMethod(rec.Method) || rec.URI == "" {
		return fmt.Errorf("no method or path")
	}
	rec.Status = status(m["response_code"])
	rec.UA = str(m["user_agent"])
	xff := str(m["x_forwarded_for"])
	if a := str(m["downstream_remote_address"]); a != "" {
		rec.Addr, rec.XFF = a, xff
	} else {
		envoyXFF(xff, rec)
	}
	if id := str(m["request_id"]); id != "" {
		rec.Extra = append(rec.Extra[:0], Header{"X-Request-Id", id})
	}
	return nil
}

// str is v as a string: "" for nil and Envoy's "-".
func str(v any) string {
	switch x := v.(type) {
	case string:
		return dash(x)
	case json.Number:
		return x.String()
	case bool:
		return strconv.FormatBool(x)
	}
	return ""
}

func num(v any) float64 {
	switch x := v.(type) {
	case json.Number:
		f, _ := x.Float64()
		return f
	case string:
		f, _ := strconv.ParseFloat(x, 64)
		return f
	}
	return 0
}

// status is v as a response status: 0 (not logged) unless it is from 0
// to 999.
func status(v any) int {
	f := num(v)
	if f >= 0 && f <= 999 {
		return int(f)
	}
	return 0
}

// statusText is s as a response status, as status reads a JSON value.
func statusText(s string) int {
	if n, err := strconv.Atoi(s); err == nil && n >= 0 && n <= 999 {
		return n
	}
	return 0
}

// timeValue reads a timestamp: RFC 3339, nginx's $time_local, or a number
// of seconds (or ms, µs, ns, told apart by size) since the epoch.
func timeValue(v any) (int64, error) {
	var s string
	switch x := v.(type) {
	case json.Number:
		s = x.String()
	case string:
		s = x
	case nil:
		return 0, fmt.Errorf("missing")
	default:
		return 0, fmt.Errorf("%v is not a time", v)
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, fmt.Errorf("time %q is not a finite number", clip(s))
		}
		us := f / 1e3
		switch {
		case f < 1e11:
			us = f * 1e6
		case f < 1e14:
			us = f * 1e3
		case f < 1e17:
			us = f
		}
		// Out of range, the conversion to int64 would be undefined.
		if us < 0 {
			return 0, fmt.Errorf("time %q is before 1970", clip(s))
		}
		if us > maxTime {
			return 0, fmt.Errorf("time %q is after 9999", clip(s))
		}
		return int64(us), nil
	}
	if t, err := parseRFC3339(s); err == nil {
		return t, nil
	}
	if t, err := parseNginxTime(s); err == nil {
		return t, nil
	}
	return 0, fmt.Errorf("time %q is neither RFC 3339, nginx's time_local nor a number", clip(s))
}

// --- Caddy ---

// caddyParser reads Caddy's JSON access log: ts, and request.{remote_ip,
// remote_port, method, host, uri, headers}.
type caddyParser struct{}

// caddyRedacted are the headers Caddy logs as REDACTED unless
// log_credentials is on.
var caddyRedacted = []string{"Cookie", "Authorization", "Proxy-Authorization"}

func caddyFormat(sample []string) *format {
	f := &format{name: "caddy", p: caddyParser{}, fields: recorded{
		ip: true, method: true, uri: true, host: true, all: true, redacted: map[string]bool{},
	}}
	for _, h := range caddyRedacted {
		f.fields.redacted[h] = true
	}
	// log_credentials shows the values: then they are recorded.
	for _, l := range sample {
		m, err := jsonLine(l)
		if err != nil {
			continue
		}
		req, _ := m["request"].(map[string]any)
		hs, _ := req["headers"].(map[string]any)
		for k, v := range hs {
			if vs, ok := v.([]any); ok && len(vs) > 0 && str(vs[0]) != "REDACTED" {
				delete(f.fields.redacted, http.CanonicalHeaderKey(k))
			}
		}
	}
	return f
}

func (caddyParser) parse(line string, rec *Record) error {
	m, err := jsonLine(line)
	if err != nil {
		return err
	}
	if rec.Time, err = timeValue(m["ts"]); err != nil {
		return fmt.Errorf("ts: %v", err)
	}
	req, ok := m["request"].(map[string]any)
	if !ok {
		return fmt.Errorf("no request object")
	}
	rec.Method, rec.URI, rec.Host = str(req["method"]), str(req["uri"]), str(req["host"])
	if !validMethod(rec.Method) || rec.URI == "" {
		return fmt.Errorf("no request.method or request.uri")
	}
	rec.Status = status(m["status"])
	// ts is when the entry was written, once the response was done; the
	// request was decided when it came, duration (seconds) earlier.
	if d := num(m["duration"]); d > 0 && d < 1e6 {
		rec.Time -= int64(d * 1e6)
	}
	ip, port := str(req["remote_ip"]), str(req["remote_port"])
	rec.Addr = ip
	if ip != "" && port != "" {
		if strings.Contains(ip, ":") {
			rec.Addr = "[" + ip + "]:" + port
		} else {
			rec.Addr = ip + ":" + port
		}
	}
	hs, _ := req["headers"].(map[string]any)
	rec.Extra = rec.Extra[:0]
	// In the order of their names: two spellings of one header (a JSON
	// object may hold "x-key" and "X-Key") are read the same way every
	// time, the last one winning.
	keys := make([]string, 0, len(hs))
	for k := range hs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := hs[k]
		vs, _ := v.([]any)
		if len(vs) == 0 {
			continue
		}
		val := str(vs[0])
		if val == "REDACTED" {
			continue
		}
		setHeader(rec, http.CanonicalHeaderKey(k), val)
	}
	return nil
}

// setHeader puts a header into rec's fields.
func setHeader(rec *Record, name, val string) {
	switch name {
	case "User-Agent":
		rec.UA = val
	case "Referer":
		rec.Referer = val
	case "X-Forwarded-For":
		rec.XFF = val
	default:
		rec.Extra = append(rec.Extra, Header{name, val})
	}
}

// --- JSON lines ---

// jsonlParser reads JSON lines by a field mapping (--field).
type jsonlParser struct {
	time, ip, method, uri, path, query, host, status []string
	headers                                          []jsonlHeader
}

type jsonlHeader struct {
	name string
	path []string
}

// JSONLKeys are the names --field maps, besides header:NAME.
var JSONLKeys = []string{"time", "ip", "method", "uri", "path", "query", "host", "status"}

func jsonlFormat(fields map[string]string) (*format, error) {
	p := &jsonlParser{}
	f := &format{name: "jsonl", p: p, isJSONL: true, fields: recorded{headers: map[string]bool{}}}
	for k, v := range fields {
		path := strings.Split(v, ".")
		if v == "" {
			return nil, fmt.Errorf("--field %s= names no JSON field", k)
		}
		switch {
		case k == "time":
			p.time = path
		case k == "ip":
			p.ip, f.fields.ip = path, true
		case k == "method":
			p.method, f.fields.method = path, true
		case k == "uri":
			p.uri, f.fields.uri = path, true
		case k == "path":
			p.path, f.fields.uri = path, true
		case k == "query":
			p.query = path
		case k == "host":
			p.host, f.fields.host = path, true
		case k == "status":
			p.status = path
		case strings.HasPrefix(strings.ToLower(k), "header:"):
			name := http.CanonicalHeaderKey(k[len("header:"):])
			if name == "" {
				return nil, fmt.Errorf("--field %s=%s: header: needs a name, as in header:X-API-Key=api_key", k, v)
			}
			p.headers = append(p.headers, jsonlHeader{name, path})
			f.fields.headers[name] = true
		default:
			return nil, fmt.Errorf("--field %q: unknown name (want %s or header:NAME)", k, strings.Join(JSONLKeys, ", "))
		}
	}
	if p.time == nil {
		return nil, fmt.Errorf("--format jsonl needs --field time=FIELD (and ip=, method=, uri= or path=, as the log has them)")
	}
	if p.uri != nil && p.path != nil {
		return nil, fmt.Errorf("--field: give uri (path and query) or path (and query), not both")
	}
	// Headers come sorted so that Extra is in a stable order.
	slicesSortHeaders(p.headers)
	return f, nil
}

func slicesSortHeaders(hs []jsonlHeader) {
	for i := 1; i < len(hs); i++ {
		for j := i; j > 0 && hs[j].name < hs[j-1].name; j-- {
			hs[j], hs[j-1] = hs[j-1], hs[j]
		}
	}
}

// lookup follows a dotted path through nested objects.
func lookup(m map[string]any, path []string) any {
	var v any = m
	for _, k := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

func (p *jsonlParser) parse(line string, rec *Record) error {
	m, err := jsonLine(line)
	if err != nil {
		return err
	}
	if rec.Time, err = timeValue(lookup(m, p.time)); err != nil {
		return fmt.Errorf("%s: %v", strings.Join(p.time, "."), err)
	}
	get := func(path []string) string {
		if path == nil {
			return ""
		}
		return str(lookup(m, path))
	}
	rec.Addr, rec.Method, rec.Host = get(p.ip), strings.ToUpper(get(p.method)), get(p.host)
	if rec.Method == "" {
		rec.Method = http.MethodGet
	}
	if p.uri != nil {
		rec.URI = get(p.uri)
	} else {
		rec.URI = get(p.path)
		if q := get(p.query); q != "" {
			rec.URI += "?" + q
		}
	}
	if rec.URI == "" {
		rec.URI = "/"
	}
	if !validMethod(rec.Method) {
		return fmt.Errorf("method %q is not a method", clip(rec.Method))
	}
	if p.status != nil {
		rec.Status = status(lookup(m, p.status))
	}
	rec.Extra = rec.Extra[:0]
	for _, h := range p.headers {
		if v := get(h.path); v != "" {
			setHeader(rec, h.name, v)
		}
	}
	return nil
}
