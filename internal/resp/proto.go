package resp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// ProtocolError is a request stream that does not parse as RESP, or that
// passes one of the Limits. The connection answers it with a RESP error
// and closes.
type ProtocolError struct{ Reason string }

// Error implements error.
func (e *ProtocolError) Error() string { return "Protocol error: " + e.Reason }

func protoErr(format string, a ...any) error {
	return &ProtocolError{Reason: fmt.Sprintf(format, a...)}
}

// maxLine bounds a RESP header line (*n, $n) and an inline command; the
// read buffer is this large.
const maxLine = 64 << 10

// argBuf holds the arguments of the commands of one pipeline: their bytes
// in one arena and their slices in one list, kept by the connection from
// one pipeline to the next so that reading a command allocates nothing
// once they have grown. An argument stays valid until reset; growing the
// arena or the list leaves the slices already handed out where they are.
type argBuf struct {
	arena []byte
	argv  [][]byte
}

// maxKeptArgBytes is the most arena a connection keeps between pipelines;
// a larger one (a pipeline of long arguments) is let go.
const maxKeptArgBytes = 64 << 10

// reset makes the buffer empty for the next pipeline, once nothing uses
// the arguments read into it.
func (a *argBuf) reset() {
	if cap(a.arena) > maxKeptArgBytes {
		a.arena = nil
	}
	a.arena = a.arena[:0]
	clear(a.argv)
	a.argv = a.argv[:0]
}

// bytes returns room for size bytes at the end of the arena.
func (a *argBuf) bytes(size int) []byte {
	n := len(a.arena)
	if cap(a.arena)-n < size {
		a.arena = make([]byte, 0, max(2*cap(a.arena), size, 1<<10))
		n = 0
	}
	a.arena = a.arena[:n+size]
	return a.arena[n : n+size : n+size]
}

// readCommand reads one command, an array of bulk strings or an inline
// line, within the limits, into a. It returns the arguments and the bytes
// read; an empty array or blank line gives no arguments.
func readCommand(r *bufio.Reader, lim *Limits, a *argBuf) (args [][]byte, n int, err error) {
	line, err := readLine(r)
	if err != nil {
		return nil, 0, err
	}
	n = len(line) + 2
	if len(line) == 0 || line[0] != '*' {
		return inline(line, lim, n, a)
	}
	count, ok := parseInt(line[1:])
	if !ok {
		return nil, n, protoErr("invalid multibulk length")
	}
	if count <= 0 {
		return nil, n, nil
	}
	if count > int64(lim.MaxArgs) {
		return nil, n, protoErr("%d arguments in one command; at most %d", count, lim.MaxArgs)
	}
	first := len(a.argv)
	for range count {
		hdr, err := readLine(r)
		if err != nil {
			return nil, n, eofIsProtocol(err)
		}
		n += len(hdr) + 2
		if len(hdr) == 0 || hdr[0] != '$' {
			return nil, n, protoErr("expected '$', got '%s'", printable(hdr, 1))
		}
		size, ok := parseInt(hdr[1:])
		if !ok || size < 0 {
			return nil, n, protoErr("invalid bulk length")
		}
		if size > int64(lim.MaxBulk) {
			return nil, n, protoErr("bulk string of %d bytes; at most %d", size, lim.MaxBulk)
		}
		buf := a.bytes(int(size) + 2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, n, eofIsProtocol(err)
		}
		if buf[size] != '\r' || buf[size+1] != '\n' {
			return nil, n, protoErr("bulk string not followed by CRLF")
		}
		n += len(buf)
		a.argv = append(a.argv, buf[:size:size])
	}
	return a.argv[first:len(a.argv):len(a.argv)], n, nil
}

// inline splits an inline command (as typed into telnet) on spaces.
func inline(line []byte, lim *Limits, n int, a *argBuf) ([][]byte, int, error) {
	fields := bytes.Fields(line)
	if len(fields) > lim.MaxArgs {
		return nil, n, protoErr("%d arguments in one command; at most %d", len(fields), lim.MaxArgs)
	}
	first := len(a.argv)
	for _, f := range fields {
		if len(f) > lim.MaxBulk {
			return nil, n, protoErr("argument of %d bytes; at most %d", len(f), lim.MaxBulk)
		}
		b := a.bytes(len(f))
		copy(b, f)
		a.argv = append(a.argv, b)
	}
	return a.argv[first:len(a.argv):len(a.argv)], n, nil
}

// readLine reads a line ending in CRLF (or LF, for inline commands) and
// returns it without the ending. The slice is valid until the next read.
func readLine(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		return nil, protoErr("line longer than %d bytes", maxLine)
	}
	if err != nil {
		if len(line) > 0 && errors.Is(err, io.EOF) {
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	return line, nil
}

// eofIsProtocol turns an end of stream inside a command into
// io.ErrUnexpectedEOF.
func eofIsProtocol(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// parseInt parses a decimal integer of at most 18 digits, so that it
// never overflows.
func parseInt(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	neg := b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}

// printable returns at most n bytes of b with anything but printable ASCII
// replaced, for an error message.
func printable(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
	}
	out := make([]byte, len(b))
	for i, c := range b {
		if c < ' ' || c > '~' || c == '\'' {
			c = '?'
		}
		out[i] = c
	}
	return string(out)
}

// Reply encoders: each appends one RESP value to b.

func appendSimple(b []byte, s string) []byte {
	b = append(b, '+')
	b = append(b, s...)
	return append(b, '\r', '\n')
}

// appendError appends an error reply; s starts with its code (ERR,
// NOAUTH, WRONGPASS...). Line breaks in s become spaces.
func appendError(b []byte, s string) []byte {
	b = append(b, '-')
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\r' || c == '\n' {
			c = ' '
		}
		b = append(b, c)
	}
	return append(b, '\r', '\n')
}

func appendInt(b []byte, v int64) []byte {
	b = append(b, ':')
	b = strconv.AppendInt(b, v, 10)
	return append(b, '\r', '\n')
}

func appendBulk(b []byte, s string) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, '\r', '\n')
	b = append(b, s...)
	return append(b, '\r', '\n')
}

func appendNull(b []byte, proto int) []byte {
	if proto == 3 {
		return append(b, '_', '\r', '\n')
	}
	return append(b, "$-1\r\n"...)
}

func appendArray(b []byte, n int) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, '\r', '\n')
}

// appendMap appends the header of a map of n pairs: a RESP3 map, or a
// flat array of 2n elements in RESP2.
func appendMap(b []byte, n, proto int) []byte {
	if proto == 3 {
		b = append(b, '%')
		b = strconv.AppendInt(b, int64(n), 10)
		return append(b, '\r', '\n')
	}
	return appendArray(b, 2*n)
}

func appendInts(b []byte, vs ...int64) []byte {
	b = appendArray(b, len(vs))
	for _, v := range vs {
		b = appendInt(b, v)
	}
	return b
}
